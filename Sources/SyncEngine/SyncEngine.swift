import Chunking
import Foundation
import FuseIDs
import LocalStore
import MountPorts
import NimbusCore
import NimbusLog
import NimbusProtocol
import NimbusRemote
import SyncCore
import Synchronization

/// Keeps one mounted container in sync with one server container (docs/sync.md).
///
/// - Pull: the first sync lists the container and shows every item as a placeholder (size,
///   mtime and mode right, no bytes); then one long-poll loop applies the journal (the tree
///   sends the kernel invalidations each change needs).
/// - Hydration (`ContentProvider`): a read of missing bytes downloads the chunks covering it into
///   the sparse cache file and answers the read afterwards; readers of one chunk share a download.
/// - Push (`ChangeObserver`): local changes queue the item (durably, in `sync_op`); one loop
///   commits each queued item's whole state with the base version it was edited from.
///
/// Threads: `localChange`, `isPresent` and `hydrate` are called on libfuse threads and only take
/// `state` briefly and start tasks; the network work runs in the engine's tasks, and every
/// decision about items (showing server states, a push's step, a commit's answer, the tick) in a
/// turn of `loop`, one at a time (EngineLoop.swift).
/// Lock order (NimbusCore `LockRank`, checked in debug builds): ContainerFS.lock → LocalStore's
/// locks → `state` → `contentGate`; `state` is a leaf but for the gate (nothing else is
/// called while it is held), so it can be taken under ContainerFS.lock or without it.
public final class SyncEngine: Sendable {
    public struct Options: Sendable {
        /// Longest wait of one chunk download before the read fails with EIO.
        public var hydrationSeconds: Int64 = 5
        /// Seconds the server may hold a changes request open.
        public var longPoll = 25
        /// Bytes of file content kept here; nil = no limit. Clean, closed, unpinned content is
        /// evicted least recently used first (SyncEngine+Cache.swift).
        public var cacheLimit: Int64?
        /// A file kept open and written without fsync is uploaded once it has had no write for
        /// this long (a snapshot no write can tear); 0 = only at close/fsync.
        public var quietPeriod: Duration = .seconds(10)
        /// Chunk downloads at once (reads first, then pins and downloads asked for, then prefetch).
        public var parallelDownloads = 8
        /// Files at least this big have their content chunked and uploaded apart from the queue,
        /// so they never hold back the other items' uploads (the pull runs beside the push anyway).
        public var contentApartBytes: Int64 = 64 << 20
        /// Added to every log line (several engines in one process: EngineSimTests).
        public var logLabel = ""
        /// Where log lines go (nil: stderr). The deterministic simulation keeps them with its run.
        public var logSink: (@Sendable (String) -> Void)?
        /// The clock of the engine's back-offs, tick loop and offline window (EngineClock.swift).
        public var clock = EngineClock.real
        /// Where `start()` runs the engine's tasks (nil: the global pool). The deterministic
        /// simulation runs every device's engine on one serial executor of its own.
        public var executor: (any TaskExecutor)?
        public init() {}
    }

