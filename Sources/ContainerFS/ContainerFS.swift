import Coordination
import Dispatch
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Synchronization

/// The filesystem of one container, over LocalStore. It is testable without mounting: every
/// operation is a plain method that returns a value or throws an `Errno`; `FuseAdapter` maps
/// kernel requests onto it.
///
/// Concurrency: operations run concurrently on libfuse's worker threads. One lock (`lock`)
/// guards `t` (the tree's nodes, open files and listings); it is held only for in-memory work and
/// `LocalStore.enqueue`. File I/O (pread/pwrite/ftruncate/fsync) happens outside it on the
/// handle's own file descriptor, and nothing is replied while it is held.
/// Lock order: `lock` → LocalStore queue lock; `ids`, `control` and `versions` have mutexes of
/// their own, taken under `lock` or none, never around it.
public final class ContainerFS: @unchecked Sendable {
    // @unchecked: `t` is guarded by `lock`; the rest is immutable after init.
    public struct Options: Sendable {
        /// How long the kernel may cache the tree's names and attributes. Changes made through the
        /// mount keep the kernel's view right by themselves; remote changes invalidate explicitly.
        public var entryTimeout = 1.0
        public var attrTimeout = 1.0
        /// Negative lookups ("no such name") in the tree are cached this long.
        public var negativeTimeout = 1.0
        /// The same for `.nimbus/` and `.nimbus/versions/`, whose contents change with no
        /// invalidation (the events file grows, versions arrive): kept short.
        public var controlTimeout = 1.0
        /// How long an ask to presenters may take (docs/presenters.md).
        public var presenterTimeout: Duration = .seconds(2)
        /// Times and new item ids (MountClock.swift).
        public var clock = MountClock.system
        /// How the observer's notices are delivered: nil, on the calling thread right after the
        /// change (what a mount does). A deterministic simulation hands them to its executor as
        /// later jobs, so the window between a change and its notice, which concurrent FUSE
        /// threads and engine tasks have, is open there too.
        public var deliverNotice: (@Sendable (_ notice: @escaping @Sendable () -> Void) -> Void)?
        /// Tests only: the move of removed files' cache files to the trash (`retire`) is handed
        /// here instead of running right after the tree's lock is released.
        public var holdRetiredFiles: (@Sendable (_ move: @escaping @Sendable () -> Void) -> Void)?
        /// Which programs may download content by reading placeholders (DownloadPolicy.swift);
        /// nil: every program may.
        public var downloadPolicy: DownloadPolicy?
        public init() {}
    }

    // Node and handle ids resolve through `ids` (IDTable.swift) to what they name; the FUSE
    // adapter calls the owner: the item operations here, `control` or `versions`.

    public static let controlName = ItemName.controlFolder

