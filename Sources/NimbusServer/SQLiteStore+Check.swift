import GRDB
import NimbusCore

extension SQLiteStore {
    /// Checks the invariants a crash must never break: the journal of each container has no gaps
    /// and ends at its cursor; every item has exactly one current version equal to its row; every
    /// item's version is its last journal entry; conflict counts match; live items live in live folders;
    /// history pruning never reached the current version (earlier versions may have gaps: pruned);
    /// every chunk a version refers to is owned by its container's account (what commits check and
    /// the garbage collector keeps); no chunk being deleted is owned by an account.
    public func consistencyProblems() async throws -> [String] {
        try await pool.read { db in
            var problems: [String] = []
            for row in try Row.fetchAll(db, sql: """
                SELECT c.id, c.cursor, count(j.seq) AS n, coalesce(min(j.seq), 0) AS lo, coalesce(max(j.seq), 0) AS hi
                FROM containers c LEFT JOIN journal j ON j.container_id = c.id GROUP BY c.id
                """) {
                let cursor: Int64 = row["cursor"], n: Int64 = row["n"], lo: Int64 = row["lo"], hi: Int64 = row["hi"]
                if n != cursor || hi != cursor || (n > 0 && lo != 1) {
                    problems.append("container \(row["id"] as Int64): cursor \(cursor) but journal has \(n) entries \(lo)…\(hi)")
                }
            }
            for row in try Row.fetchAll(db, sql: """
                SELECT c.id, c.meta_bytes,
                  (SELECT coalesce(sum(length(CAST(state AS BLOB))), 0) FROM versions v WHERE v.container_id = c.id)
                  + (SELECT coalesce(sum(length(CAST(record AS BLOB))), 0) FROM journal j WHERE j.container_id = c.id) AS actual
                FROM containers c
                """) where (row["meta_bytes"] as Int64) != (row["actual"] as Int64) {
                problems.append("container \(row["id"] as Int64): metadata counted as \(row["meta_bytes"] as Int64) bytes, but its versions and journal hold \(row["actual"] as Int64)")
            }
            for row in try Row.fetchAll(db, sql: """
                SELECT i.container_id, i.id, i.version, i.conflicts, i.state, i.deleted, i.parent_id, i.kind, i.history_floor,
                  (SELECT state FROM versions v WHERE v.container_id = i.container_id AND v.item_id = i.id AND v.role = 'current') AS cur,
                  (SELECT seq FROM versions v WHERE v.container_id = i.container_id AND v.item_id = i.id AND v.role = 'current') AS cur_seq,
                  (SELECT count(*) FROM versions v WHERE v.container_id = i.container_id AND v.item_id = i.id AND v.role = 'conflict') AS nconf,
                  (SELECT max(seq) FROM journal j WHERE j.container_id = i.container_id AND j.item_id = i.id) AS last,
                  (SELECT p.deleted FROM items p WHERE p.container_id = i.container_id AND p.id = i.parent_id) AS parent_deleted,
                  (SELECT p.kind FROM items p WHERE p.container_id = i.container_id AND p.id = i.parent_id) AS parent_kind
                FROM items i
                """) {
                let id: String = row["id"]
                let cur: String? = row["cur"]
                if cur == nil { problems.append("item \(id): no current version") }
                else if cur != (row["state"] as String) { problems.append("item \(id): current version differs from the item row") }
                if (row["last"] as Int64?) != (row["version"] as Int64) { problems.append("item \(id): version is not its last journal entry") }
                if (row["nconf"] as Int64) != (row["conflicts"] as Int64) { problems.append("item \(id): conflict count does not match its conflict versions") }
                if let curSeq = row["cur_seq"] as Int64?, (row["history_floor"] as Int64) >= curSeq {
                    problems.append("item \(id): history pruned up to \(row["history_floor"] as Int64), past its current version \(curSeq)")
                }
                let parent: String = row["parent_id"]
                if (row["deleted"] as Int64) == 0, parent != ItemID.root.description {
                    if (row["parent_kind"] as String?) != "folder" { problems.append("item \(id): parent \(parent) is not a folder") }
                    else if (row["parent_deleted"] as Int64?) != 0 { problems.append("item \(id): live inside deleted folder \(parent)") }
                }
            }
            // A purged item (Recently Deleted) leaves its journal entries, the last a delete.
            let orphans = try Int64.fetchOne(db, sql: """
                SELECT count(*) FROM journal j WHERE NOT EXISTS (SELECT 1 FROM items i WHERE i.container_id = j.container_id AND i.id = j.item_id)
                  AND (SELECT l.kind FROM journal l WHERE l.container_id = j.container_id AND l.item_id = j.item_id ORDER BY l.seq DESC LIMIT 1) != 'delete'
                """) ?? 0
            if orphans > 0 { problems.append("\(orphans) journal entries name items that do not exist and were not purged after a delete") }
            // Recently Deleted: every deleted item belongs to an entry whose root is deleted and
            // its own root; a live item belongs to none.
            let trash = try Row.fetchAll(db, sql: """
                SELECT i.id, i.deleted, i.trash_root, r.deleted AS root_deleted, r.trash_root AS root_root FROM items i
                LEFT JOIN items r ON r.container_id = i.container_id AND r.id = i.trash_root
                WHERE (i.deleted = 1 AND (i.trash_root IS NULL OR r.id IS NULL OR r.deleted = 0 OR r.trash_root != r.id OR i.deleted_at IS NULL))
                   OR (i.deleted = 0 AND (i.trash_root IS NOT NULL OR i.deleted_at IS NOT NULL))
                LIMIT 20
                """)
            for row in trash {
                problems.append("item \(row["id"] as String): \((row["deleted"] as Int64) == 1 ? "deleted but not in a Recently Deleted entry (root \(row["trash_root"] as String? ?? "none"))" : "live but still marked deleted")")
            }
            var owned = Set<ChunkOwnership>()
            for row in try Row.fetchAll(db, sql: "SELECT account_id, hash FROM account_chunks") {
                owned.insert(ChunkOwnership(account: row["account_id"], hash: row["hash"]))
            }
            var unowned = UnownedChunks()
            let versions = try Row.fetchCursor(db, sql: """
                SELECT c.account_id, v.item_id, v.seq, v.state FROM versions v JOIN containers c ON c.id = v.container_id
                """)
            while let row = try versions.next() {
                let account: Int64 = row["account_id"]
                for c in try Codec.decodeState(row["state"] as String).content.chunks
                where !owned.contains(ChunkOwnership(account: account, hash: c.hash.hex)) {
                    unowned.add(item: row["item_id"], seq: row["seq"], hash: c.hash, account: account)
                }
            }
            problems += unowned.problems
            let doomedOwned = try Int64.fetchOne(db, sql: """
                SELECT count(*) FROM chunk_deletions d WHERE EXISTS (SELECT 1 FROM account_chunks a WHERE a.hash = d.hash)
                """) ?? 0
            if doomedOwned > 0 { problems.append("\(doomedOwned) chunk(s) being deleted are owned by an account") }
            return problems
        }
    }
}