    let store: LocalStore
    let client: any RemoteAPI
    /// Same server, short deadline: a read never waits longer than `hydrationTimeout`.
    let fetchClient: any RemoteAPI
    let container: String
    let options: Options
    let chunker = Chunker.standard
    let state: RankedMutex<State>
    /// Orders base writes to disk (`persistBases`, `persistPresence`): each reads memory and
    /// queues its write in the store under it, so the last write on disk carries the newest state.
    let baseDiskLock = RankedMutex<Void>(.baseDisk, ())
    /// Orders the writes of `sync.relist` (`markRelist`, `clearRelistMark`): the decision is read
    /// from `state` and written to disk under this, never under `state`, which libfuse threads
    /// take on the read path. Lock order: this, then `state`.
    let relistDiskLock = RankedMutex<Void>(.relistDisk, ())
    /// Per item, how many times a program truncated its file in place while downloads of it
    /// were asked for or under way (`willTruncate`; lock order: `state`, then this). Held
    /// by a download while it checks this and writes a part into the cache file, so no bytes of
    /// a download land after a program's truncation (they would sit past its new end, or under
    /// what it writes next).
    let contentGate = RankedMutex<[ItemID: UInt64]>(.contentGate, [:])
    let wake: AsyncStream<Void>.Continuation
    let wakes: AsyncStream<Void>
    /// Wakes the tick loop (SyncEngine+Cache.swift): every second, and after each download.
    let cacheWake: AsyncStream<Void>.Continuation
    let cacheWakes: AsyncStream<Void>
    /// Wakes the pull's supervisor when sync is paused or resumed (`setPaused`).
    let pauseWake: AsyncStream<Void>.Continuation
    let pauseWakes: AsyncStream<Void>
    /// Downloads and other short jobs, all children of the engine's task tree (EngineJobs.swift).
    let jobs = EngineJobs()
    /// Where every decision about items is made, one turn at a time (EngineLoop.swift).
    let loop = EngineLoop()

    /// What the puller owns (SyncEngine+Pull.swift): where the journal was read to, and what
    /// was seen of the server's states that are not shown here.
    struct PullState {
        var cursor: Int64 = 0
        /// The lowest version among remote items skipped here (not shown yet). A folder delete
        /// must not claim to have seen them: its `seenCursor` stays below this.
        var minSkipped: Int64?
        /// The first listing is done (the cursor may legitimately be 0 for an empty container).
        var listed = false
        /// Deletes shown here since the start, by item: their bases are gone, and a live state
        /// no newer than one is old news (`ApplyFacts.deleteShown`).
        var deletesShown: [ItemID: Int64] = [:]
        /// The pull lists the container before its next page (the last run left remote states
        /// not shown, or a folder delete took items the server had moved out), and the mark on
        /// disk that says so (SyncCore `RelistMark`).
        var relist = RelistMark(due: false)
    }

    /// What the pusher owns (SyncEngine+Push.swift).
    struct PushState {
        /// Items waiting to be pushed, in order, without repeats, and the one being pushed.
        var queue = UploadQueue<ItemID>()
        /// Content uploaded apart from the queue (big files): the chunks of the file at a write
        /// generation, for its commit when it comes up again.
        var contentUp: [ItemID: (generation: UInt64?, chunks: [ChunkRef])] = [:]
        /// The upload under way: bytes of new chunks sent of those to send.
        var upload: (item: ItemID, sent: Int64, total: Int64)?
        var bytesSent: Int64 = 0
        /// Items waiting for the push of the item at their name (`CommitPlan.nameFirst`): since
        /// when. Forgotten when their push ends.
        var nameWaits: [ItemID: ContinuousClock.Instant] = [:]
    }

    /// What the downloader owns (SyncEngine+Hydrate.swift; SyncCore `FetchQueue`): the chunks
    /// asked for and their readers, at most `parallelDownloads` fetched at once.
    struct DownloadState {
        var fetches = FetchQueue<ChunkKey, ChunkFetch, @Sendable (Errno?) -> Void>()
        var bytesFetched: Int64 = 0
        /// Chunks of small files that came inside a changes page (`ChangesResponse.inline`):
        /// a download takes its bytes from here instead of the server. Bounded: the oldest go.
        var inline = InlineChunks()
    }

    /// What the cache keeper owns (SyncEngine+Cache.swift).
    struct CacheState {
        /// Explicit pins (folders pin what is below them).
        var pinned = Pins()
        /// The logical clock of `CacheUse.lastUse`.
        var useClock: UInt64 = 0
        var used: Int64 = 0
        var evicted: Int = 0
        /// Files whose download found no room on the state disk: what came of them is evicted
        /// once they are closed (the tick loop), so a read that cannot fit leaves no partial cache.
        var dropAfterNoRoom: Set<ItemID> = []
    }

