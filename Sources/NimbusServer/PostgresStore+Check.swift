import NimbusCore
import PostgresNIO

extension PostgresStore {
    /// The same invariants `SQLiteStore.consistencyProblems` checks: gap-free journals ending at
    /// their cursors, one current version equal to each item row, item versions matching their last
    /// journal entry, conflict counts, live items inside live folders, no orphan journal entries,
    /// history pruning never reached the current version, every chunk a version refers to owned by
    /// its container's account, no chunk being deleted that an account owns.
    /// Runs in one REPEATABLE READ transaction so concurrent commits cannot produce false alarms.
    public func consistencyProblems() async throws -> [String] {
        try await write(locking: nil) { db in
            try db.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            var problems: [String] = []
            for row in try db.rows("""
                SELECT c.id, c.cursor, count(j.seq), coalesce(min(j.seq), 0), coalesce(max(j.seq), 0)
                FROM containers c LEFT JOIN journal j ON j.container_id = c.id GROUP BY c.id
                """) {
                let (id, cursor, n, lo, hi) = try row.decode((Int64, Int64, Int64, Int64, Int64).self)
                if n != cursor || hi != cursor || (n > 0 && lo != 1) {
                    problems.append("container \(id): cursor \(cursor) but journal has \(n) entries \(lo)…\(hi)")
                }
            }
            for row in try db.rows("""
                SELECT c.id, c.meta_bytes,
                  (SELECT coalesce(sum(octet_length(v.state)), 0) FROM versions v WHERE v.container_id = c.id)::bigint
                  + (SELECT coalesce(sum(octet_length(j.record)), 0) FROM journal j WHERE j.container_id = c.id)::bigint
                FROM containers c
                """) {
                let (id, counted, actual) = try row.decode((Int64, Int64, Int64).self)
                if counted != actual {
                    problems.append("container \(id): metadata counted as \(counted) bytes, but its versions and journal hold \(actual)")
                }
            }
            for row in try db.rows("""
                SELECT i.id, i.version, i.conflicts, i.state, i.deleted, i.parent_id, i.history_floor,
                  (SELECT state FROM versions v WHERE v.container_id = i.container_id AND v.item_id = i.id AND v.role = 'current'),
                  (SELECT seq FROM versions v WHERE v.container_id = i.container_id AND v.item_id = i.id AND v.role = 'current'),
                  (SELECT count(*) FROM versions v WHERE v.container_id = i.container_id AND v.item_id = i.id AND v.role = 'conflict'),
                  (SELECT max(seq) FROM journal j WHERE j.container_id = i.container_id AND j.item_id = i.id),
                  (SELECT p.deleted FROM items p WHERE p.container_id = i.container_id AND p.id = i.parent_id),
                  (SELECT p.kind FROM items p WHERE p.container_id = i.container_id AND p.id = i.parent_id)
                FROM items i
                """) {
                let (id, version, conflicts, state, deleted, parent, floor, cur, curSeq, nconf, last, parentDeleted, parentKind) =
                    try row.decode((String, Int64, Int64, String, Bool, String, Int64, String?, Int64?, Int64, Int64?, Bool?, String?).self)
                if cur == nil { problems.append("item \(id): no current version") }
                else if cur != state { problems.append("item \(id): current version differs from the item row") }
                if last != version { problems.append("item \(id): version is not its last journal entry") }
                if nconf != conflicts { problems.append("item \(id): conflict count does not match its conflict versions") }
                if let curSeq, floor >= curSeq { problems.append("item \(id): history pruned up to \(floor), past its current version \(curSeq)") }
                if !deleted, parent != ItemID.root.description {
                    if parentKind != "folder" { problems.append("item \(id): parent \(parent) is not a folder") }
                    else if parentDeleted != false { problems.append("item \(id): live inside deleted folder \(parent)") }
                }
            }
            // A purged item (Recently Deleted) leaves its journal entries, the last a delete.
            let orphans = try db.rows("""
                SELECT count(*) FROM journal j WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.container_id = j.container_id AND i.id = j.item_id)
                  AND (SELECT l.kind FROM journal l WHERE l.container_id = j.container_id AND l.item_id = j.item_id ORDER BY l.seq DESC LIMIT 1) <> 'delete'
                """).first?.decode(Int64.self) ?? 0
            if orphans > 0 { problems.append("\(orphans) journal entries name items that do not exist and were not purged after a delete") }
            // Recently Deleted: every deleted item belongs to an entry whose root is deleted and
            // its own root; a live item belongs to none.
            for row in try db.rows("""
                SELECT i.id, i.deleted FROM items i
                LEFT JOIN items r ON r.container_id = i.container_id AND r.id = i.trash_root
                WHERE (i.deleted AND (i.trash_root IS NULL OR r.id IS NULL OR NOT r.deleted OR r.trash_root <> r.id OR i.deleted_at IS NULL))
                   OR (NOT i.deleted AND (i.trash_root IS NOT NULL OR i.deleted_at IS NOT NULL))
                LIMIT 20
                """) {
                let (id, deleted) = try row.decode((String, Bool).self)
                problems.append("item \(id): \(deleted ? "deleted but not in a Recently Deleted entry" : "live but still marked deleted")")
            }
            var owned = Set<ChunkOwnership>()
            for row in try db.rows("SELECT account_id, hash FROM account_chunks") {
                let (account, hash) = try row.decode((Int64, String).self)
                owned.insert(ChunkOwnership(account: account, hash: hash))
            }
            var unowned = UnownedChunks()
            for row in try db.rows("SELECT c.account_id, v.item_id, v.seq, v.state FROM versions v JOIN containers c ON c.id = v.container_id") {
                let (account, item, seq, state) = try row.decode((Int64, String, Int64, String).self)
                for c in try Codec.decodeState(state).content.chunks where !owned.contains(ChunkOwnership(account: account, hash: c.hash.hex)) {
                    unowned.add(item: item, seq: seq, hash: c.hash, account: account)
                }
            }
            problems += unowned.problems
            let doomedOwned = try db.rows("""
                SELECT count(*) FROM chunk_deletions d WHERE EXISTS (SELECT 1 FROM account_chunks a WHERE a.hash = d.hash)
                """).first?.decode(Int64.self) ?? 0
            if doomedOwned > 0 { problems.append("\(doomedOwned) chunk(s) being deleted are owned by an account") }
            return problems
        }
    }
}
