import Logging
import NIOCore
import NimbusCore
import NimbusProtocol
import PostgresNIO

/// Blocking queries on one leased connection. `CommitEngine` works over the synchronous
/// `StoreTransaction`, so a commit runs on a thread of the store's own thread pool (never an event
/// loop) and waits for each query's future there; the connection's event loop does the I/O.
struct PostgresSync {
    let conn: PostgresConnection
    let logger: Logger

    func rows(_ q: PostgresQuery) throws -> [PostgresRow] {
        try conn.query(q, logger: logger).wait().rows
    }

    func exec(_ q: PostgresQuery) throws {
        _ = try conn.query(q, logger: logger).wait()
    }
}

/// `StoreTransaction` inside an open PostgreSQL transaction, scoped to one container whose row the
/// caller has locked (`SELECT … FOR UPDATE`), so commits to one container run one at a time and
/// journal sequences stay gap-free, as SQLite's single writer guarantees for the embedded engine.
struct PostgresTransaction: StoreTransaction {
    let db: PostgresSync
    let container: ContainerRecord
    private let encoded = EncodedStateCache()

    private var cid: Int64 { container.id }

    private func encode(_ state: ItemState) throws -> String { try encoded.encode(state) }

    func loadItem(_ id: ItemID) throws -> StoredItem? {
        try db.rows("SELECT id, version, conflicts, state FROM items WHERE container_id = \(cid) AND id = \(id.description)")
            .first.map(PostgresStore.storedItem)
    }

    func stateCurrent(at version: Int64, of id: ItemID) throws -> ItemState? {
        try db.rows("""
            SELECT state FROM versions WHERE container_id = \(cid) AND item_id = \(id.description) AND was_current AND seq <= \(version)
            ORDER BY seq DESC LIMIT 1
            """).first.map { try Codec.decode(ItemState.self, try $0.decode(String.self)) }
    }

    func isNameTaken(parent: ItemID, name: String, excluding id: ItemID) throws -> Bool {
        !(try db.rows("""
            SELECT 1 FROM items WHERE container_id = \(cid) AND parent_id = \(parent.description) AND name = \(name)
              AND NOT deleted AND id <> \(id.description)
            """).isEmpty)
    }

    func liveChildren(of id: ItemID) throws -> [StoredItem] {
        try db.rows("""
            SELECT id, version, conflicts, state FROM items WHERE container_id = \(cid) AND parent_id = \(id.description) AND NOT deleted
            """).map(PostgresStore.storedItem)
    }

    func nextSeq() throws -> Int64 {
        guard let row = try db.rows("UPDATE containers SET cursor = cursor + 1 WHERE id = \(cid) RETURNING cursor").first else {
            throw APIError.containerNotFound(container.name)
        }
        return try row.decode(Int64.self)
    }

    func saveItem(_ item: StoredItem) throws {
        let s = item.state
        try db.exec("""
            INSERT INTO items(container_id, id, parent_id, name, kind, deleted, version, conflicts, state)
            VALUES (\(cid), \(item.id.description), \(s.location.parent.description), \(s.location.name.value), \(s.kind.rawValue),
                    \(s.deleted), \(item.version), \(Int64(item.conflicts)), \(try encode(s)))
            ON CONFLICT (container_id, id) DO UPDATE SET parent_id = excluded.parent_id, name = excluded.name,
                deleted = excluded.deleted, version = excluded.version, conflicts = excluded.conflicts, state = excluded.state
            """)
    }

    func currentVersionSeq(of id: ItemID) throws -> Int64? {
        try db.rows("SELECT seq FROM versions WHERE container_id = \(cid) AND item_id = \(id.description) AND role = 'current'")
            .first.map { try $0.decode(Int64.self) }
    }

    func insertVersion(item: ItemID, seq: Int64, role: StoredRole, wasCurrent: Bool, state: ItemState) throws {
        try db.exec("""
            INSERT INTO versions(container_id, item_id, seq, role, was_current, device_id, state)
            VALUES (\(cid), \(item.description), \(seq), \(role.rawValue), \(wasCurrent), \(state.modifiedBy.description), \(try encode(state)))
            """)
    }

    func setRole(item: ItemID, seq: Int64, role: StoredRole) throws {
        try db.exec("UPDATE versions SET role = \(role.rawValue) WHERE container_id = \(cid) AND item_id = \(item.description) AND seq = \(seq)")
    }

    func version(item: ItemID, seq: Int64) throws -> (role: StoredRole, state: ItemState)? {
        guard let row = try db.rows("SELECT role, state FROM versions WHERE container_id = \(cid) AND item_id = \(item.description) AND seq = \(seq)").first
        else { return nil }
        let (role, state) = try row.decode((String, String).self)
        guard let r = StoredRole(rawValue: role) else { return nil }
        return (r, try Codec.decode(ItemState.self, state))
    }

    func versionSeqs(item: ItemID, role: StoredRole) throws -> [Int64] {
        try db.rows("SELECT seq FROM versions WHERE container_id = \(cid) AND item_id = \(item.description) AND role = \(role.rawValue) ORDER BY seq")
            .map { try $0.decode(Int64.self) }
    }

    func appendJournal(seq: Int64, kind: ChangeKind, item: StoredItem, device: DeviceID) throws {
        try db.exec("""
            INSERT INTO journal(container_id, seq, item_id, kind, device_id, record)
            VALUES (\(cid), \(seq), \(item.id.description), \(kind.rawValue), \(device.description), \(try Codec.encode(item.record)))
            """)
    }

    func ownedChunks(_ hashes: [ContentHash]) throws -> [ContentHash: Int64] {
        try PostgresStore.ownedChunks(try db.rows(PostgresStore.ownedChunksQuery(account: container.accountID, hashes)))
    }
}