    /// The engine's memory, behind `state`. Each component owns its part (`pull`, `push`,
    /// `downloads`, `cache`) and writes no other component's; `items` is the one shared table,
    /// where each writes through SyncCore's events of its own kind.
    struct State {
        /// The mounted tree and what it shares with the engine (`attach`).
        var fs: any MountedTree = DetachedTree()
        var services: MountServices?
        /// One record per item shown here or with work under way (SyncCore `SyncItem`): its base,
        /// its cache file's use, its local changes on their way up and the server states held
        /// back here (for a lock, a writer, a taken name or a missing folder).
        var items = ItemTable()
        var pull = PullState()
        var push = PushState()
        var downloads = DownloadState()
        var cache = CacheState()
        /// The connection to the server, the engine's last error, a refused token (SyncCore
        /// `Connection`).
        var link = Connection()
        /// The task running the engine's task tree (`start`, `run`).
        var running: Task<Void, Never>?
        /// `nimbus pause`: no network until `nimbus resume` (persisted in meta `sync.paused`).
        var paused = false
        /// What the container's Recently Deleted holds, for `.nimbus/status`.
        var trashFigures = TrashFigures()

        /// The base of an item: the server state shown here (nil: not committed yet).
        func base(_ id: ItemID) -> Base? { items[id]?.base }
        mutating func setBase(_ id: ItemID, _ base: Base?) {
            if let base { items[id, default: SyncItem()].base = base } else { items[id]?.base = nil }
        }

        /// The item's upload record takes `event` (nothing without a record); `.queue` puts it in
        /// the upload queue (an item queued already keeps its place). True when it asked for
        /// that: wake the push loop.
        mutating func uploadEvent(_ id: ItemID, _ event: UploadState<ContinuousClock.Instant>.Event, at now: ContinuousClock.Instant,
                                  rules: UploadPacing<ContinuousClock.Instant>.Rules) -> Bool {
            var queued = false
            for action in items[id]?.upload.on(event, at: now, rules: rules) ?? [] {
                switch action {
                case .queue:
                    push.queue.append(id)
                    queued = true
                case .retryIn, .queueFirst, .waitForToken, .putBack, .keepPlace:
                    break
                }
            }
            return queued
        }

        /// Written since its last close or fsync (the upload waits for the writer).
        func isWriting(_ id: ItemID) -> Bool { items[id]?.upload.writing == true }
        /// Whether any queued upload failed and waits for its retry.
        var anyFailure: Bool { !items.failed.isEmpty }
        func refused(_ id: ItemID) -> Bool { items[id]?.upload.refused == true }
        /// What the item's status, error and progress are read from.
        func statusFacts(_ item: ItemID) -> StatusFacts {
            let base = self.base(item).map { b in
                StatusFacts.Base(version: b.version, conflicts: b.record.conflicts, complete: b.present == nil,
                                 anyPresent: b.present?.contains(true) ?? true)
            }
            return StatusFacts(base: base, isRoot: item.isRoot, queued: push.queue.hasWork(item),
                               downloading: base?.complete == false && downloads.fetches.contains(where: { $0.item == item }),
                               unauthorized: link.tokenRefused != nil)
        }
        /// Remote states not shown here yet for a taken name, a missing folder or local work,
        /// oldest first (tried again after pushes and pulls).
        func skippedRemote() -> [ServerItem] {
            items.skippedStates
        }
    }

    /// The pacing rules of uploads of files that keep changing (SyncCore `UploadPacing`).
    var pacingRules: UploadPacing<ContinuousClock.Instant>.Rules { UploadPacing.Rules(quietPeriod: options.quietPeriod) }

    struct ChunkFetch {
        var key: ChunkKey
        var offset: Int64
        /// `contentGate`'s count for the item when the chunk was asked for.
        var truncations: UInt64
    }

    struct ChunkKey: Hashable {
        var item: ItemID
        var index: Int
        var hash: ContentHash
    }

