import Foundation
import FuseIDs
import GRDB
import NimbusLog
import NimbusCore

/// The client's durable state under the state directory: `state.sqlite` (GRDB, WAL) and the
/// content cache (`cache/`).
///
/// Writes are **write-behind**: the filesystem keeps the live tree in memory and hands every
/// change to `enqueue`, in order; one dedicated writer thread commits whatever is queued in a
/// single transaction. `sync()` waits until everything enqueued before the call is committed
/// with a full fsync — `fsync`/`fsyncdir` on the mount and unmount call it, so what a program
/// fsynced survives `kill -9` and power loss, and what it did not fsync survives `kill -9` up
/// to the last few milliseconds (like a local filesystem).
///
/// **Failures** (a full disk, an I/O error): a batch that cannot be committed stays at the head
/// of the queue and is tried again — at once when someone calls `sync()`, else after a back-off
/// of 10 ms doubling to 1 s — so nothing queued is dropped and order is kept. While it fails,
/// `sync()` answers the failure (`StoreFailure.errno`: ENOSPC for a full disk, else EIO).
/// The first commit that goes through ends the failure by itself. A reserve file
/// (`space-reserve`, `spaceReserve` bytes, preallocated) is deleted when the disk is full, so the
/// commit that follows can still go through — that commit is what deletes the trashed cache
/// files of removed items (`.removeFile`), so `rm` frees space on a full disk. It is made again
/// once twice its size is free.
///
/// **The sync engine's writes** (bases, cursor, pins, its queue entries done: `write`) join the
/// same queue, behind every change enqueued before them: what is on disk is always a prefix of
/// what was written, as after a crash, and nobody waits for the database to write them (a
/// caller that must read what it wrote awaits `queueCommitted()` first).
///
/// Concurrency: `queueLock` (an NSCondition) guards `pending`, `enqueued`, `committed`,
/// `wantsFullSync`, `failure`, the attempt counters, the retry and stop fields and the tasks
/// waiting in `queueCommitted()`. The writer thread takes it only to take the queue and to
/// publish progress; it never holds it across database work. `writeOrder` is held by the writer
/// across a commit and its publication; it also guards `reserveHeld`. Lock order: filesystem
/// lock → writeOrder → queueLock. Callers may hold their own locks while calling `enqueue` or
/// `write`, never while calling `sync()` or `commitQueued()`.
public final class LocalStore: @unchecked Sendable {
    // @unchecked: mutable fields are guarded by queueLock and writeOrder as documented above.
    public let directory: URL
    public let cache: ContentCache
    let pool: DatabasePool
    /// Bytes kept free for metadata commits on a full disk (0: no reserve).
    public let spaceReserve: Int64
    /// The default `spaceReserve`: a few thousand committed changes' worth of WAL frames.
    public static let defaultSpaceReserve: Int64 = 4 << 20

    /// What waits in the queue: a change of the filesystem, or a direct write that could not
    /// run now without overtaking changes that failed (`write`).
    enum Queued {
        case change(StoreChange)
        case direct(@Sendable (Database) throws -> Void)
    }

    let queueLock = RankedCondition(.storeQueue)
    let writeOrder = RankedCondition(.storeWriteOrder)  // used as a plain lock
    private var pending: [Queued] = []
    private var enqueued: UInt64 = 0
    private var committed: UInt64 = 0
    private var wantsFullSync = false
    /// Someone waits in `commitQueued()`: commit without gathering a burst first.
    private var hurry = false
    /// `abandon()` was called: direct writes are refused.
    private var abandoned = false
    private var stopping = false
    private var writerDone = false
    /// Why the last commit attempt failed; nil once one succeeds.
    private var failure: StoreFailure?
    private var attemptsStarted: UInt64 = 0
    private var attemptsFinished: UInt64 = 0
    private var retryDelay = 0.0
    private var retryAt = Date.distantPast
    /// `close(within:)`: stop retrying a failing queue after this.
    private var giveUpAt: Date?
    /// Tasks in `queueCommitted()`: resumed once `committed` reaches their target, a commit
    /// attempt fails, or the writer stops (`publish()`).
    private var waiters: [(target: UInt64, resume: CheckedContinuation<Void, Never>)] = []
    /// Whether `space-reserve` is on disk (guarded by writeOrder; LocalStore+Reserve.swift).
    var reserveHeld = false
    /// A commit was made in NORMAL mode since the last full one (guarded by writeOrder): its
    /// WAL frames may not be on the disk yet.
    private var commitsSinceDurable = false

