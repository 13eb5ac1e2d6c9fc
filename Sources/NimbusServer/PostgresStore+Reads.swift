import Foundation
import NimbusCore
import NimbusProtocol
import PostgresNIO

/// Reads. Each is one statement, so it sees one snapshot: a page of the journal and the cursor
/// returned with it always agree (commits to a container are serialized, so any snapshot holds a
/// gap-free prefix of its journal).
extension PostgresStore {
    /// Page reads rank rows by the bytes of the records before them (a window over the rows of
    /// the page's LIMIT), so PostgreSQL sends only rows that start within the page's budget; the
    /// page is then cut exactly by `PageBudget`. A journal or history of large records is never
    /// sent or held whole (ProtocolLimits.maxPageBytes).
    static var budgetBytes: Int64 { Int64(ProtocolLimits.maxPageBytes) }

    public func changes(in container: ContainerRecord, since: Int64, limit: Int) async throws -> ChangesResponse {
        // One row per entry, or one row of NULLs when there is none; each carries the cursor.
        let rows = try await read("""
            SELECT c.cursor, j.seq, j.kind, j.device_id, j.record FROM containers c
            LEFT JOIN LATERAL (
                SELECT seq, kind, device_id, record FROM (
                    SELECT seq, kind, device_id, record,
                           sum(octet_length(record)) OVER (ORDER BY seq) - octet_length(record) AS before
                    FROM (SELECT seq, kind, device_id, record FROM journal
                          WHERE container_id = c.id AND seq > \(since) ORDER BY seq LIMIT \(Int64(limit + 1))) l) w
                WHERE before <= \(Self.budgetBytes)) j ON true
            WHERE c.id = \(container.id) ORDER BY j.seq
            """)
        var cursor: Int64 = 0
        var budget = PageBudget(limit: limit)
        var changes: [Change] = []
        var more = false
        for row in rows {
            let (c, seq, kind, device, record) = try row.decode((Int64, Int64?, String?, String?, String?).self)
            cursor = c
            guard let seq, let kind, let device, let record else { continue }
            guard budget.admit(record.utf8.count) else { more = true; break }
            changes.append(Change(seq: seq, kind: ChangeKind(rawValue: kind) ?? .update,
                                  device: DeviceID(device) ?? DeviceID(UUID()),
                                  item: try Codec.decodeRecord(record)))
        }
        return ChangesResponse(changes: changes, cursor: more ? (changes.last?.seq ?? since) : max(since, cursor), more: more)
    }

    public func items(in container: ContainerRecord, after: ItemID?, limit: Int) async throws -> ItemsResponse {
        let rows = try await read("""
            SELECT c.cursor, i.id, i.version, i.conflicts, i.state FROM containers c
            LEFT JOIN LATERAL (
                SELECT id, version, conflicts, state FROM (
                    SELECT id, version, conflicts, state,
                           sum(octet_length(state)) OVER (ORDER BY id) - octet_length(state) AS before
                    FROM (SELECT id, version, conflicts, state FROM items
                          WHERE container_id = c.id AND NOT deleted AND id > \(after?.description ?? "")
                          ORDER BY id LIMIT \(Int64(limit + 1))) l) w
                WHERE before <= \(Self.budgetBytes)) i ON true
            WHERE c.id = \(container.id) ORDER BY i.id
            """)
        var cursor: Int64 = 0
        var budget = PageBudget(limit: limit)
        var items: [ItemRecord] = []
        var more = false
        for row in rows {
            let (c, id, version, conflicts, state) = try row.decode((Int64, String?, Int64?, Int64?, String?).self)
            cursor = c
            guard let id, let version, let conflicts, let state else { continue }
            guard budget.admit(state.utf8.count) else { more = true; break }
            guard let itemID = ItemID(id) else { throw APIError(.internal, "corrupt item id \(id) in the database") }
            items.append(StoredItem(id: itemID, version: version, conflicts: Int(conflicts), state: try Codec.decodeState(state)).record)
        }
        return ItemsResponse(items: items, cursor: cursor, next: more ? items.last?.id : nil)
    }

