import Foundation
import GRDB
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
/// Concurrency: `queueLock` (an NSCondition) guards `pending`, `enqueued`, `committed`,
/// `wantsFullSync` and `lastError`. The writer thread takes it only to swap the queue out and
/// to publish progress; it never holds it across database work. Callers may hold their own
/// locks while calling `enqueue` (lock order: filesystem lock → queueLock), never while
/// calling `sync()`.
public final class LocalStore: @unchecked Sendable {
    // @unchecked: mutable fields are guarded by queueLock as documented above.
    public let directory: URL
    public let cache: ContentCache
    let pool: DatabasePool

    private let queueLock = NSCondition()
    private var pending: [StoreChange] = []
    private var enqueued: UInt64 = 0
    private var committed: UInt64 = 0
    private var wantsFullSync = false
    /// Someone waits in `commitQueued()`: commit without gathering a burst first.
    private var hurry = false
    /// `abandon()` was called: direct writes are refused.
    private var abandoned = false
    private var stopping = false
    private var writerDone = false
    public private(set) var lastError: String?

    /// Opens (creating when needed) the state in `directory` and runs pending migrations.
    public init(directory: URL, rootOwner: (uid: UInt32, gid: UInt32) = (getuid(), getgid())) throws {
        self.directory = directory
        try StateFiles.directory(directory.path)
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
                let root = ItemRecord(id: .root, node: 1, parent: nil, name: "", kind: .folder,
                                      mode: UInt32(S_IFDIR) | 0o755, uid: rootOwner.uid, gid: rootOwner.gid, time: now)
                try Self.apply(.upsert(root), db)
            }
        }
        // The thread holds the store until `close()` (or `abandon()`) ends it: a store dropped
        // without closing is kept alive (and its queue still committed) rather than freed under
        // the running writer (it was `unowned`: a test that forgot `close()` crashed the run).
        let t = Thread { [self] in self.writerLoop() }
        t.name = "nimbus-store-writer"
        t.start()
    }

    /// Everything persisted, for building the in-memory tree at mount time.
    public func load() throws -> StoreSnapshot {
        try pool.read { db in
            var items: [ItemRecord] = []
            let rows = try Row.fetchCursor(db, sql: "SELECT id, node, parent, name, kind, mode, uid, gid, size, atime, mtime, ctime, btime, target, version, dirty FROM item")
            while let r = try rows.next() {
                guard let id = ItemID(r[0] as String), let kind = ItemKind(rawValue: r[4]) else { continue }
                var rec = ItemRecord(id: id, node: UInt64(r[1] as Int64), parent: (r[2] as String?).flatMap(ItemID.init),
                                     name: r[3], kind: kind, mode: UInt32(r[5] as Int64), uid: UInt32(r[6] as Int64),
                                     gid: UInt32(r[7] as Int64), size: r[8], time: r[9], target: r[13])
                rec.mtime = r[10]; rec.ctime = r[11]; rec.btime = r[12]; rec.version = r[14]; rec.dirty = r[15]
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
        pending.append(change)
        enqueued += 1
        if pending.count == 1 { queueLock.signal() }
        queueLock.unlock()
    }

    /// Waits until every change enqueued before this call is committed and fsynced.
    /// Returns the writer's last error, if any.
    @discardableResult
    public func sync() -> String? {
        queueLock.lock()
        defer { queueLock.unlock() }
        let target = enqueued
        wantsFullSync = true
        queueLock.broadcast()
        while committed < target && !writerDone { queueLock.wait() }
        return lastError
    }

    /// Waits until every change enqueued before this call is committed (not fsynced). For state
    /// written directly that must never be on disk without the queued changes it describes (the
    /// sync engine's bases and cursor after the tree changes they stand for): WAL commits are
    /// ordered, so the order holds after `kill -9` and power loss alike.
    public func commitQueued() {
        queueLock.lock()
        defer { queueLock.unlock() }
        let target = enqueued
        guard committed < target else { return }
        hurry = true
        queueLock.broadcast()
        while committed < target && !writerDone { queueLock.wait() }
    }

    /// Number of changes not yet committed (shown in `.nimbus/status`).
    public var backlog: UInt64 { queueLock.lock(); defer { queueLock.unlock() }; return enqueued - committed }

    /// Commits what is queued and stops the writer thread.
    public func close() {
        sync()
        queueLock.lock()
        stopping = true
        queueLock.broadcast()
        while !writerDone { queueLock.wait() }
        queueLock.unlock()
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
        queueLock.broadcast()
        while !writerDone { queueLock.wait() }
        queueLock.unlock()
    }

    /// A direct write (not through the queue); refused once the store was abandoned.
    func write<T>(_ body: (Database) throws -> T) throws -> T {
        let dead = queueLock.withLock { abandoned }
        if dead { throw StoreAbandoned() }
        return try pool.write(body)
    }

    /// A read-only look at the database (tests, status, the sync engine later).
    public func read<T>(_ body: (Database) throws -> T) throws -> T { try pool.read(body) }

    private func writerLoop() {
        while true {
            queueLock.lock()
            while pending.isEmpty && !stopping && !wantsFullSync { queueLock.wait() }
            // Let a burst (untar, cp -r) gather into one transaction: wait up to 5 ms unless
            // someone is waiting in sync() (broadcast wakes us at once).
            if !pending.isEmpty && !wantsFullSync && !hurry && !stopping {
                _ = queueLock.wait(until: Date(timeIntervalSinceNow: 0.005))
            }
            hurry = false
            if pending.isEmpty && stopping {
                writerDone = true
                queueLock.broadcast()
                queueLock.unlock()
                return
            }
            let batch = pending
            pending.removeAll(keepingCapacity: true)
            let full = wantsFullSync
            wantsFullSync = false
            let upTo = committed + UInt64(batch.count)
            queueLock.unlock()

            var failure: String?
            do {
                if full { try pool.writeWithoutTransaction { try $0.execute(sql: "PRAGMA synchronous = FULL") } }
                if !batch.isEmpty {
                    try pool.write { db in for change in batch { try Self.apply(change, db) } }
                }
                if full { try pool.writeWithoutTransaction { try $0.execute(sql: "PRAGMA synchronous = NORMAL") } }
            } catch {
                failure = "\(error)"
                FileHandle.standardError.write(Data("nimbus: local state write failed: \(error)\n".utf8))
            }

            if failure == nil {
                for case .removeFile(let path) in batch { unlink(path) }
            }
            queueLock.lock()
            committed = upTo
            if let failure { lastError = failure }
            queueLock.broadcast()
            queueLock.unlock()
        }
    }

    static func apply(_ change: StoreChange, _ db: Database) throws {
        switch change {
        case .upsert(let r):
            let s = try db.cachedStatement(sql: Schema.upsertItem)
            try s.execute(arguments: [
                r.id.description, Int64(r.node), r.parent?.description, r.name, r.kind.rawValue, Int64(r.mode),
                Int64(r.uid), Int64(r.gid), r.size, r.atime, r.mtime, r.ctime, r.btime, r.target, r.version, r.dirty,
            ])
        case .delete(let id):
            try db.cachedStatement(sql: "DELETE FROM item WHERE id = ?").execute(arguments: [id.description])
        case .setXattr(let id, let name, let value):
            try db.cachedStatement(sql: "INSERT INTO xattr (item, name, value) VALUES (?, ?, ?) ON CONFLICT(item, name) DO UPDATE SET value = excluded.value")
                .execute(arguments: [id.description, name, Data(value)])
        case .removeXattr(let id, let name):
            try db.cachedStatement(sql: "DELETE FROM xattr WHERE item = ? AND name = ?").execute(arguments: [id.description, name])
        case .syncOp(let id, let kind):
            try db.cachedStatement(sql: "INSERT INTO sync_op (item, kind) VALUES (?, ?)").execute(arguments: [id.description, kind])
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
