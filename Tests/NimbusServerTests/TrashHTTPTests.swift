import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Synchronization
import Testing

/// Recently Deleted over HTTP (docs/trash.md, docs/protocol.md): list, the items of an entry,
/// restore, purge, expiry by the server's clock, and the chunks the collector then frees.
@Suite struct TrashHTTPTests {
    static let second: Int64 = 1_000_000_000

    @Test func deletedFilesAreListedRestoredPurgedAndExpireWithTheirChunks() async throws {
        let clock = Mutex<Int64>(1_000 * Self.second)
        try await LiveServer.with(configure: { app in
            app.clock = { clock.withLock { $0 } }
            app.gcGraceSeconds = 0
            app.trashKeepSeconds = 3_600
        }) { s in
            let client = NimbusClient(baseURL: s.url, token: try await s.token())
            let me = try await client.whoami()
            let c = "com.example.notes"
            _ = try await client.createContainer(c)
            let x = [UInt8](repeating: 1, count: 1_000), y = [UInt8](repeating: 2, count: 2_000)
            let hx = ChunkHashing.sha256(ByteBuffer(bytes: x)), hy = ChunkHashing.sha256(ByteBuffer(bytes: y))
            try await client.putChunk(hx, x)
            try await client.putChunk(hy, y)
            func draft(_ kind: ItemKind, _ name: String, in parent: ItemID = .root, _ chunks: [ChunkRef] = [], deleted: Bool = false) -> ItemDraft {
                ItemDraft(kind: kind, parent: parent, name: ItemName(trusted: name), chunks: chunks, mode: kind == .folder ? 0o755 : 0o644,
                          modified: 1, deleted: deleted)
            }
            let dir = ItemID(UUID()), a = ItemID(UUID()), b = ItemID(UUID())
            _ = try await client.commit(c, CommitRequest(item: dir, baseVersion: nil, state: draft(.folder, "dir")))
            let va = try await client.commit(c, CommitRequest(item: a, baseVersion: nil, state: draft(.file, "a.txt", in: dir, [ChunkRef(hash: hx, size: 1_000)]))).item.version
            let vb = try await client.commit(c, CommitRequest(item: b, baseVersion: nil, state: draft(.file, "b.txt", in: dir, [ChunkRef(hash: hy, size: 2_000)]))).item.version
            let before = try #require(try await s.app.store.accountUsage(account: "alice").first)

            clock.withLock { $0 = 2_000 * Self.second }
            let ra = try await client.commit(c, CommitRequest(item: a, baseVersion: va, state: draft(.file, "a.txt", in: dir, [ChunkRef(hash: hx, size: 1_000)], deleted: true)))
            var trash = try await client.trash(c)
            #expect(trash.keepSeconds == 3_600)
            let entry = try #require(trash.entries.first)
            #expect(trash.entries.count == 1 && entry.item.id == a && entry.path == "/dir/a.txt" && entry.bytes == 1_000 && entry.items == 1)
            #expect(entry.deletedAt == 2_000 * Self.second && entry.expires == 5_600 * Self.second && entry.deletedBy == me.device)
            let items = try await client.trashItems(c, a)
            #expect(items.entry == entry && items.items.map(\.id) == [a] && items.items[0].deleted)

            let restored = try await client.restoreTrash(c, a)
            #expect(restored.item.id == a && !restored.item.deleted && restored.restored == 1 && restored.cursor > ra.cursor)
            let changes = try await client.changes(c, since: ra.cursor)
            #expect(changes.changes.map(\.kind) == [.restore] && changes.changes.first?.item.id == a, "every device hears of the restore")
            #expect(try await client.trash(c).entries.isEmpty)
            for bad in [{ _ = try await client.restoreTrash(c, a) }, { _ = try await client.purgeTrash(c, ItemID(UUID())) }] as [@Sendable () async throws -> Void] {
                do { try await bad(); Issue.record("not in Recently Deleted: must fail") } catch let e as RemoteError {
                    #expect(e.code == .notInTrash, "\(e)")
                }
            }
            let garbage = try await client.send(.GET, "/v1/containers/\(c)/trash?after=nonsense")
            #expect(garbage.status == 400 && garbage.text.contains("invalid_parameter"), "\(garbage.text)")

            // Deleted again, with b; b purged by hand, a left to expire.
            let va2 = try await client.item(c, a).version
            _ = try await client.commit(c, CommitRequest(item: a, baseVersion: va2, state: draft(.file, "a.txt", in: dir, [ChunkRef(hash: hx, size: 1_000)], deleted: true)))
            _ = try await client.commit(c, CommitRequest(item: b, baseVersion: vb, state: draft(.file, "b.txt", in: dir, [ChunkRef(hash: hy, size: 2_000)], deleted: true)))
            trash = try await client.trash(c)
            #expect(trash.entries.map(\.item.id).sorted() == [a, b].sorted())
            let purged = try await client.purgeTrash(c, b)
            #expect(purged.entries == 1 && purged.items == 1 && purged.bytes == 2_000)
            #expect(try await client.trash(c).entries.map(\.item.id) == [a])

            clock.withLock { $0 = 5_599 * Self.second }
            #expect(try await s.app.expireTrash().entries == 0, "a is kept an hour")
            clock.withLock { $0 = 5_601 * Self.second }
            let expired = try await s.app.expireTrash()
            #expect(expired.entries == 1 && expired.bytes == 1_000)
            #expect(try await client.trash(c).entries.isEmpty)
            let gc = try await s.app.collectGarbage()
            #expect(gc.chunks == 2 && gc.bytes == 3_000, "both chunks freed: \(gc)")
            let after = try #require(try await s.app.store.accountUsage(account: "alice").first)
            #expect(before.figures.usage - before.metadata == 3_000 && after.figures.usage - after.metadata == 0 && after.chunks == 0,
                    "the quota sees the chunk bytes freed: \(before) → \(after)")
            #expect(try await StoreCheck.problems(store: s.app.store, chunks: s.app.chunks).isEmpty)
            let metrics = try await NimbusClient(baseURL: s.url, token: "").send(.GET, "/metrics", authorized: false).text
            #expect(metrics.contains("nimbus_trash_purged_entries_total 2") && metrics.contains("nimbus_trash_purged_bytes_total 3000"), "\(metrics)")
        }
    }

    /// Over the quota with Recently Deleted holding bytes: the upload goes in, the oldest entry
    /// is purged and its chunk freed at once; the newer entry and every live file stay.
    @Test func anUploadOverTheQuotaPurgesTheOldestDeletedFirst() async throws {
        let clock = Mutex<Int64>(1_000 * Self.second)
        try await LiveServer.with(configure: { app in app.clock = { clock.withLock { $0 } } }) { s in
            let client = NimbusClient(baseURL: s.url, token: try await s.token())
            let c = "com.example.notes"
            _ = try await client.createContainer(c)
            func put(_ fill: UInt8, _ n: Int) async throws -> ChunkRef {
                let bytes = [UInt8](repeating: fill, count: n)
                let h = ChunkHashing.sha256(ByteBuffer(bytes: bytes))
                try await client.putChunk(h, bytes)
                return ChunkRef(hash: h, size: Int64(n))
            }
            func file(_ name: String, _ chunk: ChunkRef, deleted: Bool = false, base: Int64? = nil, id: ItemID = ItemID(UUID())) async throws -> (ItemID, Int64) {
                let r = try await client.commit(c, CommitRequest(item: id, baseVersion: base, state: ItemDraft(
                    kind: .file, parent: .root, name: ItemName(trusted: name), chunks: [chunk], mode: 0o644, modified: 1, deleted: deleted)))
                return (id, r.item.version)
            }
            let live = try await put(1, 3_000), old = try await put(2, 3_000), newer = try await put(3, 3_000)
            let (keep, _) = try await file("keep.txt", live)
            let (o, vo) = try await file("old.txt", old)
            let (n, vn) = try await file("newer.txt", newer)
            clock.withLock { $0 = 2_000 * Self.second }
            _ = try await file("old.txt", old, deleted: true, base: vo, id: o)
            clock.withLock { $0 = 3_000 * Self.second }
            _ = try await file("newer.txt", newer, deleted: true, base: vn, id: n)
            let before = try #require(try await s.app.store.accountUsage(account: "alice").first)
            #expect(before.trash == 6_000, "Recently Deleted's bytes, reported apart: \(before)")
            let usage = before.figures.usage
            _ = try await s.app.store.setQuota(account: "alice", bytes: usage + 500)

            clock.withLock { $0 = 4_000 * Self.second }
            let extra = try await put(4, 2_000)
            #expect(extra.size == 2_000, "the upload went in")
            let trash = try await client.trash(c)
            #expect(trash.entries.map(\.item.id) == [n], "the oldest entry went, the newer stays: \(trash.entries.map(\.path))")
            #expect(try await s.app.store.accountUsage(account: "alice").first?.trash == 3_000)
            do {
                _ = try await client.getChunk(old.hash, range: nil)
                Issue.record("old.txt's chunk must be freed")
            } catch let e as RemoteError { #expect(e.code == .chunkNotFound, "old.txt's chunk is freed: \(e)") }
            #expect(try await client.getChunk(live.hash, range: nil).count == 3_000, "the live file's bytes are untouched")
            #expect(try await client.getChunk(newer.hash, range: nil).count == 3_000, "the newer entry's bytes stay")
            #expect(!(try await client.item(c, keep).deleted))
            #expect(s.log.messages.contains { $0.contains("over its quota: purged its 1 oldest Recently Deleted entry") }, "\(s.log.messages)")
            // No trash left to purge: refused as before.
            _ = try await client.purgeTrash(c, nil)
            let after = try #require(try await s.app.store.accountUsage(account: "alice").first)
            _ = try await s.app.store.setQuota(account: "alice", bytes: after.figures.usage + 100)
            do {
                _ = try await put(5, 2_000)
                Issue.record("over the quota with nothing to purge: refused")
            } catch let e as RemoteError { #expect(e.code == .quotaExceeded) }
            #expect(try await StoreCheck.problems(store: s.app.store, chunks: s.app.chunks).isEmpty)
        }
    }
}
