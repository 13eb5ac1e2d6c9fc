import Foundation
import GRDB
import NimbusCore
import NimbusProtocol

/// The embedded metadata engine: one SQLite file in WAL mode (GRDB `DatabasePool`: one writer,
/// concurrent readers). Commits are serialized by SQLite's single writer, which is what makes
/// journal sequence allocation gap-free without extra locking.
///
/// Durability: `synchronous = NORMAL` in WAL mode survives a killed process (every committed
/// transaction is in the WAL) but may lose the last transactions on power loss; chunks are fsynced
/// before their rows are written, so a lost transaction leaves at most unreferenced chunks.
public final class SQLiteStore: ServerStore {
    let pool: DatabasePool
    let batcher: WriteBatcher
    /// What commits and resolves prune (`HistoryRetention`).
    public let history: HistoryRetention

    /// Opens (creating if needed) the database at `path` and applies pending migrations.
    public init(path: String, history: HistoryRetention = .default) throws {
        self.history = history
        var config = Configuration()
        config.busyMode = .timeout(10)
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
        }
        do {
            pool = try DatabasePool(path: path, configuration: config)
            try Self.migrator.migrate(pool)
        } catch {
            throw APIError(.unavailable, "cannot open the metadata database \(path): \(error)")
        }
        batcher = WriteBatcher(pool: pool)
    }

    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE accounts (
                    id INTEGER PRIMARY KEY,
                    name TEXT NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 255));
                CREATE TABLE devices (
                    id TEXT PRIMARY KEY,
                    account_id INTEGER NOT NULL REFERENCES accounts(id),
                    name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 255),
                    token_hash TEXT NOT NULL UNIQUE CHECK (length(token_hash) = 64),
                    created INTEGER NOT NULL);
                CREATE TABLE containers (
                    id INTEGER PRIMARY KEY,
                    account_id INTEGER NOT NULL REFERENCES accounts(id),
                    name TEXT NOT NULL,
                    cursor INTEGER NOT NULL DEFAULT 0 CHECK (cursor >= 0),
                    UNIQUE (account_id, name));
                CREATE TABLE items (
                    container_id INTEGER NOT NULL REFERENCES containers(id),
                    id TEXT NOT NULL,
                    parent_id TEXT NOT NULL,
                    name TEXT NOT NULL,
                    kind TEXT NOT NULL CHECK (kind IN ('file', 'folder', 'symlink')),
                    deleted INTEGER NOT NULL CHECK (deleted IN (0, 1)),
                    version INTEGER NOT NULL CHECK (version > 0),
                    conflicts INTEGER NOT NULL CHECK (conflicts >= 0),
                    state TEXT NOT NULL,
                    PRIMARY KEY (container_id, id)) WITHOUT ROWID;
                CREATE UNIQUE INDEX items_live_name ON items(container_id, parent_id, name) WHERE deleted = 0;
                CREATE INDEX items_parent ON items(container_id, parent_id);
                CREATE TABLE versions (
                    container_id INTEGER NOT NULL,
                    item_id TEXT NOT NULL,
                    seq INTEGER NOT NULL CHECK (seq > 0),
                    role TEXT NOT NULL CHECK (role IN ('current', 'previous', 'conflict', 'discarded')),
                    was_current INTEGER NOT NULL CHECK (was_current IN (0, 1)),
                    device_id TEXT NOT NULL,
                    state TEXT NOT NULL,
                    PRIMARY KEY (container_id, item_id, seq),
                    FOREIGN KEY (container_id, item_id) REFERENCES items(container_id, id) DEFERRABLE INITIALLY DEFERRED
                ) WITHOUT ROWID;
                CREATE UNIQUE INDEX versions_one_current ON versions(container_id, item_id) WHERE role = 'current';
                CREATE TABLE journal (
                    container_id INTEGER NOT NULL REFERENCES containers(id),
                    seq INTEGER NOT NULL CHECK (seq > 0),
                    item_id TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    device_id TEXT NOT NULL,
                    record TEXT NOT NULL,
                    PRIMARY KEY (container_id, seq)) WITHOUT ROWID;
                CREATE TABLE account_chunks (
                    account_id INTEGER NOT NULL REFERENCES accounts(id),
                    hash TEXT NOT NULL CHECK (length(hash) = 64),
                    size INTEGER NOT NULL CHECK (size >= 0),
                    PRIMARY KEY (account_id, hash)) WITHOUT ROWID;
                """)
        }
        // History retention: earlier versions record when they were retired (NULL exactly on
        // current and conflict rows), and items remember the newest pruned row that was current.
        // Rows already earlier count as retired now, so they are kept the full --keep-days.
        // SQLite cannot add a CHECK over existing rows, so versions is rebuilt (GRDB turns foreign
        // keys off during a migration and checks them all before committing it).
        m.registerMigration("v2-history") { db in
            try db.execute(sql: """
                CREATE TABLE versions_v2 (
                    container_id INTEGER NOT NULL,
                    item_id TEXT NOT NULL,
                    seq INTEGER NOT NULL CHECK (seq > 0),
                    role TEXT NOT NULL CHECK (role IN ('current', 'previous', 'conflict', 'discarded')),
                    was_current INTEGER NOT NULL CHECK (was_current IN (0, 1)),
                    device_id TEXT NOT NULL,
                    state TEXT NOT NULL,
                    retired INTEGER,
                    CHECK ((role IN ('previous', 'discarded')) = (retired IS NOT NULL)),
                    PRIMARY KEY (container_id, item_id, seq),
                    FOREIGN KEY (container_id, item_id) REFERENCES items(container_id, id) DEFERRABLE INITIALLY DEFERRED
                ) WITHOUT ROWID;
                INSERT INTO versions_v2(container_id, item_id, seq, role, was_current, device_id, state, retired)
                    SELECT container_id, item_id, seq, role, was_current, device_id, state,
                           CASE WHEN role IN ('previous', 'discarded') THEN CAST(strftime('%s', 'now') AS INTEGER) * 1000000000 END
                    FROM versions;
                DROP TABLE versions;
                ALTER TABLE versions_v2 RENAME TO versions;
                CREATE UNIQUE INDEX versions_one_current ON versions(container_id, item_id) WHERE role = 'current';
                ALTER TABLE items ADD COLUMN history_floor INTEGER NOT NULL DEFAULT 0 CHECK (history_floor >= 0);
                """)
        }
        // A revoked device keeps its row (versions and the journal name it); its token stops working.
        m.registerMigration("v3-revoke") { db in
            try db.execute(sql: "ALTER TABLE devices ADD COLUMN revoked INTEGER")
        }
        // One-time pairing codes (hashed); a used or expired code stays until pruned at the next code.
        m.registerMigration("v4-pairing") { db in
            try db.execute(sql: """
                CREATE TABLE pairings (
                    code_hash TEXT PRIMARY KEY,
                    account_id INTEGER NOT NULL REFERENCES accounts(id),
                    device_name TEXT NOT NULL,
                    created_by TEXT NOT NULL,
                    expires INTEGER NOT NULL,
                    used INTEGER
                )
                """)
        }
        // Chunk garbage collection (ChunkCollector): an ownership's lease time, uploads in
        // flight, bodies being deleted; versions by sequence for the sweep's "what is new since
        // the mark". Existing ownerships count as touched now, so nothing goes before a grace
        // period has passed.
        m.registerMigration("v5-chunk-gc") { db in
            try db.execute(sql: """
                ALTER TABLE account_chunks ADD COLUMN touched INTEGER NOT NULL DEFAULT 0;
                UPDATE account_chunks SET touched = CAST(strftime('%s', 'now') AS INTEGER) * 1000000000;
                CREATE INDEX account_chunks_hash ON account_chunks(hash);
                CREATE TABLE chunk_uploads (
                    id INTEGER PRIMARY KEY,
                    hash TEXT NOT NULL CHECK (length(hash) = 64),
                    started INTEGER NOT NULL);
                CREATE INDEX chunk_uploads_hash ON chunk_uploads(hash);
                CREATE TABLE chunk_deletions (
                    hash TEXT PRIMARY KEY CHECK (length(hash) = 64),
                    since INTEGER NOT NULL) WITHOUT ROWID;
                CREATE INDEX versions_seq ON versions(container_id, seq);
                """)
        }
        // Quotas (Quotas.swift): an account's quota in bytes (NULL: none), and the account and
        // size of each upload in flight, which count against it until the upload ends. Uploads
        // recorded before this migration have neither and do not count.
        m.registerMigration("v6-quota") { db in
            try db.execute(sql: """
                ALTER TABLE accounts ADD COLUMN quota INTEGER CHECK (quota IS NULL OR quota >= 0);
                ALTER TABLE chunk_uploads ADD COLUMN account_id INTEGER REFERENCES accounts(id);
                ALTER TABLE chunk_uploads ADD COLUMN size INTEGER CHECK (size IS NULL OR size > 0);
                CREATE INDEX chunk_uploads_account ON chunk_uploads(account_id, hash);
                """)
        }
        // What an account stores in version rows and journal entries counts in its usage
        // (Quotas.swift): per container, in bytes, counted from what is there now.
        m.registerMigration("v7-metadata-usage") { db in
            try db.execute(sql: """
                ALTER TABLE containers ADD COLUMN meta_bytes INTEGER NOT NULL DEFAULT 0;
                UPDATE containers SET meta_bytes =
                    (SELECT coalesce(sum(length(CAST(state AS BLOB))), 0) FROM versions v WHERE v.container_id = containers.id)
                  + (SELECT coalesce(sum(length(CAST(record AS BLOB))), 0) FROM journal j WHERE j.container_id = containers.id);
                """)
        }
        // Recently Deleted (CommitEngine+Trash): when and by whom an item was deleted, the entry
        // it belongs to and its bytes. Items deleted before this migration become entries at
        // its time (they are kept the whole retention from now), grouped under their topmost
        // deleted folder.
        m.registerMigration("v8-trash") { db in
            let now = Int64(Date().timeIntervalSince1970 * 1_000_000_000)
            try db.execute(sql: """
                ALTER TABLE items ADD COLUMN deleted_at INTEGER;
                ALTER TABLE items ADD COLUMN deleted_by TEXT;
                ALTER TABLE items ADD COLUMN trash_root TEXT;
                ALTER TABLE items ADD COLUMN trash_bytes INTEGER;
                UPDATE items SET deleted_at = \(now), deleted_by = json_extract(state, '$.modifiedBy'),
                    trash_bytes = CASE WHEN kind = 'file'
                        THEN (SELECT coalesce(sum(json_extract(value, '$.size')), 0) FROM json_each(items.state, '$.content.chunks'))
                        ELSE 0 END
                WHERE deleted = 1;
                CREATE TEMP TABLE trash_up AS
                    WITH RECURSIVE up(container_id, id, root) AS (
                        SELECT i.container_id, i.id, i.id FROM items i WHERE i.deleted = 1 AND NOT EXISTS
                            (SELECT 1 FROM items p WHERE p.container_id = i.container_id AND p.id = i.parent_id AND p.deleted = 1)
                        UNION
                        SELECT c.container_id, c.id, up.root FROM items c JOIN up ON c.container_id = up.container_id AND c.parent_id = up.id
                        WHERE c.deleted = 1)
                    SELECT container_id, id, root FROM up;
                CREATE INDEX temp.trash_up_id ON trash_up(container_id, id);
                UPDATE items SET trash_root = (SELECT root FROM trash_up u WHERE u.container_id = items.container_id AND u.id = items.id)
                WHERE deleted = 1;
                DROP TABLE trash_up;
                CREATE INDEX items_trash ON items(container_id, trash_root) WHERE trash_root IS NOT NULL;
                CREATE INDEX items_trash_time ON items(container_id, deleted_at, id) WHERE trash_root = id;
                CREATE INDEX items_trash_expiry ON items(deleted_at) WHERE trash_root = id;
                CREATE TABLE purged_items (container_id INTEGER NOT NULL, id TEXT NOT NULL, PRIMARY KEY (container_id, id)) WITHOUT ROWID;
                """)
        }
        // Web view sessions (docs/web.md): when each was last used, for their idle expiry.
        m.registerMigration("v9-web-sessions") { db in
            try db.execute(sql: "ALTER TABLE devices ADD COLUMN web_used INTEGER")
        }
        return m
    }

    // MARK: accounts and devices

    public func addDevice(account: String, deviceName: String, tokenHash: String) async throws -> DeviceRecord {
        guard (1...255).contains(account.utf8.count), (1...255).contains(deviceName.utf8.count) else {
            throw APIError(.badRequest, "account and device names must be 1…255 bytes")
        }
        return try await pool.write { db in
            try db.execute(sql: "INSERT INTO accounts(name) VALUES (?) ON CONFLICT(name) DO NOTHING", arguments: [account])
            let accountID = try Int64.fetchOne(db, sql: "SELECT id FROM accounts WHERE name = ?", arguments: [account])!
            let id = DeviceID(UUID())
            try db.execute(
                sql: "INSERT INTO devices(id, account_id, name, token_hash, created) VALUES (?, ?, ?, ?, ?)",
                arguments: [id.description, accountID, deviceName, tokenHash, Int64(Date().timeIntervalSince1970)])
            return DeviceRecord(id: id, name: deviceName, accountID: accountID, accountName: account)
        }
    }

    public func device(tokenHash: String) async throws -> DeviceRecord? {
        try await pool.read { db in
            guard let row = try Row.fetchOne(db.cachedStatement(sql: """
                SELECT d.id, d.name, d.account_id, a.name AS account FROM devices d JOIN accounts a ON a.id = d.account_id
                WHERE d.token_hash = ? AND d.revoked IS NULL
                """), arguments: [tokenHash]),
                let id = DeviceID(row["id"] as String)
            else { return nil }
            return DeviceRecord(id: id, name: row["name"], accountID: row["account_id"], accountName: row["account"])
        }
    }

    public func revocationMark() async throws -> RevocationMark {
        try await pool.read { db in
            let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT count(revoked), coalesce(max(revoked), 0) FROM devices"))
            return RevocationMark(count: row?[0] ?? 0, latest: row?[1] ?? 0)
        }
    }

    public func devices(account: String?) async throws -> [DeviceListing] {
        try await pool.read { db in try Self.devices(db, account: account) }
    }

    static func devices(_ db: Database, account: String?) throws -> [DeviceListing] {
        try Row.fetchAll(db, sql: """
            SELECT d.id, d.name, a.name AS account, d.created, d.revoked, d.web_used FROM devices d JOIN accounts a ON a.id = d.account_id
            WHERE ? IS NULL OR a.name = ? ORDER BY a.name, d.name, d.id
            """, arguments: [account, account]).compactMap { row in
            guard let id = DeviceID(row["id"] as String) else { return nil }
            return DeviceListing(id: id, name: row["name"], account: row["account"], created: row["created"], revoked: row["revoked"],
                                 webUsed: row["web_used"])
        }
    }

    public func revokeDevice(account: String, device: String, now: Int64) async throws -> DeviceListing {
        try await pool.write { db in
            var d = try Self.devices(db, account: account).one(named: device, account: account)
            if d.revoked == nil {
                try db.execute(sql: "UPDATE devices SET revoked = ? WHERE id = ?", arguments: [now, d.id.description])
                d.revoked = now
            }
            return d
        }
    }

    public func webSession(_ id: DeviceID, _ use: WebSessionUse, now: Int64, idleSeconds: Int64) async throws -> Bool {
        try await pool.write { db in
            if use == .start {
                try db.execute(sql: "UPDATE devices SET web_used = ? WHERE id = ? AND revoked IS NULL", arguments: [now, id.description])
                return true
            }
            guard let row = try Row.fetchOne(db, sql: "SELECT web_used, revoked FROM devices WHERE id = ?", arguments: [id.description]),
                  let used = row["web_used"] as Int64? else { return true }
            if (row["revoked"] as Int64?) != nil { return false }
            if now - used > idleSeconds {
                try db.execute(sql: "UPDATE devices SET revoked = ? WHERE id = ?", arguments: [now, id.description])
                return false
            }
            if use == .use { try db.execute(sql: "UPDATE devices SET web_used = ? WHERE id = ?", arguments: [now, id.description]) }
            return true
        }
    }

    public func addPairing(account: Int64, codeHash: String, deviceName: String, createdBy: DeviceID, expires: Int64) async throws {
        guard (1...255).contains(deviceName.utf8.count) else { throw APIError(.badRequest, "device names must be 1…255 bytes") }
        try await pool.write { db in
            if try Self.nameTaken(db, account: account, deviceName) { throw APIError.deviceNameTaken(deviceName) }
            // Codes a day past their end are of no use to anyone.
            try db.execute(sql: "DELETE FROM pairings WHERE expires < ?", arguments: [expires - PairingLimits.lifetimeSeconds - 86_400])
            try db.execute(sql: "INSERT INTO pairings(code_hash, account_id, device_name, created_by, expires) VALUES (?, ?, ?, ?, ?)",
                           arguments: [codeHash, account, deviceName, createdBy.description, expires])
        }
    }

    public func redeemPairing(codeHash: String, deviceName: String?, tokenHash: String, now: Int64) async throws -> DeviceRecord? {
        if let deviceName, !(1...255).contains(deviceName.utf8.count) { throw APIError(.badRequest, "device names must be 1…255 bytes") }
        return try await pool.write { db in
            guard let row = try Row.fetchOne(db, sql: """
                SELECT p.account_id, p.device_name, a.name AS account FROM pairings p JOIN accounts a ON a.id = p.account_id
                WHERE p.code_hash = ? AND p.used IS NULL AND p.expires >= ?
                """, arguments: [codeHash, now]) else { return nil }
            try db.execute(sql: "UPDATE pairings SET used = ? WHERE code_hash = ?", arguments: [now, codeHash])
            let id = DeviceID(UUID())
            let name = deviceName ?? (row["device_name"] as String)
            let accountID: Int64 = row["account_id"]
            // Refused inside the transaction: the code stays unspent.
            if try Self.nameTaken(db, account: accountID, name) { throw APIError.deviceNameTaken(name) }
            try db.execute(sql: "INSERT INTO devices(id, account_id, name, token_hash, created) VALUES (?, ?, ?, ?, ?)",
                           arguments: [id.description, accountID, name, tokenHash, now])
            return DeviceRecord(id: id, name: name, accountID: accountID, accountName: row["account"])
        }
    }

    /// A device of the account (not revoked) has the name.
    static func nameTaken(_ db: Database, account: Int64, _ name: String) throws -> Bool {
        try Bool.fetchOne(db, sql: "SELECT EXISTS(SELECT 1 FROM devices WHERE account_id = ? AND name = ? AND revoked IS NULL)",
                          arguments: [account, name]) ?? false
    }

    // MARK: containers

    public func container(account: Int64, name: String, create: Bool) async throws -> ContainerRecord? {
        let find: @Sendable (Database) throws -> ContainerRecord? = { db in
            try Int64.fetchOne(db, sql: "SELECT id FROM containers WHERE account_id = ? AND name = ?", arguments: [account, name])
                .map { ContainerRecord(id: $0, accountID: account, name: name) }
        }
        if let found = try await pool.read(find) { return found }
        guard create else { return nil }
        return try await pool.write { db in
            try db.execute(sql: "INSERT INTO containers(account_id, name) VALUES (?, ?) ON CONFLICT DO NOTHING", arguments: [account, name])
            return try find(db)
        }
    }

    public func cursor(of container: ContainerRecord) async throws -> Int64 {
        try await pool.read { db in try Self.cursor(db, container.id) }
    }

    static func cursor(_ db: Database, _ container: Int64) throws -> Int64 {
        try Int64.fetchOne(db.cachedStatement(sql: "SELECT cursor FROM containers WHERE id = ?"), arguments: [container]) ?? 0
    }

    // MARK: commits

    public func commit(_ request: CommitRequest, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> CommitResponse {
        try await batcher.write { db in
            var engine = CommitEngine(tx: SQLiteTransaction(db: db, container: container), device: device, now: now, history: self.history)
            return try engine.commit(request)
        }
    }

    /// In one transaction (group commit), in order, each in its own savepoint.
    public func commitAll(_ requests: [CommitRequest], in container: ContainerRecord, by device: DeviceRecord, now: Int64) async -> [Result<CommitResponse, any Error>] {
        await batcher.writeAll(requests.map { request in
            { @Sendable db in
                var engine = CommitEngine(tx: SQLiteTransaction(db: db, container: container), device: device, now: now, history: self.history)
                return try engine.commit(request)
            }
        })
    }

    public func resolve(_ request: ResolveRequest, item: ItemID, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> CommitResponse {
        try await pool.write { db in
            var engine = CommitEngine(tx: SQLiteTransaction(db: db, container: container), device: device, now: now, history: self.history)
            return try engine.resolve(request, item: item)
        }
    }

    // MARK: Recently Deleted

    public func trash(in container: ContainerRecord, after: TrashCursor?, limit: Int) async throws -> [TrashListed] {
        try await pool.read { db in
            try TrashStore(tx: SQLiteTransaction(db: db, container: container)).entries(after: after, limit: limit)
                .map { TrashListed(row: $0.row, path: $0.path) }
        }
    }

    public func trashTotals(in container: ContainerRecord) async throws -> TrashTotals {
        try await pool.read { db in try SQLiteTransaction(db: db, container: container).trashTotals() }
    }

    public func trashEntry(_ id: ItemID, in container: ContainerRecord) async throws -> TrashListed? {
        try await pool.read { db in
            try TrashStore(tx: SQLiteTransaction(db: db, container: container)).entry(id).map { TrashListed(row: $0.row, path: $0.path, items: $0.items) }
        }
    }

    public func restoreTrash(_ id: ItemID, to folder: ItemID?, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> TrashRestoreResponse {
        try await pool.write { db in
            var engine = CommitEngine(tx: SQLiteTransaction(db: db, container: container), device: device, now: now, history: self.history)
            return try engine.restoreTrash(id, to: folder)
        }
    }

    public func purgeTrash(_ ids: [ItemID]?, in container: ContainerRecord) async throws -> TrashPurgeResponse {
        try await pool.write { db in
            let trash = TrashStore(tx: SQLiteTransaction(db: db, container: container))
            return try trash.purge(ids ?? trash.allEntries())
        }
    }

    public func expireTrash(deletedBefore cutoff: Int64) async throws -> TrashPurgeResponse {
        var total = TrashPurgeResponse(entries: 0, items: 0, bytes: 0)
        while true {
            let due = try await pool.read { db in
                try Row.fetchAll(db, sql: """
                    SELECT c.id AS cid, c.account_id, c.name, i.id FROM items i JOIN containers c ON c.id = i.container_id
                    WHERE i.trash_root = i.id AND i.deleted = 1 AND i.deleted_at < ? ORDER BY i.deleted_at LIMIT 500
                    """, arguments: [cutoff]).map { row -> (ContainerRecord, ItemID) in
                    guard let id = ItemID(row["id"] as String) else { throw APIError(.internal, "corrupt item id in the database") }
                    return (ContainerRecord(id: row["cid"], accountID: row["account_id"], name: row["name"]), id)
                }
            }
            if due.isEmpty { return total }
            try await purgeDue(due, into: &total)
        }
    }

    public func purgeOldestTrash(account: Int64, bytes: Int64) async throws -> (response: TrashPurgeResponse, chunks: Set<ContentHash>) {
        try await pool.write { db in
            var total = TrashPurgeResponse(entries: 0, items: 0, bytes: 0)
            var chunks = Set<ContentHash>()
            let oldest = try Row.fetchCursor(db, sql: """
                SELECT c.id AS cid, c.name, i.id FROM items i JOIN containers c ON c.id = i.container_id
                WHERE c.account_id = ? AND i.trash_root = i.id AND i.deleted = 1 ORDER BY i.deleted_at, i.id
                """, arguments: [account])
            var due: [(ContainerRecord, ItemID)] = []
            while let row = try oldest.next() {
                guard let id = ItemID(row["id"] as String) else { throw APIError(.internal, "corrupt item id in the database") }
                due.append((ContainerRecord(id: row["cid"], accountID: account, name: row["name"]), id))
                if due.count >= 10_000 { break }
            }
            for (container, id) in due where total.entries == 0 || total.bytes < bytes {
                let r = try TrashStore(tx: SQLiteTransaction(db: db, container: container)).purgeWithChunks([id])
                total.entries += r.response.entries
                total.items += r.response.items
                total.bytes += r.response.bytes
                chunks.formUnion(r.chunks)
            }
            return (total, chunks)
        }
    }

    // MARK: reads

    public func changes(in container: ContainerRecord, since: Int64, limit: Int) async throws -> ChangesResponse {
        try await pool.read { db in
            // Read a row at a time and stop at the page's budget: a journal of large records
            // is never held whole (ProtocolLimits.maxPageBytes).
            let rows = try Row.fetchCursor(db.cachedStatement(sql: """
                SELECT seq, kind, device_id, record FROM journal WHERE container_id = ? AND seq > ? ORDER BY seq LIMIT ?
                """), arguments: [container.id, since, limit + 1])
            var budget = PageBudget(limit: limit)
            var changes: [Change] = []
            var more = false
            while let row = try rows.next() {
                let record: String = row["record"]
                guard budget.admit(record.utf8.count) else { more = true; break }
                changes.append(Change(seq: row["seq"], kind: ChangeKind(rawValue: row["kind"]) ?? .update,
                                      device: DeviceID(row["device_id"] as String) ?? DeviceID(UUID()),
                                      item: try Codec.decodeRecord(record)))
            }
            let cursor = more ? (changes.last?.seq ?? since) : max(since, try Self.cursor(db, container.id))
            return ChangesResponse(changes: changes, cursor: cursor, more: more)
        }
    }

    public func items(in container: ContainerRecord, after: ItemID?, limit: Int) async throws -> ItemsResponse {
        try await pool.read { db in
            let rows = try Row.fetchCursor(db.cachedStatement(sql: """
                SELECT id, version, conflicts, state FROM items
                WHERE container_id = ? AND deleted = 0 AND id > ? ORDER BY id LIMIT ?
                """), arguments: [container.id, after?.description ?? "", limit + 1])
            var budget = PageBudget(limit: limit)
            var items: [ItemRecord] = []
            var more = false
            while let row = try rows.next() {
                guard budget.admit((row["state"] as String).utf8.count) else { more = true; break }
                items.append(try Self.storedItem(row).record)
            }
            return ItemsResponse(items: items, cursor: try Self.cursor(db, container.id), next: more ? items.last?.id : nil)
        }
    }

    public func children(of folder: ItemID, in container: ContainerRecord, after: String?, limit: Int) async throws -> [ItemRecord] {
        try await pool.read { db in
            // Ordered as the live-name index is (BINARY: by bytes), which serves the query.
            let rows = try Row.fetchCursor(db.cachedStatement(sql: """
                SELECT id, version, conflicts, state FROM items
                WHERE container_id = ? AND parent_id = ? AND deleted = 0 AND name > ? ORDER BY name LIMIT ?
                """), arguments: [container.id, folder.description, after ?? "", limit])
            var items: [ItemRecord] = []
            while let row = try rows.next() { items.append(try Self.storedItem(row).record) }
            return items
        }
    }

    public func place(of id: ItemID, in container: ContainerRecord) async throws -> ItemPlace? {
        try await pool.read { db in
            guard let row = try Row.fetchOne(db.cachedStatement(sql: "SELECT kind, parent_id, name, deleted FROM items WHERE container_id = ? AND id = ?"),
                                             arguments: [container.id, id.description]) else { return nil }
            guard let kind = ItemKind(rawValue: row["kind"]), let parent = ItemID(row["parent_id"] as String) else {
                throw APIError(.internal, "corrupt item row \(id) in the database")
            }
            return ItemPlace(kind: kind, parent: parent, name: row["name"], deleted: row["deleted"])
        }
    }

    public func containers(account: Int64) async throws -> [String] {
        try await pool.read { db in
            try String.fetchAll(db, sql: "SELECT name FROM containers WHERE account_id = ? ORDER BY name", arguments: [account])
        }
    }

    public func item(_ id: ItemID, in container: ContainerRecord) async throws -> ItemRecord? {
        try await pool.read { db in
            try SQLiteTransaction(db: db, container: container).loadItem(id)?.record
        }
    }

    public func versions(of id: ItemID, in container: ContainerRecord, before: Int64?) async throws -> VersionsResponse {
        try await pool.read { db in
            let rows = try Row.fetchCursor(db.cachedStatement(sql: """
                SELECT v.seq, v.role, v.state, coalesce(d.name, 'unknown device') AS device
                FROM versions v LEFT JOIN devices d ON d.id = v.device_id
                WHERE v.container_id = ? AND v.item_id = ? AND v.role != 'discarded' AND v.seq < ? ORDER BY v.seq DESC LIMIT ?
                """), arguments: [container.id, id.description, before ?? Int64.max, ProtocolLimits.maxPage + 1])
            var budget = PageBudget(limit: ProtocolLimits.maxPage)
            var versions: [VersionRecord] = []
            var more = false
            while let row = try rows.next() {
                let text: String = row["state"]
                guard budget.admit(text.utf8.count) else { more = true; break }
                let state = try Codec.decodeState(text)
                versions.append(VersionRecord(version: row["seq"], role: VersionRole(rawValue: row["role"]) ?? .previous,
                                              deviceName: row["device"], state: ItemRecord(id: id, version: row["seq"], state: state, conflicts: 0)))
            }
            return VersionsResponse(versions: versions, next: more ? versions.last?.version : nil)
        }
    }

    // MARK: chunks

    public func ownedChunks(account: Int64, hashes: [ContentHash]) async throws -> [ContentHash: Int64] {
        try await pool.read { db in try Self.ownedChunks(db, account: account, hashes) }
    }

    static func ownedChunks(_ db: Database, account: Int64, _ hashes: [ContentHash]) throws -> [ContentHash: Int64] {
        var out: [ContentHash: Int64] = [:]
        let unique = Array(Set(hashes))
        for start in stride(from: 0, to: unique.count, by: 500) {
            let part = unique[start..<min(start + 500, unique.count)]
            let marks = part.map { _ in "?" }.joined(separator: ",")
            var args: [any DatabaseValueConvertible] = [account]
            args.append(contentsOf: part.map(\.hex))
            for row in try Row.fetchAll(db, sql: "SELECT hash, size FROM account_chunks WHERE account_id = ? AND hash IN (\(marks))",
                                        arguments: StatementArguments(args)) {
                if let h = ContentHash(hex: row["hash"]) { out[h] = row["size"] }
            }
        }
        return out
    }

    static func storedItem(_ row: Row) throws -> StoredItem {
        guard let id = ItemID(row["id"] as String) else { throw APIError(.internal, "corrupt item id in the database") }
        return StoredItem(id: id, version: row["version"], conflicts: row["conflicts"],
                          state: try Codec.decodeState(row["state"] as String))
    }
}

/// JSON for the state columns. Sorted keys so equal states store equal text.
enum Codec {
    static func encode(_ value: some Encodable) throws -> String {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: try e.encode(value), as: UTF8.self)
    }
    /// The stored forms written most (every commit), by hand (`FastJSON`).
    static func encode(_ state: ItemState) throws -> String { FastJSON.encode(state) }
    static func encode(_ record: ItemRecord) throws -> String { FastJSON.encode(record: record) }
    static func decode<T: Decodable>(_ type: T.Type, _ text: String) throws -> T {
        try JSONDecoder().decode(type, from: Data(text.utf8))
    }
    /// A journal record (read for every change a device is sent): the hand-written reader,
    /// `JSONDecoder` as its fallback.
    static func decodeRecord(_ text: String) throws -> ItemRecord {
        try FastJSON.decodeItemRecord(text)
    }
    /// A stored state: the hand-written reader (read for every listed item), `JSONDecoder` as
    /// its fallback.
    static func decodeState(_ text: String) throws -> ItemState {
        try FastJSON.decodeItemState(text)
    }
}
