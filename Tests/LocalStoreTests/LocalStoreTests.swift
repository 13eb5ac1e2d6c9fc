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
        try s.setMeta("k", "v")  // a direct write, committed in NORMAL mode
        #expect(s.sync() == nil)
        #expect(try marks() == "2")
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
