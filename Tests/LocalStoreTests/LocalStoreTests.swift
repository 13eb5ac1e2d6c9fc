import Foundation
import FuseIDs
import GRDB
@testable import LocalStore
import NimbusCore
import Synchronization
import Testing

func tempDir(_ label: String) -> URL {
    let u = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-\(label)-\(UUID().uuidString)")
    try? FileManager.default.createDirectory(at: u, withIntermediateDirectories: true)
    return u
}

@Suite struct LocalStoreTests {
    @Test func migratesCreatesRootAndPersistsChangesInOrder() throws {
        let dir = tempDir("store")
        defer { try? FileManager.default.removeItem(at: dir) }
        let a = ItemID(UUID()), b = ItemID(UUID())
        do {
            let s = try LocalStore(directory: dir)
            var fa = ItemRecord(id: a, node: NodeID(rawValue: 20), parent: .root, name: "a", kind: .folder, mode: 0o40755, uid: 1, gid: 2, time: 5)
            s.enqueue(.upsert(fa))
            s.enqueue(.upsert(ItemRecord(id: b, node: NodeID(rawValue: 21), parent: a, name: "b", kind: .symlink, mode: 0o120777, uid: 1, gid: 2, time: 6, target: "x")))
            s.enqueue(.setXattr(b, name: "user.k", value: [1, 2, 3]))
            fa.name = "renamed"
            s.enqueue(.upsert(fa))
            #expect(s.sync() == nil)
            s.close()
        }
        let s = try LocalStore(directory: dir)
        defer { s.close() }
        let snap = try s.load()
        #expect(snap.items.count == 3)
        #expect(snap.items.first { $0.id == .root }?.node == .root)
        #expect(snap.items.first { $0.id == a }?.name == "renamed")
        #expect(snap.items.first { $0.id == b }?.target == "x")
        #expect(snap.xattrs[b]?["user.k"] == [1, 2, 3])
        // The schema refuses what the code must never write.
        #expect(throws: (any Error).self) {
            try s.read { db in try db.execute(sql: "INSERT INTO item (id, node, parent, name, kind, mode, uid, gid, size, atime, mtime, ctime, btime) VALUES ('x', 99, NULL, 'n', 'file', 0, 0, 0, 0, 0, 0, 0, 0)") }
        }
    }

    /// The engine's writes (bases, cursor) join the write-behind queue behind the tree changes
    /// enqueued before them: nobody waits for them, and a task that must read them back awaits
    /// `queueCommitted()` (no thread blocked), which sees both.
    @Test func theEnginesWritesJoinTheQueueAndATaskAwaitsTheirCommit() async throws {
        let dir = tempDir("store-engine-writes")
        defer { try? FileManager.default.removeItem(at: dir) }
        let s = try LocalStore(directory: dir)
        defer { s.close() }
        let base = ItemID(UUID())
        for round in 0..<50 {
            let rec = ItemRecord(id: ItemID(UUID()), node: NodeID(rawValue: UInt64(100 + round)), parent: .root, name: "f\(round)",
                                 kind: .file, mode: 0o100644, uid: 1, gid: 2, time: 5)
            s.enqueue(.upsert(rec))
            try s.saveSyncBase(SyncBase(id: base, version: Int64(round + 1), record: Data([1]), present: nil))
            try s.setMeta("sync.cursor", "\(round)")
            await s.queueCommitted()
            #expect(try s.meta("sync.cursor") == "\(round)")
            #expect(try s.syncBases()[base]?.version == Int64(round + 1))
            #expect(try s.load().items.contains { $0.id == rec.id })
        }
        // A write the database refuses (a version of 0 breaks a CHECK) is dropped and logged: it
        // does not hold back the changes queued with it or after it.
        let after = ItemRecord(id: ItemID(UUID()), node: NodeID(rawValue: 99), parent: .root, name: "after", kind: .file,
                               mode: 0o100644, uid: 1, gid: 2, time: 5)
        try s.saveSyncBase(SyncBase(id: ItemID(UUID()), version: 0, record: Data([1]), present: nil))
        s.enqueue(.upsert(after))
        await s.queueCommitted()
        #expect(s.lastError == nil)
        #expect(try s.load().items.contains { $0.id == after.id })
        #expect(s.sync() == nil)
        // Many tasks waiting at once are all resumed.
        await withTaskGroup(of: Void.self) { g in
            for i in 0..<20 {
                g.addTask {
                    try? s.setMeta("k\(i)", "v")
                    await s.queueCommitted()
                    #expect((try? s.meta("k\(i)")) == "v")
                }
            }
        }
    }

    /// `sync()` (a program's fsync) makes durable what was committed before in NORMAL mode,
    /// even when nothing is queued any more: a full commit fsyncs the WAL with every earlier frame.
    @Test func syncWithNothingQueuedStillMakesEarlierCommitsDurable() throws {
        let dir = tempDir("store-durable")
        defer { try? FileManager.default.removeItem(at: dir) }
        let s = try LocalStore(directory: dir)
        defer { s.close() }
        func marks() throws -> String? { try s.meta("store.durable") }
        let a = ItemID(UUID())
        s.enqueue(.upsert(ItemRecord(id: a, node: NodeID(rawValue: 20), parent: .root, name: "a", kind: .file, mode: 0o100644, uid: 1, gid: 2, time: 5)))
        s.commitQueued()  // committed, not fsynced
        #expect(try marks() == nil)
        #expect(s.sync() == nil)  // nothing queued: a full commit of the mark alone
        #expect(try marks() == "1")
        #expect(s.sync() == nil)  // nothing committed since: nothing to make durable
        #expect(try marks() == "1")
    }

    @Test func deleteCascadesXattrsAndCacheSweepRemovesOrphans() throws {
        let dir = tempDir("store2")
        defer { try? FileManager.default.removeItem(at: dir) }
        let s = try LocalStore(directory: dir)
        defer { s.close() }
        let a = ItemID(UUID()), orphan = ItemID(UUID())
        s.enqueue(.upsert(ItemRecord(id: a, node: NodeID(rawValue: 30), parent: .root, name: "f", kind: .file, mode: 0o100644, uid: 0, gid: 0, time: 1)))
        s.enqueue(.setXattr(a, name: "user.a", value: [9]))
        s.enqueue(.delete(a))
        s.sync()
        #expect(try s.load().xattrs[a] == nil)
        for id in [a, orphan] { let fd = s.cache.open(id, create: true); #expect(fd >= 0); close(fd) }
        #expect(s.cache.sweep(keeping: [a]) == 1)
        #expect(s.cache.size(of: a) == 0)
        #expect(s.cache.size(of: orphan) == nil)
    }

    /// An upsert writes the whole row, so a later upsert of the same item in the same transaction
    /// makes the earlier one moot; a delete of the item or an engine write in between keeps it
    /// (the delete's cascade and the engine's reads must meet the rows written before them).
    @Test func aTransactionWritesEachItemsRowOnceAndTheResultIsTheSame() throws {
        let a = ItemID(UUID()), b = ItemID(UUID()), c = ItemID(UUID())
        func file(_ id: ItemID, _ node: UInt64, _ name: String, size: Int64 = 0) -> ItemRecord {
            var r = ItemRecord(id: id, node: NodeID(rawValue: node), parent: .root, name: name, kind: .file, mode: 0o100644, uid: 0, gid: 0, time: 1)
            r.size = size
            return r
        }
        let body: @Sendable (Database) throws -> Void = { _ in }
        let batch: [LocalStore.Queued] = [
            .change(.upsert(file(a, 40, "a1"))), .change(.setXattr(a, name: "user.x", value: [1])), .change(.upsert(file(b, 41, "b"))),
            .change(.upsert(file(a, 40, "a2"))), .change(.syncOp(a, kind: .created)), .change(.upsert(file(a, 40, "a3"))),
            .change(.upsert(file(c, 42, "c1"))), .change(.delete(c)), .change(.upsert(file(c, 42, "c2"))),
            .change(.upsert(file(b, 41, "b2"))), .direct(body), .change(.upsert(file(b, 41, "b3"))),
        ]
        #expect(LocalStore.mootWrites(batch) == [true, false, true, true, false, false, false, false, false, false, false, false])

        // The same kinds of runs through a store, committed as one transaction: what is read
        // back is what every write in order would leave.
        let dir = tempDir("coalesce")
        defer { try? FileManager.default.removeItem(at: dir) }
        do {
            let s = try LocalStore(directory: dir, writer: .caller)
            s.enqueue(.upsert(file(a, 40, "a1", size: 1)))
            s.enqueue(.setXattr(a, name: "user.x", value: [1]))
            s.enqueue(.upsert(file(b, 41, "b", size: 5)))
            s.enqueue(.upsert(file(a, 40, "a2", size: 2)))
            s.enqueue(.syncOp(a, kind: .created))
            s.enqueue(.upsert(file(a, 40, "a3", size: 3)))
            // A new item given an xattr, deleted and made again: the delete's cascade takes the xattr.
            s.enqueue(.upsert(file(c, 42, "c1")))
            s.enqueue(.setXattr(c, name: "user.y", value: [2]))
            s.enqueue(.delete(c))
            s.enqueue(.upsert(file(c, 42, "c2", size: 7)))
            // An engine write between two upserts reads the row as the first one left it.
            let seen = Mutex<String?>(nil)
            try s.write { db in
                let name = try String.fetchOne(db, sql: "SELECT name FROM item WHERE id = ?", arguments: [b.description])
                seen.withLock { $0 = name }
            }
            s.enqueue(.upsert(file(b, 41, "b2", size: 6)))
            s.writePending()
            #expect(s.lastError == nil)
            #expect(seen.withLock { $0 } == "b")
            #expect(s.close() == nil)
            s.closeDatabase()
        }
        let s = try LocalStore(directory: dir)
        defer { s.close() }
        let snap = try s.load()
        let byID = Dictionary(uniqueKeysWithValues: snap.items.map { ($0.id, $0) })
        #expect(byID[a]?.name == "a3" && byID[a]?.size == 3)
        #expect(byID[b]?.name == "b2" && byID[b]?.size == 6)
        #expect(byID[c]?.name == "c2" && byID[c]?.size == 7)
        #expect(snap.xattrs[a]?["user.x"] == [1])
        #expect(snap.xattrs[c] == nil, "the delete between the upserts took c's xattr")
        #expect(try s.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM sync_op WHERE item = ?", arguments: [a.description]) } == 1)
    }

    /// An upload-queue entry that repeats one earlier in the same transaction (same item, same
    /// kind) is not written: the queue read back names the same items, in the order of their
    /// first entries, with the same kinds. An engine write in between (it may remove entries)
    /// keeps the later one.
    @Test func aTransactionQueuesEachItemsKindOnce() throws {
        let a = ItemID(UUID()), b = ItemID(UUID())
        let body: @Sendable (Database) throws -> Void = { _ in }
        let batch: [LocalStore.Queued] = [
            .change(.syncOp(a, kind: .created)), .change(.syncOp(a, kind: .content)), .change(.syncOp(b, kind: .content)),
            .change(.syncOp(a, kind: .content)), .change(.syncOp(a, kind: .attributes)), .change(.syncOp(b, kind: .content)),
            .direct(body), .change(.syncOp(a, kind: .content)), .change(.syncOp(a, kind: .content)),
        ]
        #expect(LocalStore.mootWrites(batch) == [false, false, false, true, false, true, false, false, true])

        let dir = tempDir("queue-once")
        defer { try? FileManager.default.removeItem(at: dir) }
        let s = try LocalStore(directory: dir, writer: .caller)
        defer { s.close() }
        for (id, kind) in [(a, SyncOpKind.created), (a, .content), (b, .content), (a, .content), (b, .moved), (b, .content), (a, .content)] {
            s.enqueue(.syncOp(id, kind: kind))
        }
        try s.write { db in
            // The engine committed a's push: its entries so far go.
            try db.execute(sql: "DELETE FROM sync_op WHERE item = ?", arguments: [a.description])
        }
        s.enqueue(.syncOp(a, kind: .content))
        s.enqueue(.syncOp(b, kind: .content))
        s.writePending()
        #expect(s.lastError == nil)
        let queue = try s.syncOps().map { "\($0.item == a ? "a" : "b") \($0.kind?.rawValue ?? "?")" }
        // (b's second content entry is kept: after an engine write every entry counts as new.)
        #expect(queue == ["b content", "b moved", "a content", "b content"], "one entry per item and kind, in the order of the first")
    }
}

