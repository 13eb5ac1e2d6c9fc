import Foundation
import GRDB
import NimbusCore
import NimbusProtocol
@testable import NimbusServer
import Testing

/// The SQLite upgrade that brings Recently Deleted to an existing database: items deleted before
/// it become entries (a deleted folder with what was deleted in it, a file on its own), stamped
/// with the upgrade time so they are kept the whole retention from then, and restorable.
@Suite struct TrashUpgradeTests {
    @Test func deletedItemsOfAnOlderDatabaseBecomeRestorableEntries() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-trash-upgrade-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/metadata.sqlite"
        let device = DeviceID(UUID())
        let token = String(repeating: "c", count: 64)
        let folder = ItemID(UUID()), inside = ItemID(UUID()), live = ItemID(UUID()), alone = ItemID(UUID())
        let chunk = ChunkRef(hash: ContentHash(hex: String(repeating: "ab", count: 32))!, size: 42)
        func state(_ kind: ItemKind, _ name: String, in parent: ItemID, deleted: Bool, chunks: [ChunkRef] = []) -> ItemState {
            ItemState(kind: kind, location: ItemLocation(parent: parent, name: ItemName(trusted: name)), content: ItemContent(chunks: chunks),
                      mode: kind == .folder ? 0o755 : 0o644, modified: 1_000, modifiedBy: device, deleted: deleted)
        }
        let rows: [(ItemID, ItemState)] = [
            (folder, state(.folder, "dir", in: .root, deleted: true)),
            (inside, state(.file, "f.txt", in: folder, deleted: true, chunks: [chunk])),
            (live, state(.file, "g.txt", in: .root, deleted: false, chunks: [chunk])),
            (alone, state(.file, "h.txt", in: .root, deleted: true, chunks: [chunk, chunk])),
        ]
        do {
            let pool = try DatabasePool(path: path)
            try SQLiteStore.migrator.migrate(pool, upTo: "v7-metadata-usage")
            try await pool.write { db in
                try db.execute(sql: "INSERT INTO accounts(id, name) VALUES (1, 'alice')")
                try db.execute(sql: "INSERT INTO devices(id, account_id, name, token_hash, created) VALUES (?, 1, 'laptop', ?, 0)",
                               arguments: [device.description, token])
                try db.execute(sql: "INSERT INTO containers(id, account_id, name, cursor) VALUES (1, 1, 'c', ?)", arguments: [rows.count])
                try db.execute(sql: "INSERT INTO account_chunks(account_id, hash, size, touched) VALUES (1, ?, 42, 0)", arguments: [chunk.hash.hex])
                for (i, (id, s)) in rows.enumerated() {
                    let seq = i + 1
                    try db.execute(sql: """
                        INSERT INTO items(container_id, id, parent_id, name, kind, deleted, version, conflicts, state)
                        VALUES (1, ?, ?, ?, ?, ?, ?, 0, ?)
                        """, arguments: [id.description, s.location.parent.description, s.location.name.value, s.kind.rawValue, s.deleted, seq, try Codec.encode(s)])
                    try db.execute(sql: "INSERT INTO versions(container_id, item_id, seq, role, was_current, device_id, state) VALUES (1, ?, ?, 'current', 1, ?, ?)",
                                   arguments: [id.description, seq, device.description, try Codec.encode(s)])
                    try db.execute(sql: "INSERT INTO journal(container_id, seq, item_id, kind, device_id, record) VALUES (1, ?, ?, ?, ?, ?)",
                                   arguments: [seq, id.description, s.deleted ? "delete" : "create", device.description,
                                               try Codec.encode(ItemRecord(id: id, version: Int64(seq), state: s, conflicts: 0))])
                }
                try db.execute(sql: """
                    UPDATE containers SET meta_bytes = (SELECT sum(length(CAST(state AS BLOB))) FROM versions)
                        + (SELECT sum(length(CAST(record AS BLOB))) FROM journal)
                    """)
            }
        }
        let before = Int64(Date().timeIntervalSince1970) * 1_000_000_000
        let store = try SQLiteStore(path: path)
        let problems = try await store.consistencyProblems()
        #expect(problems.isEmpty, "\(problems)")
        let container = try #require(try await store.container(account: 1, name: "c", create: false))
        let listed = try await store.trash(in: container, after: nil, limit: 10)
        #expect(Set(listed.map(\.row.item.id)) == [folder, alone], "the folder and the lone file: \(listed.map(\.path))")
        let dirEntry = try #require(listed.first { $0.row.item.id == folder })
        #expect(dirEntry.row.items == 2 && dirEntry.row.bytes == 42 && dirEntry.path == "/dir")
        #expect(listed.first { $0.row.item.id == alone }?.row.bytes == 84)
        #expect(listed.allSatisfy { $0.row.deletedAt >= before - 2_000_000_000 && $0.row.deletedBy == device }, "stamped at the upgrade")
        let laptop = try #require(try await store.device(tokenHash: token))
        let r = try await store.restoreTrash(folder, to: nil, in: container, by: laptop, now: before + 1_000)
        #expect(r.restored == 2 && r.item.name.value == "dir")
        #expect(try await store.item(inside, in: container)?.deleted == false)
        #expect(try await store.consistencyProblems().isEmpty)
    }
}
