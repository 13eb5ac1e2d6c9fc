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
}
