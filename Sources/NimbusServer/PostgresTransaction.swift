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
        guard let row = try db.rows("""
            SELECT v.seq, v.state, i.history_floor FROM versions v
            JOIN items i ON i.container_id = v.container_id AND i.id = v.item_id
            WHERE v.container_id = \(cid) AND v.item_id = \(id.description) AND v.was_current AND v.seq <= \(version)
            ORDER BY v.seq DESC LIMIT 1
            """).first else { return nil }
        let (seq, state, floor) = try row.decode((Int64, String, Int64).self)
        return seq > floor ? try Codec.decodeState(state) : nil
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

    func setRole(item: ItemID, seq: Int64, role: StoredRole, at time: Int64) throws {
        let retired: Int64? = role.isEarlier ? time : nil
        try db.exec("""
            UPDATE versions SET role = \(role.rawValue), retired = \(retired)
            WHERE container_id = \(cid) AND item_id = \(item.description) AND seq = \(seq)
            """)
    }

    func version(item: ItemID, seq: Int64) throws -> (role: StoredRole, state: ItemState)? {
        guard let row = try db.rows("SELECT role, state FROM versions WHERE container_id = \(cid) AND item_id = \(item.description) AND seq = \(seq)").first
        else { return nil }
        let (role, state) = try row.decode((String, String).self)
        guard let r = StoredRole(rawValue: role) else { return nil }
        return (r, try Codec.decodeState(state))
    }

    func versionSeqs(item: ItemID, role: StoredRole) throws -> [Int64] {
        try db.rows("SELECT seq FROM versions WHERE container_id = \(cid) AND item_id = \(item.description) AND role = \(role.rawValue) ORDER BY seq")
            .map { try $0.decode(Int64.self) }
    }

    func earlierVersions(of id: ItemID) throws -> [EarlierVersion] {
        try db.rows("""
            SELECT seq, role, was_current, retired FROM versions
            WHERE container_id = \(cid) AND item_id = \(id.description) AND role IN ('previous', 'discarded')
            """).map { row in
            let (seq, role, wasCurrent, retired) = try row.decode((Int64, String, Bool, Int64?).self)
            guard let r = StoredRole(rawValue: role), let retired else {
                throw APIError(.internal, "corrupt earlier version \(seq) of item \(id) in the database")
            }
            return EarlierVersion(seq: seq, role: r, wasCurrent: wasCurrent, retired: retired)
        }
    }

    func deleteVersions(item: ItemID, seqs: [Int64], historyFloor: Int64?) throws {
        // Only earlier rows, whatever the caller asks: the current and conflict versions stay.
        try db.exec("""
            DELETE FROM versions WHERE container_id = \(cid) AND item_id = \(item.description)
              AND role IN ('previous', 'discarded') AND seq = ANY(\(seqs))
            """)
        if let historyFloor {
            try db.exec("""
                UPDATE items SET history_floor = GREATEST(history_floor, \(historyFloor))
                WHERE container_id = \(cid) AND id = \(item.description)
                """)
        }
    }

    func appendJournal(seq: Int64, kind: ChangeKind, item: StoredItem, device: DeviceID) throws {
        try db.exec("""
            INSERT INTO journal(container_id, seq, item_id, kind, device_id, record)
            VALUES (\(cid), \(seq), \(item.id.description), \(kind.rawValue), \(device.description), \(try Codec.encode(item.record)))
            """)
    }

    /// Locks the rows it finds (FOR KEY SHARE) until the commit ends: the garbage collector
    /// deletes an ownership only under FOR UPDATE, so it either sees this commit's versions or
    /// leaves the rows alone, and a row it deleted first is not found here (`missing_chunks`).
    func ownedChunks(_ hashes: [ContentHash]) throws -> [ContentHash: Int64] {
        try PostgresStore.ownedChunks(try db.rows(PostgresStore.ownedChunksQuery(account: container.accountID, hashes, lock: true)))
    }
}