    public let store: LocalStore
    public let options: Options
    let content: any ContentProvider
    /// Content may be missing from cache files (a sync engine provides it): reads check first.
    let lazyContent: Bool
    let observer: (any ChangeObserver)?
    let syncStatus: (any SyncStatusSource)?
    let syncControl: (any SyncControl)?
    let lock = FSLock()
    let t = Tables()
    /// Removed items' cache files whose move to the trash is owed (`retire`).
    let retiring = RankedMutex<RetiringFiles>(.cacheRetire, RetiringFiles())
    /// What every node and handle id names.
    let ids = IDTable()
    /// Bumped whenever a `.nimbusignore` is made, written, renamed, removed or shown, or a folder
    /// moves (`MountedTree.rulesGeneration`).
    let rulesGen = Atomic<UInt64>(0)
    /// Set once a file of the tree has several names (ContainerFS+Links.swift): until then a
    /// change is never fanned out to other names.
    let linkedFiles = Atomic<Bool>(false)
    let mountTime: Int64
    let owner: (uid: UInt32, gid: UInt32)
    /// Program locks (fcntl, flock) and the sync engine's claims (ContainerFS+Locks.swift).
    public let coordinator: Coordinator
    /// `.nimbus/events` (EventLog.swift).
    public let events: EventLog
    /// Presenters over the local socket (PresenterHub.swift, docs/presenters.md).
    public let presenters: PresenterHub
    /// `.nimbus/versions/` (VersionsFS.swift) and the files of `.nimbus/` (ContainerFS+Control.swift);
    /// set once at the end of init.
    private(set) var versions: VersionsFS!
    private(set) var trash: TrashFS!
    private(set) var control: ControlFS!
    /// What `.nimbus/` shows of the mount (its owner, its time, the kernel's timeouts).
    var presentation: Presentation {
        Presentation(uid: owner.uid, gid: owner.gid, mountTime: mountTime, attrTimeout: options.controlTimeout, entryTimeout: options.controlTimeout)
    }
    /// The kernel's caches, told what remote states and evictions change (`setKernel`; none
    /// when the filesystem is driven without a mount).
    let kernel = Mutex<(any KernelCache)?>(nil)
    /// Kernel cache notifications go out here, in order, with no lock held and never on a FUSE or
    /// Swift task thread: `inval_inode` waits for the file's page locks, and a `cat` of a
    /// placeholder holds its page locked until the deferred reply, which needs a download task
    /// (sent from the cooperative pool, one blocked invalidation plus a second waiting for the
    /// session lock would leave no thread for the download).
    let kernelQueue = DispatchQueue(label: "nimbus.kernel-notify")

    public init(store: LocalStore, options: Options = Options(), content: any ContentProvider = LocalContent(),
                observer: (any ChangeObserver)? = nil, syncStatus: (any SyncStatusSource)? = nil,
                control: (any SyncControl)? = nil, versions: (any VersionSource)? = nil, services: MountServices? = nil) throws {
        self.store = store
        self.options = options
        self.mountTime = options.clock.wall()
        self.content = content
        self.lazyContent = !(content is LocalContent)
        self.observer = observer
        self.syncStatus = syncStatus
        self.syncControl = control
        self.owner = (getuid(), getgid())
        let services = try services ?? MountServices.open(store: store, presenterTimeout: options.presenterTimeout)
        coordinator = services.coordinator
        events = services.events
        presenters = services.presenters
        try loadTree()
        self.versions = VersionsFS(ids: ids, presentation: presentation, clock: options.clock, tree: self, source: versions)
        self.trash = TrashFS(ids: ids, presentation: presentation, clock: options.clock, source: versions)
        self.control = ControlFS(ids: ids, presentation: presentation, events: events, source: self)
    }

    /// Where kernel cache notifications go (the FUSE session, once mounted).
    public func setKernel(_ k: any KernelCache) { kernel.withLock { $0 = k } }

    /// Sends `actions` on `kernelQueue`, in order.
    func sendKernel(_ actions: [KernelAction]) {
        guard !actions.isEmpty, let k = kernel.withLock({ $0 }) else { return }
        kernelQueue.async { for a in actions { a.send(to: k) } }
    }

    /// Returns once the notifications sent so far are out (before the session goes; after it
    /// they are harmless: the session answers ENOTCONN once unmounted).
    public func drainKernel() { kernelQueue.sync {} }

    /// The services this filesystem shares with its sync engine.
    public var services: MountServices { MountServices(coordinator: coordinator, events: events, presenters: presenters) }


