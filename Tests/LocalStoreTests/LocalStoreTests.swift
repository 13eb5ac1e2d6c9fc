import Foundation
import FuseIDs
import GRDB
import LocalStore
import NimbusCore
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
}
