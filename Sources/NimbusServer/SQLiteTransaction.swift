import GRDB
import NimbusCore
import NimbusProtocol

/// `StoreTransaction` on an open GRDB write transaction, scoped to one container.
struct SQLiteTransaction: StoreTransaction {
    let db: Database
    let container: ContainerRecord
    /// The last state encoded: a commit stores the same state in the item row and its version row.
    private let encoded = EncodedStateCache()
    private let metadata = MetadataCount()

    private func encode(_ state: ItemState) throws -> String { try encoded.encode(state) }

    /// The statement for `sql`, compiled once per connection (compiling costs more than running
    /// most of these).
    private func cached(_ sql: String) throws -> Statement { try db.cachedStatement(sql: sql) }

    func loadItem(_ id: ItemID) throws -> StoredItem? {
        try Row.fetchOne(cached("SELECT id, version, conflicts, state FROM items WHERE container_id = ? AND id = ?"),
                         arguments: [container.id, id.description]).map(SQLiteStore.storedItem)
    }

    func stateCurrent(at version: Int64, of id: ItemID) throws -> ItemState? {
        guard let row = try Row.fetchOne(cached("""
            SELECT v.seq, v.state, i.history_floor FROM versions v
            JOIN items i ON i.container_id = v.container_id AND i.id = v.item_id
            WHERE v.container_id = ? AND v.item_id = ? AND v.was_current = 1 AND v.seq <= ?
            ORDER BY v.seq DESC LIMIT 1
            """), arguments: [container.id, id.description, version]),
            (row["seq"] as Int64) > (row["history_floor"] as Int64)
        else { return nil }
        return try Codec.decodeState(row["state"] as String)
    }

    func isNameTaken(parent: ItemID, name: String, excluding id: ItemID) throws -> Bool {
        try Bool.fetchOne(cached("""
            SELECT 1 FROM items WHERE container_id = ? AND parent_id = ? AND name = ? AND deleted = 0 AND id != ?
            """), arguments: [container.id, parent.description, name, id.description]) ?? false
    }

    func liveChildren(of id: ItemID) throws -> [StoredItem] {
        try Row.fetchAll(cached("""
            SELECT id, version, conflicts, state FROM items WHERE container_id = ? AND parent_id = ? AND deleted = 0
            """), arguments: [container.id, id.description]).map(SQLiteStore.storedItem)
    }

    func nextSeq() throws -> Int64 {
        guard let seq = try Int64.fetchOne(cached("UPDATE containers SET cursor = cursor + 1 WHERE id = ? RETURNING cursor"),
                                           arguments: [container.id]) else {
            throw APIError.containerNotFound(container.name)
        }
        return seq
    }

    func saveItem(_ item: StoredItem) throws {
        try cached("""
            INSERT INTO items(container_id, id, parent_id, name, kind, deleted, version, conflicts, state)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT(container_id, id) DO UPDATE SET parent_id = excluded.parent_id, name = excluded.name,
                deleted = excluded.deleted, version = excluded.version, conflicts = excluded.conflicts, state = excluded.state
            """).execute(arguments: [container.id, item.id.description, item.state.location.parent.description, item.state.location.name.value,
                             item.state.kind.rawValue, item.state.deleted, item.version, item.conflicts, try encode(item.state)])
    }

    func currentVersionSeq(of id: ItemID) throws -> Int64? {
        try Int64.fetchOne(cached("SELECT seq FROM versions WHERE container_id = ? AND item_id = ? AND role = 'current'"),
                           arguments: [container.id, id.description])
    }

    func insertVersion(item: ItemID, seq: Int64, role: StoredRole, wasCurrent: Bool, state: ItemState) throws {
        let text = try encode(state)
        try cached("""
            INSERT INTO versions(container_id, item_id, seq, role, was_current, device_id, state) VALUES (?, ?, ?, ?, ?, ?, ?)
            """).execute(arguments: [container.id, item.description, seq, role.rawValue, wasCurrent, state.modifiedBy.description, text])
        metadata.bytes += Int64(text.utf8.count)
    }

    func setRole(item: ItemID, seq: Int64, role: StoredRole, at time: Int64) throws {
        try cached("UPDATE versions SET role = ?, retired = ? WHERE container_id = ? AND item_id = ? AND seq = ?")
            .execute(arguments: [role.rawValue, role.isEarlier ? time : nil, container.id, item.description, seq])
    }