    /// Builds the in-memory tree from the database and reconciles file sizes with the cache
    /// (after `kill -9` the cache file is the truth for bytes written but not yet recorded).
    private func loadTree() throws {
        let snap = try store.load()
        var live = Set<ItemID>()
        let trashed = store.cache.trashedFiles()
        for var rec in snap.items {
            if rec.kind == .file {
                var size = store.cache.size(of: rec.id)
                if size == nil, let t = trashed[rec.id], store.cache.restore(t, as: rec.id) { size = store.cache.size(of: rec.id) }
                // No file: a placeholder whose content was never needed (created on first use).
                if let size, size != rec.size { rec.size = size; store.enqueue(.upsert(rec)) }
            }
            live.insert(rec.id)
            t.byID[rec.id] = rec.node
            if let first = t.nodes[rec.node], rec.kind != .folder, first.rec.kind == rec.kind {
                // Another name of a hard-linked file (its folder is found below).
                first.links.append(LinkName(id: rec.id, parent: rec.parent ?? .root, parentNode: .root, name: rec.name))
                linkedFiles.store(true, ordering: .relaxed)
                continue
            }
            let n = Node(rec)
            n.xattrs = snap.xattrs[rec.id] ?? [:]
            t.nodes[rec.node] = n
            ids.reserve(rec.node)
        }
        var byID: [ItemID: Node] = [:]
        for n in t.nodes.values { byID[n.rec.id] = n }
        for n in t.nodes.values {
            for i in n.links.indices {
                guard let p = byID[n.links[i].parent], p.isDir else { continue }
                p.children[n.links[i].name] = n.node
                n.links[i].parentNode = p.node
            }
            guard let pid = n.rec.parent else { continue }
            guard let p = byID[pid], p.isDir else { continue }
            p.children[n.rec.name] = n.node
            n.parentNode = p.node
            if n.isDir { p.subdirs += 1 }
        }
        store.cache.sweep(keeping: live)
    }

    // MARK: helpers (call with `lock` held)

    func node(_ id: NodeID) throws(Errno) -> Node {
        guard let n = t.nodes[id] else { throw .ENOENT }
        return n
    }

    func folder(_ id: NodeID) throws(Errno) -> Node {
        let n = try node(id)
        guard n.isDir else { throw .ENOTDIR }
        guard n.linked else { throw .ENOENT }
        return n
    }

    func attr(_ n: Node) -> stat {
        var st = stat()
        st.node = n.node
        st.st_mode = n.rec.mode
        st.st_rdev = __dev_t(truncatingIfNeeded: n.rec.rdev)
        st.st_nlink = n.isDir ? UInt(2 + n.subdirs) : UInt(n.nameCount)
        st.st_uid = n.rec.uid
        st.st_gid = n.rec.gid
        st.st_size = n.isDir ? 4096 : Int(n.rec.size)
        st.st_blocks = st.st_size / 512 + (st.st_size % 512 == 0 ? 0 : 1)  // (no + 511: a size can be Int.max)
        st.st_blksize = 128 * 1024
        st.st_atim = Self.ts(n.rec.atime)
        st.st_mtim = Self.ts(n.rec.mtime)
        st.st_ctim = Self.ts(n.rec.ctime)
        return st
    }

    func entry(_ n: Node) -> FuseEntry {
        FuseEntry(node: n.node, attr: attr(n), attrTimeout: options.attrTimeout, entryTimeout: options.entryTimeout)
    }

    /// An entry reply for `n`: counts the kernel's new reference.
    func lookedUp(_ n: Node) -> FuseEntry {
        n.lookups += 1
        return entry(n)
    }

    static func ts(_ ns: Int64) -> timespec {
        let (s, n) = ItemLimits.split(ns)
        return timespec(tv_sec: Int(s), tv_nsec: Int(n))
    }
    /// A time from the kernel (any user's `utimensat`), clamped into what items carry: never traps.
    static func ns(_ ts: timespec) -> Int64 { ItemLimits.time(seconds: Int64(ts.tv_sec), nanoseconds: Int64(ts.tv_nsec)) }

    /// Queues `n`'s record for the database. An unlinked node (removed, or replaced under its
    /// readers) is never written: its row is gone or belongs to the live node of the same item,
    /// and writing it would bring a deleted file back at the next start (as an `fallocate`
    /// or `fchmod` through a handle still open would).
    func persist(_ n: Node) {
        n.metaDirty = false
        guard n.linked else { return }
        if ItemName.same(n.rec.name, Self.ignoreFileName) { rulesChanged() }
        store.enqueue(.upsert(n.rec))
        for l in n.links {
            if ItemName.same(l.name, Self.ignoreFileName) { rulesChanged() }
            store.enqueue(.upsert(n.record(l.id)))
        }
    }