    /// An engine talking to a Nimbus server over HTTP: reads of content use a copy of `client`
    /// whose deadline is the read timeout.
    public convenience init(store: LocalStore, client: NimbusClient, container: String, options: Options = Options()) throws {
        var fetch = client
        fetch.timeout = .seconds(options.hydrationSeconds)
        try self.init(store: store, remote: client, fetch: fetch, container: container, options: options)
    }

    /// `remote` for everything but content downloads, `fetch` for those (its own deadline).
    public init(store: LocalStore, remote: any RemoteAPI, fetch: any RemoteAPI, container: String, options: Options = Options()) throws {
        self.store = store
        self.client = remote
        self.fetchClient = fetch
        self.container = container
        self.options = options
        (wakes, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        (cacheWakes, cacheWake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        (pauseWakes, pauseWake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        var s = State()
        for (id, b) in try store.syncBases() {
            s.setBase(id, Base(record: try BaseCoding.decode(b.record), present: BaseCoding.bools(b.present)))
        }
        if let c = try store.meta("sync.cursor").flatMap({ Int64($0) }) {
            s.pull.cursor = c
            s.pull.listed = true
        }
        s.pull.relist = RelistMark(due: try store.meta("sync.relist") == "1")
        s.cache.pinned = Pins(try store.pins())
        s.paused = try store.meta("sync.paused") == "1"
        s.link.pause(s.paused)
        state = RankedMutex(.engineState, s)
        try bind()
    }

    /// One state directory syncs one container of one server: refuse to mix them.
    private func bind() throws {
        let want = "\(client.baseURL) \(container)"
        if let have = try store.meta("sync.binding") {
            if have != want {
                throw SyncError("the state directory syncs \(have), not \(want); use another --state directory")
            }
        } else {
            try store.setMeta("sync.binding", want)
        }
    }

    /// Connects the mounted tree and the services it shares with the engine, and re-queues
    /// what was not pushed before the last stop.
    public func attach(_ fs: any MountedTree, services: MountServices) throws {
        _ = store.sync()
        var ids: [ItemID] = []
        for op in try recoverQueue() where !ids.contains(op) { ids.append(op) }
        for id in try store.unsyncedItems() where !ids.contains(id) { ids.append(id) }
        if store.startedUnclean {
            for id in try recheckAfterUncleanStop(size: { fs.localState($0)?.size }) where !ids.contains(id) { ids.append(id) }
        }
        state.withLock { s in
            s.fs = fs
            s.services = services
            for id in ids { s.push.queue.append(id) }
        }
        services.coordinator.setReleaseHandler { [weak self] id in self?.locksReleased(id) }
    }

    /// The items of the queue on disk, in order. A content change queued before the stop makes
    /// its file whole here, even if the notice's own note of that never reached the disk.
    func recoverQueue() throws -> [ItemID] {
        let ops = try store.syncOps()
        let now = options.clock.now, rules = pacingRules
        let whole: [ItemID: Base] = state.withLock { s in
            var out: [ItemID: Base] = [:]
            // A commit of it may have gone before the stop, its answer never recorded.
            for id in Set(ops.map(\.item)) { s.items[id, default: SyncItem()].upload.on(.queuedAtStart, at: now, rules: rules) }
            for op in ops where op.kind == .content && !Mutation.forgetWholeAfterCrash.isOn {
                if let b = s.base(op.item)?.wholeAfterLocalContent() { s.setBase(op.item, b); out[op.item] = b }
            }
            return out
        }
        try persistBases(whole.mapValues { Optional($0) })
        return ops.map(\.item)
    }

    /// After an unclean stop, bytes may have reached a file whose change was never recorded (a
    /// kill -9, or a full disk, before the change's note was saved): every whole file shown here
    /// is pushed once; an unchanged one has nothing to send. A placeholder whose size here is
    /// not its version's was written here (a program writes a placeholder only after downloading
    /// it whole, or after truncating it): its bytes are the program's, so it is whole and pushed
    /// too — shown as a placeholder of the other size, its reads would mix its version's bytes
    /// with zeros for good. Each is queued on disk too, so a stop before its push (the next start
    /// is a clean one) does not forget it.
    func recheckAfterUncleanStop(size: (ItemID) -> Int64?) throws -> [ItemID] {
        let files: [(ItemID, Base)] = state.withLock { s in
            s.items.bases.compactMap { id, b in b.record.kind == .file && !b.record.deleted ? (id, b) : nil }
        }
        var whole: [ItemID] = [], written: [ItemID: Base] = [:]
        for (id, b) in files {
            switch size(id).map(b.afterUncleanStop) {
            case nil, .leave?: break
            case .push?: whole.append(id)
            case .pushWhole(let w)?: (written[id], whole) = (w, whole + [id])
            }
        }
        whole.sort()
        if !written.isEmpty {
            state.withLock { s in for (id, b) in written { s.setBase(id, b) } }
            try persistBases(written.mapValues { Optional($0) })
        }
        if !Mutation.recheckInMemoryOnly.isOn {
            for id in whole { store.enqueue(.syncOp(id, kind: .content)) }
        }
        return whole
    }

    /// The mounted tree (`attach`; before it, a tree with nothing in it).
    var tree: any MountedTree { state.withLock { $0.fs } }
    /// The services shared with the mounted tree (set by `attach`).
    var services: MountServices? { state.withLock { $0.services } }

    /// Runs the engine — the pull (while not paused), the push loop, the tick loop and the jobs
    /// (downloads, server calls of the mount) — as one task tree, until the task running it is
    /// cancelled. Nothing the engine starts lives outside it.
    public func run() async {
        wake.yield()
        fetchPinned()
        await withDiscardingTaskGroup { group in
            group.addTask { await self.pushLoop() }
            group.addTask { await self.tickLoop() }
            group.addTask { await self.jobs.run() }
            group.addTask { await self.pullSupervisor() }
        }
    }

    /// Runs the engine in a task of its own; `stop()` ends it.
    public func start() {
        let t = Task(executorPreference: options.executor) { await self.run() }
        state.withLock { $0.running = t }
    }

    /// Runs the pull loop while sync is not paused: pausing cancels it at once (the long poll
    /// ends), resuming starts it again.
    func pullSupervisor() async {
        var changes = pauseWakes.makeAsyncIterator()
        while !Task.isCancelled {
            if isPaused {
                guard await changes.next() != nil else { return }
                continue
            }
            let ended = Flag()
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    await self.pullLoop()
                    ended.set()
                    self.pauseWake.yield()
                }
                while !isPaused, !ended.isSet {
                    guard await changes.next() != nil else { break }  // cancelled: the pull is too
                }
                group.cancelAll()
            }
            // The pull ended by itself while not paused (it only does when cancelled): start it
            // again, not at once.
            if ended.isSet, !isPaused, !Task.isCancelled { await options.clock.sleep(for: .seconds(1)) }
        }
    }

    public var isPaused: Bool { state.withLock { $0.paused } }

    /// Cancels the loops and downloads and waits for them (bounded by their own deadlines).
    public func stop() async {
        let running = state.withLock { s in defer { s.running = nil }; return s.running }
        running?.cancel()
        wake.finish()
        cacheWake.finish()
        pauseWake.finish()
        jobs.finish()
        await running?.value
    }

    /// Lines for `.nimbus/status` (SyncStatusSource).
    public func statusLines() -> [(String, String)] {
        trashFiguresRead()
        return state.withLock { s in
            var lines = [("connection", s.link.state.description), ("server", client.baseURL), ("container", container),
                         ("cursor", "\(s.pull.cursor)"), ("upload-queue", "\(s.push.queue.workCount)"),
                         ("download-queue", "\(s.downloads.fetches.count)"), ("downloads-active", "\(s.downloads.fetches.active)"),
                         ("placeholders", "\(s.items.placeholders)"), ("local-only", "\(s.items.localOnly)"),
                         ("conflicts", "\(s.items.conflicted)")]
            if let u = s.push.upload { lines.append(("uploading", "\(u.item) \(u.sent)/\(u.total)")) }
            lines += [("bytes-downloaded", "\(s.downloads.bytesFetched)"), ("bytes-uploaded", "\(s.push.bytesSent)"),
                      ("cache-used", "\(s.cache.used)"), ("cache-limit", options.cacheLimit.map { "\($0)" } ?? "none"),
                      ("cache-evicted", "\(s.cache.evicted)"), ("pinned", "\(s.cache.pinned.count)"),
                      ("read-timeout", "\(options.hydrationSeconds) s")]
            // Items the server refused for the account's quota (shown only while some wait).
            lines += s.items.quotaLine.map { [("quota", $0)] } ?? []
            lines += Self.trashLines(s.trashFigures)
            lines.append(("sync-error", s.link.lastError ?? "none"))
            return lines
        }
    }

    func setConnection(_ c: ConnectionState, error: String? = nil) {
        let resumed = state.withLock { s -> Bool in
            s.link.enter(c, error: error, paused: s.paused, anyItemFailure: s.anyFailure)
        }
        if resumed { wake.yield() }
    }

    /// `NIMBUS_SYNC_TRACE=1`: one line per decision about an item (pull, push, commit answer),
    /// for finding out why a device ended where it did (docs/sync.md "Simulation").
    static let tracing = ProcessInfo.processInfo.environment["NIMBUS_SYNC_TRACE"] == "1"

    func trace(_ s: @autoclosure () -> String) {
        if Self.tracing { log("trace: " + s()) }
    }

    func log(_ s: String) {
        if let sink = options.logSink { return sink(s) }
        LogLine.write(options.logLabel.isEmpty ? "nimbus sync" : "nimbus sync " + options.logLabel, s)
    }

    /// Saves `b` as the item's base, in memory and on disk.
    func saveBase(_ id: ItemID, _ b: Base?) throws {
        try saveBases([id: b])
    }

    /// Writes which chunks of an item are present as memory has it now (after a download). Only
    /// the presence column: re-encoding the whole record for every chunk of a 1 GiB file cost
    /// more than the download (quadratic in its chunks). Serialized with every other base write,
    /// so the last write carries the newest presence when two chunks of one file finish at once.
    func persistPresence(_ id: ItemID) throws {
        try baseDiskLock.withLock { _ in
            guard let b = state.withLock({ $0.base(id) }) else { return }
            try store.saveSyncPresence(id, version: b.version, present: BaseCoding.bytes(b.present))
        }
    }

    /// Saves many bases (nil: removed), in memory and in one transaction on disk.
    func saveBases(_ bases: [ItemID: Base?]) throws {
        state.withLock { s in for (id, b) in bases { s.setBase(id, b) } }
        try persistBases(bases)
    }

    /// Writes bases already set in memory (nil: removed) in one transaction.
    ///
    /// Where memory still holds the same version, what memory holds now is written: its presence
    /// may have changed since the caller took its copy. A write into a placeholder (O_TRUNC)
    /// marks the base complete in memory and on disk; a pull that has just shown the placeholder
    /// must not write its older copy over that, or after a crash the restarted push finds the
    /// file unchanged ("nothing to send") and the write never leaves (EngineSimTests). All
    /// base writes hold `baseDiskLock` from reading memory to queueing the write (the store's
    /// queue commits in order), so the last one on disk is the newest. A different version in
    /// memory is not written ahead of its own writer, which queues it behind the tree change it
    /// stands for (`apply`, `settle`).
    func persistBases(_ bases: [ItemID: Base?]) throws {
        guard !bases.isEmpty else { return }
        try baseDiskLock.withLock { _ in
            let write: [(ItemID, Base?)] = state.withLock { s in bases.map { id, b in (id, Base.toWrite(passed: b, memory: s.base(id))) } }
            var rows: [SyncBase] = []
            var gone: [ItemID] = []
            rows.reserveCapacity(bases.count)
            for (id, written) in write {
                if let b = written {
                    rows.append(SyncBase(id: id, version: b.version, record: BaseCoding.encode(b.record), present: BaseCoding.bytes(b.present)))
                } else {
                    gone.append(id)
                }
            }
            try store.saveSyncBases(rows, removing: gone)
        }
    }
}

extension SyncEngine: SyncStatusSource {
    public func itemStatus(_ item: ItemID) -> ItemStatus {
        state.withLock { s in (s.items[item] ?? SyncItem()).status(s.statusFacts(item)) }
    }