    public func children(of folder: ItemID, in container: ContainerRecord, after: String?, limit: Int) async throws -> [ItemRecord] {
        // By bytes: the column's collation is "C", as SQLite orders them.
        try await read("""
            SELECT id, version, conflicts, state FROM items
            WHERE container_id = \(container.id) AND parent_id = \(folder.description) AND NOT deleted
              AND name > \(after ?? "") ORDER BY name LIMIT \(Int64(limit))
            """).map { try Self.storedItem($0).record }
    }

    public func place(of id: ItemID, in container: ContainerRecord) async throws -> ItemPlace? {
        guard let row = try await read("SELECT kind, parent_id, name, deleted FROM items WHERE container_id = \(container.id) AND id = \(id.description)").first else {
            return nil
        }
        let (k, p, name, deleted) = try row.decode((String, String, String, Bool).self)
        guard let kind = ItemKind(rawValue: k), let parent = ItemID(p) else { throw APIError(.internal, "corrupt item row \(id) in the database") }
        return ItemPlace(kind: kind, parent: parent, name: name, deleted: deleted)
    }

    public func containers(account: Int64) async throws -> [String] {
        try await read("SELECT name FROM containers WHERE account_id = \(account) ORDER BY name COLLATE \"C\"").map { try $0.decode(String.self) }
    }

    public func item(_ id: ItemID, in container: ContainerRecord) async throws -> ItemRecord? {
        try await read("SELECT id, version, conflicts, state FROM items WHERE container_id = \(container.id) AND id = \(id.description)")
            .first.map { try Self.storedItem($0).record }
    }

    public func versions(of id: ItemID, in container: ContainerRecord, before: Int64?) async throws -> VersionsResponse {
        let rows = try await read("""
            SELECT seq, role, state, device FROM (
                SELECT seq, role, state, device,
                       sum(octet_length(state)) OVER (ORDER BY seq DESC) - octet_length(state) AS before
                FROM (SELECT v.seq, v.role, v.state, coalesce(d.name, 'unknown device') AS device
                      FROM versions v LEFT JOIN devices d ON d.id = v.device_id
                      WHERE v.container_id = \(container.id) AND v.item_id = \(id.description) AND v.role <> 'discarded'
                            AND v.seq < \(before ?? Int64.max)
                      ORDER BY v.seq DESC LIMIT \(Int64(ProtocolLimits.maxPage + 1))) l) w
            WHERE before <= \(Self.budgetBytes) ORDER BY seq DESC
            """)
        var budget = PageBudget(limit: ProtocolLimits.maxPage)
        var versions: [VersionRecord] = []
        var more = false
        for row in rows {
            let (seq, role, state, device) = try row.decode((Int64, String, String, String).self)
            guard budget.admit(state.utf8.count) else { more = true; break }
            versions.append(VersionRecord(version: seq, role: VersionRole(rawValue: role) ?? .previous, deviceName: device,
                                          state: ItemRecord(id: id, version: seq, state: try Codec.decodeState(state), conflicts: 0)))
        }
        return VersionsResponse(versions: versions, next: more ? versions.last?.version : nil)
    }

    // MARK: chunks

    public func ownedChunks(account: Int64, hashes: [ContentHash]) async throws -> [ContentHash: Int64] {
        try Self.ownedChunks(try await read(Self.ownedChunksQuery(account: account, hashes)))
    }

    static func ownedChunksQuery(account: Int64, _ hashes: [ContentHash], lock: Bool = false) -> PostgresQuery {
        let hexes = Array(Set(hashes.map(\.hex)))
        return lock
            ? "SELECT hash, size FROM account_chunks WHERE account_id = \(account) AND hash = ANY(\(hexes)) FOR KEY SHARE"
            : "SELECT hash, size FROM account_chunks WHERE account_id = \(account) AND hash = ANY(\(hexes))"
    }

    static func ownedChunks(_ rows: [PostgresRow]) throws -> [ContentHash: Int64] {
        var out: [ContentHash: Int64] = [:]
        for row in rows {
            let (hex, size) = try row.decode((String, Int64).self)
            if let h = ContentHash(hex: hex) { out[h] = size }
        }
        return out
    }

    public func referencedChunks() async throws -> Set<ContentHash> {
        var out = Set<ContentHash>()
        for try await text in try await client.query("SELECT state FROM versions", logger: logger).decode(String.self) {
            for c in try Codec.decodeState(text).content.chunks { out.insert(c.hash) }
        }
        return out
    }
}