    /// Tells the sync engine, and writes the event line for creates, content and attribute
    /// changes (moves and deletes are written where the old path is still known).
    func notify(_ c: LocalChange) {
        let all = forEveryName(c)
        for c in all { queue(c) }
        guard let deliver = options.deliverNotice else { return all.forEach(tell) }
        deliver { [self] in all.forEach(tell) }
    }

    /// The change's upload-queue entry, behind the change in the store's queue (a sync engine
    /// observes this tree: a local-only mount queues nothing).
    func queue(_ c: LocalChange) {
        guard observer != nil, !Mutation.queueEntryAtNotice.isOn else { return }
        let q = c.queued
        store.enqueue(.syncOp(q.item, kind: q.kind))
    }

    func tell(_ c: LocalChange) {
        switch c {
        case .created(let id): events.append(.created, origin: .local, path: path(of: id))
        case .contentChanged(let id): events.append(.changed, origin: .local, path: path(of: id), coalesce: [.created, .changed])
        case .attributesChanged(let id): events.append(.attributes, origin: .local, path: path(of: id))
        case .moved, .deleted, .writing: break
        }
        observer?.localChange(c)
    }

    /// `notify` for a change of `n`'s content made under the lock, which counted it in
    /// `n.noticesPending` there: a pull that runs between the lock's release and the engine
    /// queueing the item must not reset the content (it would find the item neither queued nor
    /// being written). The count goes once the engine has the notice.
    func notify(_ c: LocalChange, pending n: Node) {
        let all = forEveryName(c)
        for c in all { queue(c) }
        let node = UncheckedNode(n)
        guard let deliver = options.deliverNotice else {
            all.forEach(tell)
            return lock.withLock { n.noticesPending -= 1 }
        }
        deliver { [self] in
            all.forEach(tell)
            lock.withLock { node.n.noticesPending -= 1 }
        }
    }

    /// A node carried to a later notice; it is touched there under `lock` only.
    struct UncheckedNode: @unchecked Sendable { let n: Node; init(_ n: Node) { self.n = n } }

    /// The path of node `n` (lock held).
    func pathLocked(_ n: Node) -> String {
        "/" + components(n).joined(separator: "/")
    }

    /// The path of item `id`, one of the names of node `n` (lock held).
    func pathLocked(_ n: Node, _ id: ItemID) -> String {
        "/" + components(n, id).joined(separator: "/")
    }

    /// Saves the next event sequence number (at unmount).
    public func saveEventSequence() {
        try? store.setMeta("events.seq", "\(events.nextSequence)")
    }

    /// Validates a new name: UTF-8 (checked by FuseKit), ≤ 255 bytes, not reserved.
    static func check(name: String, in parent: NodeID) throws(Errno) {
        if let problem = ItemName.validate(name) {
            if case .tooLong = problem { throw .ENAMETOOLONG }
            throw .EINVAL
        }
        if parent == .root && ItemName.same(name, controlName) { throw .EEXIST }
    }

    /// Frees an unlinked node once the kernel forgot it and no handle is open.
    func reapIfUnused(_ n: Node) {
        guard !n.linked, n.lookups == 0, n.openHandles == 0 else { return }
        t.nodes[n.node] = nil
        t.ignoreFiles[n.node] = nil
        if t.byID[n.rec.id] == n.node { t.byID[n.rec.id] = nil }
        // A node replaced under its readers shares its id with the live one: leave its cache file.
        // The cache file goes once the deletion is committed: a crash before that brings the
        // item back from the database with its bytes, not empty (EngineSimTests).
        if n.rec.kind == .file && t.byID[n.rec.id] == nil { retire(n.rec.id) }
    }

