import Foundation
import FuseIDs
import GRDB
import LocalStore
import NimbusCore
import Testing

/// A small tmpfs for a store's state directory, unmounted (lazily) and removed by `close()`.
/// Needs root; `make` returns nil (and says so loudly) where a tmpfs cannot be mounted.
struct SmallDisk {
    let path: String

    static func make(_ label: String, megabytes: Int) -> SmallDisk? {
        let path = tempDir(label).path
        guard getuid() == 0, mount("tmpfs", path, "tmpfs", 0, "size=\(megabytes)m,mode=0700") == 0 else {
            print("StoreFailureTests: SKIPPED — cannot mount a small tmpfs here (needs root)")
            try? FileManager.default.removeItem(atPath: path)
            return nil
        }
        return SmallDisk(path: path)
    }

    func close() {
        umount2(path, Int32(MNT_DETACH))
        try? FileManager.default.removeItem(atPath: path)
    }

    /// Writes `fill-N` files until the disk refuses another byte (1 MiB writes, then 4 KiB).
    @discardableResult
    func fill() -> Int64 {
        var total: Int64 = 0
        var n = 0
        while FileManager.default.fileExists(atPath: path + "/fill-\(n)") { n += 1 }
        let fd = open(path + "/fill-\(n)", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return 0 }
        defer { Glibc.close(fd) }
        for size in [1 << 20, 4096, 512] {
            let block = [UInt8](repeating: 0x5a, count: size)
            while true {
                let w = block.withUnsafeBytes { write(fd, $0.baseAddress, size) }
                if w <= 0 { break }
                total += Int64(w)
            }
        }
        return total
    }

    /// Removes every `fill-N` file.
    func free() {
        for name in (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? [] where name.hasPrefix("fill-") {
            unlink(path + "/" + name)
        }
    }

    var available: Int64 {
        var sv = statvfs()
        return statvfs(path, &sv) == 0 ? Int64(sv.f_bavail) * Int64(sv.f_frsize) : -1
    }
}

/// The local state on a full disk: nothing queued is dropped, fsync says ENOSPC while full and
/// 0 once a retry commits, direct writes never overtake failed changes, the space reserve lets
/// a deletion free its trashed file, and close reports what it could not save.
@Suite struct StoreFailureTests {
    func folder(_ name: String, node: NodeID) -> ItemRecord {
        ItemRecord(id: ItemID(UUID()), node: node, parent: .root, name: name, kind: .folder, mode: 0o40755, uid: 0, gid: 0, time: 1)
    }

    func names(_ s: LocalStore) throws -> Set<String> { Set(try s.load().items.map(\.name)) }

    @Test func aBatchThatFailsOnAFullDiskIsKeptAndSyncRecoversWhenSpaceReturns() throws {
        guard let disk = SmallDisk.make("store-full", megabytes: 8) else { return }
        defer { disk.close() }
        let dir = URL(fileURLWithPath: disk.path + "/state")
        let s = try LocalStore(directory: dir, spaceReserve: 0)
        var recs: [ItemRecord] = []
        do {
            defer { s.close() }
            disk.fill()
            for i in 0..<300 { recs.append(folder(String(repeating: "n", count: 200) + "\(i)", node: NodeID(rawValue: UInt64(100 + i)))); s.enqueue(.upsert(recs[i])) }
            let failure = try #require(s.sync(), "a commit on a full disk must fail, not report success")
            #expect(failure.errno == ENOSPC, "\(failure)")
            #expect(s.lastError != nil)
            // Still failing: asked again, it answers again (bounded), and nothing was dropped.
            #expect(s.sync() != nil)
            #expect(s.backlog == 300)
            disk.free()
            #expect(s.sync() == nil, "once space is back the next sync commits")
            #expect(s.lastError == nil)
            #expect(s.backlog == 0)
        }
        let again = try LocalStore(directory: dir, spaceReserve: 0)
        defer { again.close() }
        #expect(try names(again).isSuperset(of: recs.map(\.name)))
    }

