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

    func firstState(of id: ItemID) throws -> ItemState? {
        guard let row = try Row.fetchOne(cached("""
            SELECT v.state, i.history_floor FROM versions v
            JOIN items i ON i.container_id = v.container_id AND i.id = v.item_id
            WHERE v.container_id = ? AND v.item_id = ? AND v.was_current = 1
            ORDER BY v.seq LIMIT 1
            """), arguments: [container.id, id.description]),
            (row["history_floor"] as Int64) == 0
        else { return nil }
        return try Codec.decodeState(row["state"] as String)
    }

    func currentStatesMade(of id: ItemID, after version: Int64) throws -> [(seq: Int64, by: DeviceID?)] {
        try Row.fetchAll(cached("""
            SELECT v.seq, j.device_id FROM versions v LEFT JOIN journal j ON j.container_id = v.container_id AND j.seq = v.seq
            WHERE v.container_id = ? AND v.item_id = ? AND v.was_current = 1 AND v.seq > ? ORDER BY v.seq
            """), arguments: [container.id, id.description, version]).map { ($0[0] as Int64, ($0[1] as String?).flatMap(DeviceID.init)) }
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

    // MARK: Recently Deleted

    func markTrashed(_ id: ItemID, at time: Int64, by device: DeviceID, bytes: Int64) throws {
        try cached("UPDATE items SET deleted_at = ?, deleted_by = ?, trash_root = id, trash_bytes = ? WHERE container_id = ? AND id = ?")
            .execute(arguments: [time, device.description, bytes, container.id, id.description])
    }

    func adoptTrash(into folder: ItemID, deletedSince since: Int64) throws {
        try cached("""
            UPDATE items SET trash_root = ? WHERE container_id = ? AND deleted = 1 AND trash_root IN (
                SELECT id FROM items WHERE container_id = ? AND parent_id = ? AND deleted = 1 AND trash_root = id
                  AND deleted_at >= ? AND id != ?)
            """).execute(arguments: [folder.description, container.id, container.id, folder.description, since, folder.description])
    }

    func trashRoot(of id: ItemID) throws -> ItemID? {
        try String.fetchOne(cached("SELECT trash_root FROM items WHERE container_id = ? AND id = ?"),
                            arguments: [container.id, id.description]).flatMap(ItemID.init)
    }

    func clearTrash(_ id: ItemID) throws {
        try cached("""
            UPDATE items SET deleted_at = NULL, deleted_by = NULL, trash_root = NULL, trash_bytes = NULL WHERE container_id = ? AND id = ?
            """).execute(arguments: [container.id, id.description])
    }

    func trashMembers(of root: ItemID) throws -> [(id: ItemID, parent: ItemID)] {
        try Row.fetchAll(cached("SELECT id, parent_id FROM items WHERE container_id = ? AND trash_root = ? AND deleted = 1"),
                         arguments: [container.id, root.description]).map { row in
            guard let id = ItemID(row["id"] as String), let parent = ItemID(row["parent_id"] as String) else {
                throw APIError(.internal, "corrupt item id in the database")
            }
            return (id, parent)
        }
    }

    func setTrashRoot(_ ids: [ItemID], to root: ItemID) throws {
        for start in stride(from: 0, to: ids.count, by: 500) {
            let part = ids[start..<min(start + 500, ids.count)]
            var args: [any DatabaseValueConvertible] = [root.description, container.id]
            args.append(contentsOf: part.map(\.description))
            try db.execute(sql: """
                UPDATE items SET trash_root = ? WHERE container_id = ? AND deleted = 1 AND id IN (\(part.map { _ in "?" }.joined(separator: ",")))
                """, arguments: StatementArguments(args))
        }
    }

    private static let trashColumns = """
        SELECT r.id, r.version, r.conflicts, r.state, r.deleted_at, r.deleted_by,
            (SELECT count(*) FROM items m WHERE m.container_id = r.container_id AND m.trash_root = r.id AND m.deleted = 1) AS n,
            (SELECT coalesce(sum(m.trash_bytes), 0) FROM items m WHERE m.container_id = r.container_id AND m.trash_root = r.id AND m.deleted = 1) AS bytes
        FROM items r
        """

    private func trashRow(_ row: Row) throws -> TrashRow {
        guard let by = DeviceID(row["deleted_by"] as String? ?? "") else { throw APIError(.internal, "corrupt deleting device in the database") }
        return TrashRow(item: try SQLiteStore.storedItem(row), deletedAt: row["deleted_at"], deletedBy: by, items: row["n"], bytes: row["bytes"])
    }

    func trashEntries(after: TrashCursor?, limit: Int) throws -> [TrashRow] {
        let rows: [Row]
        if let after {
            rows = try Row.fetchAll(cached(Self.trashColumns + """
                 WHERE r.container_id = ? AND r.trash_root = r.id AND r.deleted = 1 AND (r.deleted_at, r.id) < (?, ?)
                ORDER BY r.deleted_at DESC, r.id DESC LIMIT ?
                """), arguments: [container.id, after.deletedAt, after.id.description, limit])
        } else {
            rows = try Row.fetchAll(cached(Self.trashColumns + """
                 WHERE r.container_id = ? AND r.trash_root = r.id AND r.deleted = 1 ORDER BY r.deleted_at DESC, r.id DESC LIMIT ?
                """), arguments: [container.id, limit])
        }
        return try rows.map(trashRow)
    }

    func trashEntry(_ id: ItemID) throws -> TrashRow? {
        try Row.fetchOne(cached(Self.trashColumns + " WHERE r.container_id = ? AND r.id = ? AND r.trash_root = r.id AND r.deleted = 1"),
                         arguments: [container.id, id.description]).map(trashRow)
    }

    func trashTotals() throws -> TrashTotals {
        let row = try Row.fetchOne(cached("""
            SELECT coalesce(sum(CASE WHEN id = trash_root THEN 1 ELSE 0 END), 0) AS entries, count(*) AS items,
                coalesce(sum(trash_bytes), 0) AS bytes
            FROM items WHERE container_id = ? AND trash_root IS NOT NULL AND deleted = 1
            """), arguments: [container.id])
        return TrashTotals(entries: row?["entries"] ?? 0, items: row?["items"] ?? 0, bytes: row?["bytes"] ?? 0)
    }

    func purgeItems(_ ids: [ItemID]) throws -> Set<ContentHash> {
        var hashes = Set<ContentHash>()
        for start in stride(from: 0, to: ids.count, by: 500) {
            let part = ids[start..<min(start + 500, ids.count)]
            var args: [any DatabaseValueConvertible] = [container.id]
            args.append(contentsOf: part.map(\.description))
            let marks = part.map { _ in "?" }.joined(separator: ",")
            for text in try String.fetchAll(db, sql: "SELECT state FROM versions WHERE container_id = ?1 AND item_id IN (\(marks))",
                                            arguments: StatementArguments(args)) {
                for c in try Codec.decodeState(text).content.chunks { hashes.insert(c.hash) }
            }
            try db.execute(sql: """
                UPDATE containers SET meta_bytes = meta_bytes - (SELECT coalesce(sum(length(CAST(state AS BLOB))), 0)
                    FROM versions WHERE container_id = ?1 AND item_id IN (\(marks)))
                WHERE id = ?1
                """, arguments: StatementArguments(args))
            try db.execute(sql: "DELETE FROM versions WHERE container_id = ?1 AND item_id IN (\(marks))", arguments: StatementArguments(args))
            try db.execute(sql: "DELETE FROM items WHERE container_id = ?1 AND deleted = 1 AND id IN (\(marks))", arguments: StatementArguments(args))
            try db.execute(sql: "INSERT OR IGNORE INTO purged_items(container_id, id) SELECT ?1, value FROM json_each(?2)",
                           arguments: [container.id, "[" + part.map { "\"\($0)\"" }.joined(separator: ",") + "]"])
        }
        return hashes
    }

    func wasPurged(_ id: ItemID) throws -> Bool {
        try Bool.fetchOne(cached("SELECT 1 FROM purged_items WHERE container_id = ? AND id = ?"), arguments: [container.id, id.description]) ?? false
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