    /// The cache file of removed item `id` goes to the trash (lock held), from where the store
    /// removes it once the deletion is committed (`StoreChange.removeFile`). The move is a rename
    /// on disk, tens of microseconds every request would wait for under the lock (an `rm -r`
    /// forgets each file it removed), so it runs right after the lock's release
    /// (`FSLock.afterUnlock`). Until then the file stays at its place, which is what a crash
    /// before the deletion's commit needs (the item comes back with its bytes); an item shown
    /// again under the same id finishes the move first (`reclaimRetired`).
    func retire(_ id: ItemID) {
        let first = retiring.withLock { r in r.waiting.insert(id).inserted && r.waiting.count == 1 }
        guard first else { return }  // a move owed already takes every waiting file
        if let hold = options.holdRetiredFiles {
            hold { [self] in moveRetiredFiles() }
        } else {
            lock.afterUnlock { [self] in moveRetiredFiles() }
        }
    }

    /// Moves every waiting retired cache file to the trash (no lock held).
    func moveRetiredFiles() {
        while let id = retiring.withLock({ r -> ItemID? in
            guard let id = r.waiting.popFirst() else { return nil }
            r.moving.insert(id)
            return id
        }) {
            moveRetired(id)
        }
    }

    private func moveRetired(_ id: ItemID) {
        let trashed = store.cache.trash(id)
        retiring.withLock { _ = $0.moving.remove(id) }
        if let trashed { store.enqueue(.removeFile(trashed)) }
    }

    /// Item `id` gets a node again (lock held): a move of its old cache file that is owed is done
    /// first (here, or by the thread already at it), so the new node's file is never the one moved.
    func reclaimRetired(_ id: ItemID) {
        if Mutation.newNodeTakesRetiredFile.isOn { return }
        while true {
            let mine: Bool? = retiring.withLock { r in
                if r.waiting.remove(id) != nil { r.moving.insert(id); return true }
                return r.moving.contains(id) ? false : nil
            }
            switch mine {
            case nil: return
            case true?: return moveRetired(id)
            case false?: sched_yield()  // another thread is renaming it: microseconds
            }
        }
    }

    // MARK: lookup, forget, getattr, readlink, statfs

    /// The root's `.nimbus` is the control folder (never listed in the root).
    public func lookup(parent: NodeID, name: String) throws(Errno) -> FuseEntry {
        if name.utf8.count > ItemName.maxBytes { throw .ENAMETOOLONG }
        if parent == .root && ItemName.same(name, Self.controlName) { return control.entry(.folder) }
        return try lock.withLock { () throws(Errno) -> FuseEntry in
            let p = try folder(parent)
            // ENOENT becomes a cached negative entry in FuseAdapter (negativeTimeout).
            guard let id = p.children[name], let n = t.nodes[id] else { throw .ENOENT }
            return lookedUp(n)
        }
    }

    public func forget(node: NodeID, count: UInt64) {
        guard node != .root else { return }
        lock.withLock {
            guard let n = t.nodes[node] else { return }
            n.lookups -= min(count, n.lookups)
            reapIfUnused(n)
        }
    }

    public func getattr(node: NodeID) throws(Errno) -> stat {
        return try lock.withLock { () throws(Errno) -> stat in attr(try self.node(node)) }
    }

    public func readlink(node: NodeID) throws(Errno) -> [UInt8] {
        try lock.withLock { () throws(Errno) -> [UInt8] in
            let n = try self.node(node)
            guard let target = n.rec.target else { throw .EINVAL }
            return Array(target.utf8)
        }
    }

    /// Space of the disk that holds the cache (the container has no quota of its own yet).
    /// A local statvfs: never blocks on the network.
    public func statfs() -> statvfs {
        var s = statvfs()
        if statvfs(store.cache.directory.path, &s) != 0 { s = statvfs() }
        s.f_namemax = UInt(ItemName.maxBytes)
        let count = lock.withLock { t.nodes.count }
        s.f_files = UInt(max(Int(s.f_files), count + Int(s.f_ffree)))
        return s
    }
}
