import Foundation
import GRDB
import NimbusCore

/// What the sync engine keeps per item: the server state it last synced (the base of its next
/// commit) and which chunks of it are in the cache file.
public struct SyncBase: Sendable, Equatable {
    public var id: ItemID
    /// The server version `record` has (the next commit's `baseVersion`).
    public var version: Int64
    /// The server's item record, encoded by the engine (LocalStore does not know the wire types).
    public var record: Data
    /// One byte per chunk of `record`: 1 when the chunk's bytes are in the cache file.
    /// `nil`: the whole file is present (created or fully downloaded here).
    public var present: [UInt8]?
    public init(id: ItemID, version: Int64, record: Data, present: [UInt8]?) {
        self.id = id; self.version = version; self.record = record; self.present = present
    }
}

/// What happened to an item, as its upload-queue entry records it (the `kind` column of
/// `sync_op`, stored as the raw value).
public enum SyncOpKind: String, Sendable, Equatable, CaseIterable {
    case created
    case content
    case moved
    /// Mode or times set on purpose (`chmod`, `touch -d`, `cp -p`): a time alone is committed.
    case attributes
    case deleted
}

/// One queued upload: the item and what happened to it, in the order it happened. `kind` is nil
/// for a kind this version does not know (written by a newer one): the item is pushed whole
/// anyway, so nothing depends on it.
public struct SyncOp: Sendable, Equatable {
    public var seq: Int64
    public var item: ItemID
    public var kind: SyncOpKind?
}

// The engine's tables are written directly (a short transaction each), not through the
// write-behind queue: the engine runs off the FUSE threads and needs its writes done when the
// call returns (a base saved before the next commit reads it). Upload-queue entries are the
// exception: they go through `enqueue(.syncOp)` so they commit with the change that caused them.
// While the queue fails (a full disk), these writes join it instead (`LocalStore.write`): a base
// or cursor is never on disk ahead of the tree changes it describes.
extension LocalStore {
    public func syncBases() throws -> [ItemID: SyncBase] {
        try pool.read { db in
            var out: [ItemID: SyncBase] = [:]
            let rows = try Row.fetchCursor(db, sql: "SELECT id, version, record, present FROM sync_item")
            while let r = try rows.next() {
                guard let id = ItemID(r[0] as String) else { continue }
                out[id] = SyncBase(id: id, version: r[1], record: r[2], present: (r[3] as Data?).map { [UInt8]($0) })
            }
            return out
        }
    }

    public func saveSyncBase(_ b: SyncBase) throws {
        try write { db in
            try db.execute(sql: """
                INSERT INTO sync_item (id, version, record, present) VALUES (?, ?, ?, ?)
                ON CONFLICT(id) DO UPDATE SET version = excluded.version, record = excluded.record, present = excluded.present
                """, arguments: [b.id.description, b.version, b.record, b.present.map { Data($0) }])
        }
    }

    /// Saves and removes many bases in one transaction (a first sync writes one per item).
    public func saveSyncBases(_ bases: [SyncBase], removing gone: [ItemID] = []) throws {
        guard !bases.isEmpty || !gone.isEmpty else { return }
        try write { db in
            let upsert = try db.cachedStatement(sql: """
                INSERT INTO sync_item (id, version, record, present) VALUES (?, ?, ?, ?)
                ON CONFLICT(id) DO UPDATE SET version = excluded.version, record = excluded.record, present = excluded.present
                """)
            for b in bases {
                try upsert.execute(arguments: [b.id.description, b.version, b.record, b.present.map { Data($0) }])
            }
            let delete = try db.cachedStatement(sql: "DELETE FROM sync_item WHERE id = ?")
            for id in gone { try delete.execute(arguments: [id.description]) }
        }
    }

    /// Saves only which chunks of an item's base are present, if the base is still `version`
    /// (each downloaded chunk: the record itself does not change, so it is not written again).
    public func saveSyncPresence(_ id: ItemID, version: Int64, present: [UInt8]?) throws {
        try write { db in
            try db.cachedStatement(sql: "UPDATE sync_item SET present = ? WHERE id = ? AND version = ?")
                .execute(arguments: [present.map { Data($0) }, id.description, version])
        }
    }

    public func removeSyncBase(_ id: ItemID) throws {
        try write { try $0.execute(sql: "DELETE FROM sync_item WHERE id = ?", arguments: [id.description]) }
    }

    /// The upload queue, oldest first (committed entries only: call `sync()` first for all).
    public func syncOps() throws -> [SyncOp] {
        try pool.read { db in
            try Row.fetchAll(db, sql: "SELECT seq, item, kind FROM sync_op ORDER BY seq").compactMap { r in
                ItemID(r[1] as String).map { SyncOp(seq: r[0], item: $0, kind: SyncOpKind(rawValue: r[2])) }
            }
        }
    }

    /// Drops the queue entries of `item` up to `seq` (they are committed on the server).
    public func removeSyncOps(_ item: ItemID, upTo seq: Int64) throws {
        try write { try $0.cachedStatement(sql: "DELETE FROM sync_op WHERE item = ? AND seq <= ?").execute(arguments: [item.description, seq]) }
    }

    /// Items that exist locally but were never synced (their queue entries may have been lost
    /// in the last milliseconds before a crash): the engine queues them again at start.
    public func unsyncedItems() throws -> [ItemID] {
        try pool.read { db in
            try String.fetchAll(db, sql: """
                SELECT id FROM item WHERE parent IS NOT NULL AND id NOT IN (SELECT id FROM sync_item)
                """).compactMap(ItemID.init)
        }
    }

    public func meta(_ key: String) throws -> String? {
        // One statement reads a consistent state: no transaction around it (here and below).
        try pool.unsafeRead { try String.fetchOne($0.cachedStatement(sql: "SELECT value FROM meta WHERE key = ?"), arguments: [key]) }
    }

    public func setMeta(_ key: String, _ value: String) throws {
        try write {
            try $0.cachedStatement(sql: "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
                .execute(arguments: [key, value])
        }
    }
}

extension LocalStore {
    /// The newest committed queue entry of `item` (nil: none).
    public func lastSyncOpSeq(_ item: ItemID) throws -> Int64? {
        try pool.unsafeRead { try Int64.fetchOne($0.cachedStatement(sql: "SELECT MAX(seq) FROM sync_op WHERE item = ?"), arguments: [item.description]) }
    }

    /// Whether a committed queue entry of `item` has this kind.
    public func hasSyncOp(_ item: ItemID, kind: SyncOpKind) throws -> Bool {
        try pool.unsafeRead { try Bool.fetchOne($0.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM sync_op WHERE item = ? AND kind = ?)"),
                                                arguments: [item.description, kind.rawValue]) ?? false }
    }
}

extension LocalStore {
    /// The items pinned on this device (explicitly; folders pin what is below them).
    public func pins() throws -> Set<ItemID> {
        try pool.read { Set(try String.fetchAll($0, sql: "SELECT id FROM sync_pin").compactMap(ItemID.init)) }
    }

    public func setPinned(_ id: ItemID, _ on: Bool) throws {
        try write { db in
            if on {
                try db.execute(sql: "INSERT OR IGNORE INTO sync_pin (id) VALUES (?)", arguments: [id.description])
            } else {
                try db.execute(sql: "DELETE FROM sync_pin WHERE id = ?", arguments: [id.description])
            }
        }
    }
}