/// The cache's 256 fan-out folders exist from the start, and an `fsync` in the mount syncs the
/// folders that got a new name since the last one (`syncDirectories`; the first one after a
/// start syncs them all), not all 256 each time.
@Suite struct ContentCacheFolderTests {
    func id(_ first: UInt8) -> ItemID {
        var u = UUID().uuid
        u.0 = first
        return ItemID(UUID(uuid: u))
    }

    @Test func newNamesMarkTheirFoldersUntilTheNextSync() throws {
        let dir = tempDir("cache-folders")
        defer { try? FileManager.default.removeItem(at: dir) }
        let cache = try ContentCache(directory: dir.appendingPathComponent("cache"))
        let folders = try FileManager.default.contentsOfDirectory(atPath: cache.directory.path).filter { $0.count == 2 }
        #expect(folders.count == 256 && folders.contains("ab") && folders.contains("0f"))
        #expect(cache.unsynced.take() == Array(0...256), "an earlier run's names: the first sync takes every folder and the cache folder")
        let a = id(0xab), b = id(0x0f), c = id(0xff)
        let fd = cache.open(a, create: true, fresh: true)
        #expect(fd >= 0)
        close(fd)
        #expect(cache.unsynced.take() == [0xab])
        let again = cache.open(a, create: true)  // there already: no new name
        close(again)
        #expect(cache.unsynced.take().isEmpty)
        #expect(cache.link(a, as: b) == 0)
        let made = cache.open(c, create: true, size: 10)
        close(made)
        #expect(cache.unsynced.take() == [0x0f, 0xff])
        #expect(cache.exchange(a, c))
        #expect(cache.unsynced.take() == [0xab, 0xff])
        let trashed = try #require(cache.trash(c))
        #expect(cache.unsynced.take() == [FolderMarks.cacheFolder], "the trash folder was made: the cache folder has a new name")
        let other = id(0x10), made2 = cache.open(other, create: true)
        close(made2)
        _ = cache.unsynced.take()
        _ = cache.trash(other)
        #expect(cache.unsynced.take().isEmpty, "a move to the trash needs no sync")
        #expect(cache.restore(trashed, as: c))
        cache.syncDirectories()
        #expect(cache.unsynced.take().isEmpty, "syncDirectories took the marks")
    }
}