    /// Why the local state cannot be saved now (nil: it can). Shown as `store-error:` in
    /// `.nimbus/status`.
    public var lastError: String? { queueLock.withLock { failure?.message ?? downloadSpace } }
    /// Why a download found no room on this disk (LocalStore+Reserve.swift); nil once one fits.
    var downloadSpace: String?
    /// Bytes of downloads under way that `roomForDownload` counted (guarded by queueLock).
    var downloadsUnderWay: Int64 = 0

    /// Opens (creating when needed) the state in `directory` and runs pending migrations.
    public init(directory: URL, rootOwner: (uid: UInt32, gid: UInt32) = (getuid(), getgid()),
                spaceReserve: Int64 = LocalStore.defaultSpaceReserve, writer: Writer = .thread) throws {
        self.directory = directory
        self.writer = writer
        self.spaceReserve = max(0, spaceReserve)
        try StateFiles.directory(directory.path)
        // `running` exists from open to a close that saved everything: found at open, the last
        // run was killed or had to give up changes.
        let running = directory.appendingPathComponent("running").path
        startedUnclean = access(running, F_OK) == 0
        let fd = open(running, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
        if fd >= 0 { _ = Foundation.close(fd) }
        let dbPath = directory.appendingPathComponent("state.sqlite").path
        // Names, user xattrs and content of every item are in here: 0600 whatever the umask,
        // made before SQLite opens it (SQLite gives its -wal and -shm files the database's mode).
        StateFiles.file(dbPath)
        for suffix in ["-wal", "-shm"] { StateFiles.restrict(dbPath + suffix) }
        var config = Configuration()
        config.foreignKeysEnabled = true
        // A store reopened right after another instance closed (remount, tests) can meet the
        // closing connection's final WAL checkpoint: wait for it instead of failing with
        // "database is locked".
        config.busyMode = .timeout(10)
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            // SQLite's default page cache is 2 MiB; a first sync of 100,000 items writes ~100 MB
            // of rows at random keys (ids are random UUIDs), and with the default cache each
            // insert read its B-tree pages back from the OS. Grows only as pages are used.
            try db.execute(sql: "PRAGMA cache_size = -65536")
        }
        pool = try DatabasePool(path: dbPath, configuration: config)
        try Schema.migrator.migrate(pool)
        cache = try ContentCache(directory: directory.appendingPathComponent("cache"))
        try pool.write { db in
            if try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item WHERE id = ?", arguments: [ItemID.root.description]) == 0 {
                let now = WallClock.nowNanoseconds()
                let root = ItemRecord(id: .root, node: .root, parent: nil, name: "", kind: .folder,
                                      mode: UInt32(S_IFDIR) | 0o755, uid: rootOwner.uid, gid: rootOwner.gid, time: now)
                try Self.apply(.upsert(root), db)
            }
        }
        // An existing reserve is kept (topped up if short); a missing one is made when there is room.
        if access(reservePath, F_OK) == 0 { makeReserve() } else { remakeReserveIfRoom() }
        // The thread holds the store until `close()` (or `abandon()`) ends it: a store dropped
        // without closing is kept alive (and its queue still committed) rather than freed under
        // the running writer (it was `unowned`: a test that forgot `close()` crashed the run).
        guard writer == .thread else { return }
        let t = Thread { [self] in self.writerLoop() }
        t.name = "nimbus-store-writer"
        t.start()
    }

    /// The last run of this state directory did not end with everything saved (killed, or a
    /// close that had to give up changes on a full disk): a file may hold bytes whose change was
    /// never recorded, so the sync engine checks every file (`SyncEngine.attach`).
    public let startedUnclean: Bool

    /// Who commits the queue.
    public enum Writer: Sendable {
        /// A thread of the store's own, in bursts (a mount).
        case thread
        /// Whoever calls: `sync()`, `commitQueued()` and `close()` commit inline, and
        /// `writePending()` commits what is queued when the caller decides — the deterministic
        /// simulation (Tests/EngineSimTests) decides when the queue reaches the disk, so a
        /// simulated crash drops exactly what the seed says.
        case caller
    }
    public let writer: Writer

    /// With `Writer.caller`: while on, every write fails as on a full disk (SQLITE_FULL) — the
    /// deterministic simulation's store fault. What is queued stays queued, as on a real disk.
    public func simulateFullDisk(_ on: Bool) {
        precondition(writer == .caller, "simulateFullDisk is for a store whose caller writes")
        queueLock.withLock { simulatedFull = on }
    }
    private var simulatedFull = false

    private func simulatedFault() throws {
        if queueLock.withLock({ simulatedFull }) {
            throw DatabaseError(resultCode: .SQLITE_FULL, message: "simulated: database or disk is full")
        }
    }

    /// With `Writer.caller`: one commit attempt of what is queued (nothing when it is empty).
    public func writePending() {
        precondition(writer == .caller, "writePending() is for a store whose caller writes")
        attemptInline(full: false)
    }

    /// One attempt of the writer loop, on the caller's thread (`Writer.caller`).
    private func attemptInline(full wantsFull: Bool) {
        let taken: ([Queued], Bool)? = queueLock.withLock {
            if abandoned || writerDone { return nil }
            let full = wantsFullSync || wantsFull
            if pending.isEmpty && !full { return nil }
            wantsFullSync = false
            hurry = false
            attemptsStarted += 1
            return (pending, full)
        }
        guard let (batch, full) = taken else { return }
        commitAndPublish(batch, full: full)
    }

    /// Everything persisted, for building the in-memory tree at mount time.
    public func load() throws -> StoreSnapshot {
        try pool.read { db in
            var items: [ItemRecord] = []
            let rows = try Row.fetchCursor(db, sql: "SELECT id, node, parent, name, kind, mode, uid, gid, size, atime, mtime, ctime, btime, target, version, dirty, rdev FROM item")
            while let r = try rows.next() {
                guard let id = ItemID(r[0] as String), let kind = ItemKind(rawValue: r[4]) else { continue }
                var rec = ItemRecord(id: id, node: NodeID(rawValue: UInt64(r[1] as Int64)), parent: (r[2] as String?).flatMap(ItemID.init),
                                     name: r[3], kind: kind, mode: UInt32(r[5] as Int64), uid: UInt32(r[6] as Int64),
                                     gid: UInt32(r[7] as Int64), size: r[8], time: r[9], target: r[13])
                rec.mtime = r[10]; rec.ctime = r[11]; rec.btime = r[12]; rec.version = r[14]; rec.dirty = r[15]
                rec.rdev = UInt64(bitPattern: r[16] as Int64)
                items.append(rec)
            }
            var xattrs: [ItemID: [String: [UInt8]]] = [:]
            let xs = try Row.fetchCursor(db, sql: "SELECT item, name, value FROM xattr")
            while let r = try xs.next() {
                guard let id = ItemID(r[0] as String) else { continue }
                xattrs[id, default: [:]][r[1]] = [UInt8](r[2] as Data)
            }
            return StoreSnapshot(items: items, xattrs: xattrs)
        }
    }

    /// Queues a change; returns at once. Order is preserved.
    public func enqueue(_ change: StoreChange) {
        queueLock.lock()
        if writerDone { return queueLock.unlock() }  // closed or abandoned: nobody would commit it
        pending.append(.change(change))
        enqueued += 1
        if pending.count == 1 { queueLock.signal() }
        queueLock.unlock()
    }

    /// Waits until every change enqueued before this call is committed and fsynced: nil. While
    /// the store fails, waits for one commit attempt made after the call (started at once) and
    /// returns its failure; the changes stay queued and are retried.
    @discardableResult
    /// Has the writer start a full commit of everything queued, without waiting for it: a
    /// caller with other disk work to do (an `fsync` of a file's data) overlaps the two, then
    /// waits in `sync()`, which finds the commit under way or done.
    public func startSync() {
        guard writer != .caller else { return }
        queueLock.withLock {
            wantsFullSync = true
            queueLock.broadcast()
        }
    }

    public func sync() -> StoreFailure? {
        if writer == .caller {
            let target = queueLock.withLock { enqueued }
            attemptInline(full: true)
            return queueLock.withLock {
                committed >= target ? nil : failure ?? StoreFailure(message: "the local state is closed", noSpace: false)
            }
        }
        let failed: StoreFailure? = queueLock.withLock {
            let target = enqueued
            let started = attemptsStarted
            wantsFullSync = true
            queueLock.broadcast()
            while committed < target && !writerDone {
                if attemptsFinished > started, let failure { return failure }
                queueLock.wait()
            }
            if committed >= target { return nil }
            return failure ?? StoreFailure(message: "the local state is closed", noSpace: false)
        }
        return failed ?? makeDurable()
    }

    /// A full commit of nothing but a mark when something was committed in NORMAL mode since
    /// the last full one (the writer may have taken the queue before `sync()` asked for FULL).
    private func makeDurable() -> StoreFailure? {
        writeOrder.lock()
        defer { writeOrder.unlock() }
        guard commitsSinceDurable, !queueLock.withLock({ abandoned }) else { return nil }
        return commit([], full: true)
    }

    /// Waits until every change enqueued before this call is committed (not fsynced), on the
    /// caller's thread; while the store fails it returns at once. For threads that may block
    /// (tests, the daemon's start); a task awaits `queueCommitted()` instead.
    public func commitQueued() {
        if writer == .caller {
            if !queueLock.withLock({ failure != nil }) { attemptInline(full: false) }
            return
        }
        queueLock.lock()
        defer { queueLock.unlock() }
        let target = enqueued
        guard committed < target, failure == nil else { return }
        hurry = true
        queueLock.broadcast()
        while committed < target && !writerDone && failure == nil { queueLock.wait() }
    }

    /// `commitQueued()` for a task: suspends (no thread waits) until every change enqueued
    /// before the call is committed, a commit attempt fails, or the store is closed. For a
    /// reader of what it wrote through the queue (the sync engine reads its queue entries).
    public func queueCommitted() async {
        if writer == .caller { return commitQueued() }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            queueLock.lock()
            defer { queueLock.unlock() }
            let target = enqueued
            guard committed < target, failure == nil, !writerDone else { return c.resume() }
            hurry = true
            waiters.append((target, c))
            queueLock.broadcast()
        }
    }

    /// Wakes the threads waiting on `queueLock` and resumes the tasks whose wait is over (with
    /// `queueLock` held; after every change of `committed`, `failure` or `writerDone`).
    private func publish() {
        queueLock.broadcast()
        guard !waiters.isEmpty else { return }
        let over = failure != nil || writerDone
        waiters.removeAll { w in
            guard over || committed >= w.target else { return false }
            w.resume.resume()
            return true
        }
    }

    /// Number of changes not yet committed (shown in `.nimbus/status`).
    public var backlog: UInt64 { queueLock.lock(); defer { queueLock.unlock() }; return enqueued - committed }

    /// Commits what is queued and stops the writer thread. A failing queue is retried for up to
    /// `limit` seconds (someone may free space meanwhile); what could not be committed then is
    /// dropped from memory and returned as the failure (nil: everything is saved). What is on
    /// disk is a prefix of what was written, so the next start goes on from there.
    @discardableResult
    public func close(within limit: Double = 5) -> StoreFailure? {
        let first = sync()
        queueLock.lock()
        defer { queueLock.unlock() }
        if writer == .caller {
            // Nobody retries later: what the attempt of sync() could not commit is given up now.
            writerDone = true
            stopping = true
        }
        if first != nil { giveUpAt = Date(timeIntervalSinceNow: limit) }
        stopping = true
        publish()
        while !writerDone { queueLock.wait() }
        let lost = enqueued - committed
        guard lost > 0 else {
            unlink(directory.appendingPathComponent("running").path)
            return nil
        }
        let why = failure ?? first ?? StoreFailure(message: "the local state is closed", noSpace: false)
        return StoreFailure(message: "\(lost) change(s) to the local state could not be saved: \(why.message)", noSpace: why.noSpace)
    }

    /// Closes the database connections of a store that is not used again, after `close()` or
    /// `abandon()` (tests that open thousands of stores in one process, where a connection
    /// left open keeps its file descriptors). Only when every reader is done: with `Writer.caller`.
    public func closeDatabase() {
        precondition(writer == .caller, "closeDatabase() is for a store whose caller writes")
        try? pool.close()
    }

    /// What a `kill -9` leaves on disk, for tests that simulate a crash in process
    /// (Tests/EngineSimTests): the writer thread stops, dropping the changes queued and not yet
    /// committed (a batch being committed finishes or not, as one transaction), and nothing the
    /// process does afterwards reaches the database: later `enqueue`s are dropped, `sync()`
    /// returns at once, direct writes (bases, meta, pins) throw. (Closing the pool instead
    /// crashed in SQLite: other threads were still reading.)
    public func abandon() {
        queueLock.lock()
        pending.removeAll()
        stopping = true
        abandoned = true
        if writer == .caller { writerDone = true }
        publish()
        while !writerDone { queueLock.wait() }
        queueLock.unlock()
    }

    /// A write of the sync engine's tables: it joins the queue behind every change enqueued
    /// before it and commits in order with them (a failure there is retried like theirs).
    /// Refused once the store was abandoned or closed.
    func write(_ body: @escaping @Sendable (Database) throws -> Void) throws {
        try queueLock.withLock { () throws in
            if abandoned { throw StoreAbandoned() }
            if writerDone { throw failure ?? StoreFailure(message: "the local state is closed", noSpace: false) }
            pending.append(.direct(body))
            enqueued += 1
            if pending.count == 1 { queueLock.signal() }
        }
    }

    /// A read-only look at the database (tests, status, the sync engine later).
    public func read<T>(_ body: (Database) throws -> T) throws -> T { try pool.read(body) }

    private func writerLoop() {
        while let (batch, full) = nextBatch() { commitAndPublish(batch, full: full) }
    }

    /// Commits `batch` (taken from the head of the queue) and publishes the outcome.
    private func commitAndPublish(_ batch: [Queued], full: Bool) {
        do {
            writeOrder.lock()
            let outcome = commit(batch, full: full)
            if outcome == nil {
                // Before publishing: a sync() that returns has the space of removed files back.
                for case .change(.removeFile(let path)) in batch { unlink(path) }
                remakeReserveIfRoom()
            }
            queueLock.lock()
            attemptsFinished += 1
            if let outcome {
                if failure == nil { report(outcome) }
                failure = outcome
                retryDelay = min(max(retryDelay * 2, 0.01), 1)
                retryAt = Date(timeIntervalSinceNow: retryDelay)
            } else {
                // abandon() emptied the queue meanwhile: nothing of it is ours to remove.
                if !abandoned { pending.removeFirst(batch.count) }
                committed += UInt64(batch.count)
                if failure != nil {
                    LogLine.write("nimbus store", "local state saved again", level: .notice)
                }
                failure = nil
                retryDelay = 0
            }
            publish()
            queueLock.unlock()
            writeOrder.unlock()
        }
    }

    /// Waits until there is something to commit (or a retry is due) and takes it from the head
    /// of the queue, which it stays at until committed. Nil: the writer stops.
    private func nextBatch() -> ([Queued], Bool)? {
        queueLock.lock()
        defer { queueLock.unlock() }
        while true {
            if abandoned || (stopping && pending.isEmpty) { break }
            if stopping, failure != nil, Date() >= (giveUpAt ?? .distantPast) {
                LogLine.write("nimbus store", "\(pending.count) change(s) to the local state could not be saved: \(failure!.message)", level: .error)
                pending.removeAll()
                break
            }
            let due = failure == nil || wantsFullSync || Date() >= retryAt
            if (!pending.isEmpty || wantsFullSync) && due {
                // Let a burst (untar, cp -r) gather into one transaction: wait up to 5 ms unless
                // someone is waiting in sync() (broadcast wakes us at once).
                if failure == nil && !pending.isEmpty && !wantsFullSync && !hurry && !stopping {
                    _ = queueLock.wait(until: Date(timeIntervalSinceNow: 0.005))
                }
                hurry = false
                let full = wantsFullSync
                wantsFullSync = false
                attemptsStarted += 1
                return (pending, full)
            }
            if failure != nil && !pending.isEmpty {
                _ = queueLock.wait(until: min(retryAt, giveUpAt ?? .distantFuture))
            } else {
                queueLock.wait()
            }
        }
        writerDone = true
        publish()
        return nil
    }

    /// One commit attempt of `batch` (with writeOrder held). On a full disk the reserve goes
    /// and the batch is tried once more at once.
    private func commit(_ batch: [Queued], full: Bool) -> StoreFailure? {
        let moot = Self.mootWrites(batch)
        /// `isolated`: each of the engine's writes in a savepoint of its own, and one the
        /// database refuses as it is (a broken invariant, never the disk) dropped, loudly, so it
        /// cannot refuse every retry and hold back the whole queue. Only after a plain attempt
        /// was refused that way: a savepoint per write costs the common case.
        func attempt(isolated: Bool) throws {
            try simulatedFault()
            // A full commit fsyncs the WAL, and with it every commit made before in NORMAL mode.
            // With nothing queued, a one-row mark gives it something to commit.
            let mark = full && batch.isEmpty && commitsSinceDurable
            guard !batch.isEmpty || mark else { return }
            try pool.writeWithoutTransaction { db in
                if full { try db.cachedStatement(sql: "PRAGMA synchronous = FULL").execute() }
                defer { if full { try? db.cachedStatement(sql: "PRAGMA synchronous = NORMAL").execute() } }
                try db.inTransaction(.immediate) {
                    for (i, q) in batch.enumerated() where !moot[i] {
                        switch q {
                        case .change(let change): try Self.apply(change, db)
                        case .direct(let body) where isolated:
                            do {
                                try db.inSavepoint { try body(db); return .commit }
                            } catch let e where !StoreFailure(e, directory: directory.path).retryable {
                                LogLine.write("nimbus store", "a write of the sync state was refused and dropped: \(e)", level: .error)
                            }
                        case .direct(let body): try body(db)
                        }
                    }
                    if mark {
                        try db.cachedStatement(sql: "INSERT INTO meta (key, value) VALUES ('store.durable', '1') ON CONFLICT(key) DO UPDATE SET value = CAST(value AS INTEGER) + 1").execute()
                    }
                    return .commit
                }
            }
            commitsSinceDurable = !full
        }
        func attempt() throws {
            do { try attempt(isolated: false) } catch {
                guard !StoreFailure(error, directory: directory.path).retryable else { throw error }
                try attempt(isolated: true)
            }
        }
        do { try attempt(); return nil } catch {
            let f = StoreFailure(error, directory: directory.path)
            guard f.noSpace, releaseReserve() else { return f }
            do { try attempt(); return nil } catch { return StoreFailure(error, directory: directory.path) }
        }
    }

    /// Logs the start of a failure (once; retries are not logged).
    private func report(_ f: StoreFailure) {
        LogLine.write("nimbus store", "local state write failed: \(f.message); kept queued and retried", level: .warning)
    }

    /// Which writes of `batch` the rest of the same transaction makes moot:
    /// - an upsert followed by another of the same item: an upsert writes the whole row, so only
    ///   the last of a run is seen at commit (an untar's create, writes and three setattrs of a
    ///   file are one row write). A run ends at a delete of the item (its cascade must meet the
    ///   rows written before it) and at an engine write (it may read rows). Foreign keys are
    ///   deferred, so the order of the rest holds.
    /// - an upload-queue entry that repeats one earlier in it (same item, same kind: a new file's
    ///   first write and its close are both `content`): the queue is read for which items to
    ///   push, in the order of their first entry, and which had their content changed; the
    ///   earlier entry says all of that and commits with it. A run ends at an engine write (it
    ///   may remove the item's entries: `removeSyncOps`).
    static func mootWrites(_ batch: [Queued]) -> [Bool] {
        var moot = [Bool](repeating: false, count: batch.count)
        var writtenLater = Set<ItemID>()
        for i in batch.indices.reversed() {
            switch batch[i] {
            case .change(.upsert(let r)): if !writtenLater.insert(r.id).inserted { moot[i] = true }
            case .change(.delete(let id)): writtenLater.remove(id)
            case .direct: writtenLater.removeAll(keepingCapacity: true)
            case .change: break
            }
        }
        var queued = Set<QueueEntry>()
        for i in batch.indices {
            switch batch[i] {
            case .change(.syncOp(let id, let kind)): if !queued.insert(QueueEntry(item: id, kind: kind)).inserted { moot[i] = true }
            case .direct: queued.removeAll(keepingCapacity: true)
            case .change: break
            }
        }
        return moot
    }

    private struct QueueEntry: Hashable {
        var item: ItemID
        var kind: SyncOpKind
    }

    static func apply(_ change: StoreChange, _ db: Database) throws {
        switch change {
        case .upsert(let r):
            let s = try db.cachedStatement(sql: Schema.upsertItem)
            try s.execute(arguments: [
                r.id.description, Int64(r.node.rawValue), r.parent?.description, r.name, r.kind.rawValue, Int64(r.mode),
                Int64(r.uid), Int64(r.gid), r.size, r.atime, r.mtime, r.ctime, r.btime, r.target, r.version, r.dirty, Int64(bitPattern: r.rdev),
            ])
        case .delete(let id):
            try db.cachedStatement(sql: "DELETE FROM item WHERE id = ?").execute(arguments: [id.description])
        case .setXattr(let id, let name, let value):
            try db.cachedStatement(sql: "INSERT INTO xattr (item, name, value) VALUES (?, ?, ?) ON CONFLICT(item, name) DO UPDATE SET value = excluded.value")
                .execute(arguments: [id.description, name, Data(value)])
        case .removeXattr(let id, let name):
            try db.cachedStatement(sql: "DELETE FROM xattr WHERE item = ? AND name = ?").execute(arguments: [id.description, name])
        case .syncOp(let id, let kind):
            try db.cachedStatement(sql: "INSERT INTO sync_op (item, kind) VALUES (?, ?)").execute(arguments: [id.description, kind.rawValue])
        case .removeFile:
            break  // after the commit (writerLoop)
        }
    }
}