    public func itemAttribute(_ name: NimbusXattr, item: ItemID, ancestors: [ItemID]) -> String? {
        state.withLock { s in
            switch name {
            case .version: return s.base(item).map { "\($0.version)" } ?? "none"
            case .conflicts: return "\(s.base(item)?.record.conflicts ?? 0)"
            case .pinned: return s.cache.pinned.covers(item, ancestors: ancestors) ? "1" : "0"
            case .error:
                return (s.items[item] ?? SyncItem()).errorText(s.statusFacts(item))
            case .progress:
                return ProgressText.of(uploading: s.push.upload.flatMap { $0.item == item ? ($0.sent, $0.total) : nil }, base: s.base(item))
            case .status, .itemid, .evict, .download, .paused, .versions, .resolve, .restore, .discard, .ignored: return nil
            }
        }
    }
}

/// Files that never leave the device: SQLite's rollback journal, write-ahead log and shared-memory
/// index next to a database (`NAME-journal`, `NAME-wal`, `NAME-shm`). They only mean something
/// together with the locks of the programs that hold the database open here; another device
/// receiving a "hot" journal would roll its own copy of the database back. The database file
/// itself syncs at the points where it is whole (after a commit, when no program holds it
/// exclusively).
public enum DeviceLocalNames {
    public static let suffixes = ["-journal", "-wal", "-shm"]
    public static func matches(_ name: String) -> Bool {
        suffixes.contains { name.hasSuffix($0) && name.count > $0.count }
    }
}

public struct SyncError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

/// A flag set once, read from any task.
final class Flag: Sendable {
    private let value = Mutex(false)
    func set() { value.withLock { $0 = true } }
    var isSet: Bool { value.withLock { $0 } }
}

/// The tree of an engine not attached yet: nothing in it, nothing shown, nothing to evict.
final class DetachedTree: MountedTree {
    func localState(_ id: ItemID) -> LocalItem? { nil }
    func placeGeneration(_ id: ItemID) -> UInt64? { nil }
    func writeState(_ id: ItemID) -> WriteState? { nil }
    func snapshot(_ id: ItemID) -> TreeSnapshot { TreeSnapshot(local: nil, write: nil, pendingSafeSave: false) }
    func descendants(of id: ItemID) -> [ItemID] { [] }
    func ancestors(of id: ItemID) -> [ItemID] { [] }
    func path(of id: ItemID) -> String { "/\(id)" }
    func show(_ states: [RemoteState], applied: (ItemID) -> Void) -> [ItemID] { states.map(\.id) }
    func openCacheFile(_ item: ItemID) -> Int32 { -ENOENT }
    func evictContent(_ item: ItemID, decide: () -> Bool) throws(Errno) { throw .ENOENT }
    func isPendingSafeSave(_ item: ItemID) -> Bool { false }
    func isBeingWritten(_ item: ItemID) -> Bool { false }
    func ignoreVerdict(_ item: ItemID) -> IgnoreVerdict? { IgnoreVerdict.none }
    func ignoreVerdict(path: [String], isFolder: Bool) -> IgnoreVerdict? { IgnoreVerdict.none }
    var rulesGeneration: UInt64 { 0 }
}