    func version(item: ItemID, seq: Int64) throws -> (role: StoredRole, state: ItemState)? {
        guard let row = try Row.fetchOne(cached("SELECT role, state FROM versions WHERE container_id = ? AND item_id = ? AND seq = ?"),
                                         arguments: [container.id, item.description, seq]),
              let role = StoredRole(rawValue: row["role"]) else { return nil }
        return (role, try Codec.decodeState(row["state"] as String))
    }

    func versionSeqs(item: ItemID, role: StoredRole) throws -> [Int64] {
        try Int64.fetchAll(cached("SELECT seq FROM versions WHERE container_id = ? AND item_id = ? AND role = ? ORDER BY seq"),
                           arguments: [container.id, item.description, role.rawValue])
    }

    func earlierVersions(of id: ItemID) throws -> [EarlierVersion] {
        try Row.fetchAll(cached("""
            SELECT seq, role, was_current, retired FROM versions
            WHERE container_id = ? AND item_id = ? AND role IN ('previous', 'discarded')
            """), arguments: [container.id, id.description]).map { row in
            guard let role = StoredRole(rawValue: row["role"]), let retired = row["retired"] as Int64? else {
                throw APIError(.internal, "corrupt earlier version \(row["seq"] as Int64) of item \(id) in the database")
            }
            return EarlierVersion(seq: row["seq"], role: role, wasCurrent: row["was_current"], retired: retired)
        }
    }

    func deleteVersions(item: ItemID, seqs: [Int64], historyFloor: Int64?) throws {
        // Only earlier rows, whatever the caller asks: the current and conflict versions stay.
        for start in stride(from: 0, to: seqs.count, by: 500) {
            let part = seqs[start..<min(start + 500, seqs.count)]
            var args: [any DatabaseValueConvertible] = [container.id, item.description]
            args.append(contentsOf: Array(part))
            let rows = """
                FROM versions WHERE container_id = ? AND item_id = ? AND role IN ('previous', 'discarded')
                  AND seq IN (\(part.map { _ in "?" }.joined(separator: ",")))
                """
            try db.execute(sql: """
                UPDATE containers SET meta_bytes = meta_bytes - (SELECT coalesce(sum(length(CAST(state AS BLOB))), 0) \(rows))
                WHERE id = ?
                """, arguments: StatementArguments(args + [container.id]))
            try db.execute(sql: "DELETE " + rows, arguments: StatementArguments(args))
        }
        if let historyFloor {
            try cached("UPDATE items SET history_floor = max(history_floor, ?) WHERE container_id = ? AND id = ?")
                .execute(arguments: [historyFloor, container.id, item.description])
        }
    }

    func appendJournal(seq: Int64, kind: ChangeKind, item: StoredItem, device: DeviceID) throws {
        let record = try Codec.encode(item.record)
        try cached("INSERT INTO journal(container_id, seq, item_id, kind, device_id, record) VALUES (?, ?, ?, ?, ?, ?)")
            .execute(arguments: [container.id, seq, item.id.description, kind.rawValue, device.description, record])
        metadata.bytes += Int64(record.utf8.count)
    }

    func ownedChunks(_ hashes: [ContentHash]) throws -> [ContentHash: Int64] {
        try SQLiteStore.ownedChunks(db, account: container.accountID, hashes)
    }

    var metadataAdded: Int64 { metadata.bytes }

    func recordMetadata() throws {
        guard metadata.bytes != 0 else { return }
        try cached("UPDATE containers SET meta_bytes = meta_bytes + ? WHERE id = ?").execute(arguments: [metadata.bytes, container.id])
    }

    func accountQuota() throws -> Int64? {
        try Int64.fetchOne(cached("SELECT quota FROM accounts WHERE id = ?"), arguments: [container.accountID])
    }

    func accountUsage() throws -> Int64 {
        try SQLiteStore.usage(db, account: container.accountID)
    }
}

/// One-entry memo of `SQLiteTransaction.encode`; lives for one commit on the writer thread.
final class EncodedStateCache {
    private var value: (ItemState, String)?

    /// The JSON of `state`, reusing the last encoding when the state is the same.
    func encode(_ state: ItemState) throws -> String {
        if let hit = value, hit.0 == state { return hit.1 }
        let text = try Codec.encode(state)
        value = (state, text)
        return text
    }
}