    @Test func directWritesQueueBehindAFailedBatchAndNothingOvertakesIt() async throws {
        guard let disk = SmallDisk.make("store-order", megabytes: 8) else { return }
        defer { disk.close() }
        let dir = URL(fileURLWithPath: disk.path + "/state")
        let s = try LocalStore(directory: dir, spaceReserve: 0)
        defer { s.close() }
        disk.fill()
        let rec = folder(String(repeating: "f", count: 200), node: NodeID(rawValue: 50))
        for i in 0..<200 { s.enqueue(.upsert(folder(String(repeating: "x", count: 200) + "\(i)", node: NodeID(rawValue: UInt64(500 + i))))) }
        s.enqueue(.upsert(rec))
        s.commitQueued()  // returns although it cannot commit
        await s.queueCommitted()  // so does a task's wait
        // The base of the new folder and the cursor join the queue: no error for the engine,
        // and nothing on disk ahead of the folder's row.
        try s.saveSyncBase(SyncBase(id: rec.id, version: 7, record: Data(repeating: 1, count: 64), present: nil))
        try s.setMeta("sync.cursor", "7")
        #expect(s.sync() != nil)
        #expect(try s.syncBases()[rec.id] == nil)
        #expect(try s.meta("sync.cursor") == nil)
        #expect(try !names(s).contains(rec.name))
        disk.free()
        #expect(s.sync() == nil)
        #expect(try names(s).contains(rec.name))
        #expect(try s.syncBases()[rec.id]?.version == 7)
        #expect(try s.meta("sync.cursor") == "7")
    }

    @Test func theSpaceReserveLetsADeletionFreeItsTrashedFileOnAFullDisk() throws {
        guard let disk = SmallDisk.make("store-reserve", megabytes: 24) else { return }
        defer { disk.close() }
        let dir = URL(fileURLWithPath: disk.path + "/state")
        let s = try LocalStore(directory: dir, spaceReserve: 1 << 20)
        defer { s.close() }
        #expect(FileManager.default.fileExists(atPath: dir.path + "/space-reserve"))
        var rec = folder("big", node: NodeID(rawValue: 40))
        rec.kind = .file
        rec.mode = 0o100644
        s.enqueue(.upsert(rec))
        let fd = s.cache.open(rec.id, create: true)
        #expect(fd >= 0)
        let block = [UInt8](repeating: 7, count: 1 << 20)
        for _ in 0..<8 { _ = block.withUnsafeBytes { write(fd, $0.baseAddress, block.count) } }
        close(fd)
        #expect(s.sync() == nil)
        disk.fill()
        let before = disk.available
        let trashed = try #require(s.cache.trash(rec.id))
        s.enqueue(.delete(rec.id))
        s.enqueue(.removeFile(trashed))
        #expect(s.sync() == nil, "the reserve makes room for the commit that frees the file")
        #expect(!FileManager.default.fileExists(atPath: trashed))
        #expect(disk.available >= before + 7 << 20, "rm frees the file's space: \(before) → \(disk.available)")
        // With room again the reserve is made again (at the next commit).
        s.enqueue(.upsert(folder("next", node: NodeID(rawValue: 41))))
        #expect(s.sync() == nil)
        #expect(FileManager.default.fileExists(atPath: dir.path + "/space-reserve"))
    }

    @Test func closeGivesUpAfterItsBoundAndSaysWhatWasNotSaved() throws {
        guard let disk = SmallDisk.make("store-close", megabytes: 8) else { return }
        defer { disk.close() }
        let dir = URL(fileURLWithPath: disk.path + "/state")
        let saved = folder("saved", node: NodeID(rawValue: 30))
        do {
            let s = try LocalStore(directory: dir, spaceReserve: 0)
            s.enqueue(.upsert(saved))
            #expect(s.sync() == nil)
            disk.fill()
            for i in 0..<300 { s.enqueue(.upsert(folder(String(repeating: "u", count: 200) + "\(i)", node: NodeID(rawValue: UInt64(300 + i))))) }
            let failure = try #require(s.close(within: 0.3), "close must report changes it could not save")
            #expect(failure.noSpace)
            #expect(failure.message.contains("could not be saved"), "\(failure)")
        }
        disk.free()
        let again = try LocalStore(directory: dir, spaceReserve: 0)
        defer { again.close() }
        let have = try names(again)
        #expect(have.contains("saved"))
        #expect(!have.contains { $0.hasPrefix("uuu") }, "a failed batch is all or nothing")
    }
}