/// Wall-clock time in nanoseconds since the epoch (CLOCK_REALTIME, what `stat` shows).
public enum WallClock {
    public static func nowNanoseconds() -> Int64 {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
    }
}

/// A write to a store that was abandoned (a simulated crash): nothing reaches the disk any more.
public struct StoreAbandoned: Error, CustomStringConvertible {
    public var description: String { "the local state was abandoned (simulated crash)" }
}

/// The state directory holds every item's name, xattrs and bytes: folders 0700, files 0600,
/// whatever the umask (another local user reads nothing of it).
public enum StateFiles {
    /// Creates `path` (and its parents) if missing and makes it 0700.
    public static func directory(_ path: String) throws {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        restrict(path, mode: 0o700)
    }

    /// Creates `path` as an empty 0600 file if missing, and makes it 0600 if it exists.
    public static func file(_ path: String) {
        let fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        if fd >= 0 { close(fd) }
        restrict(path)
    }

    /// Makes an existing file `mode` (0600 by default); a missing file is left alone.
    public static func restrict(_ path: String, mode: mode_t = 0o600) {
        _ = chmod(path, mode)
    }
}

/// An `NSCondition` (also used as a plain lock) with a place in `LockRank`'s order (checked in
/// debug builds; a `wait` keeps the rank: the thread takes the lock back before it goes on).
final class RankedCondition: NSLocking, @unchecked Sendable {
    // @unchecked: the condition is the synchronization.
    let rank: LockRank
    private let c = NSCondition()
    init(_ rank: LockRank) { self.rank = rank }
    func lock() {
        rank.entering()
        c.lock()
    }
    func unlock() {
        c.unlock()
        rank.leaving()
    }
    func wait() { c.wait() }
    @discardableResult func wait(until limit: Date) -> Bool { c.wait(until: limit) }
    func signal() { c.signal() }
    func broadcast() { c.broadcast() }
}
