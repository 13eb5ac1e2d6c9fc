import GRDB
import NimbusCore
import NimbusProtocol

/// Quotas on SQLite (the rules are in Quotas.swift).
extension SQLiteStore {
    /// Bytes the account owns plus those of its uploads under way of chunks it does not own yet
    /// (each chunk once), plus its metadata.
    static func usage(_ db: Database, account: Int64) throws -> Int64 {
        try Int64.fetchOne(db, sql: """
            SELECT (SELECT coalesce(sum(size), 0) FROM account_chunks WHERE account_id = ?1)
                 + (SELECT coalesce(sum(meta_bytes), 0) FROM containers WHERE account_id = ?1)
                 + (SELECT coalesce(sum(s), 0) FROM (
                       SELECT max(u.size) AS s FROM chunk_uploads u
                       WHERE u.account_id = ?1 AND u.size IS NOT NULL
                         AND NOT EXISTS (SELECT 1 FROM account_chunks c WHERE c.account_id = ?1 AND c.hash = u.hash)
                       GROUP BY u.hash))
            """, arguments: [account]) ?? 0
    }

    static func accountUsage(_ db: Database, account: String?) throws -> [AccountUsage] {
        try Row.fetchAll(db, sql: "SELECT id, name, quota FROM accounts WHERE ?1 IS NULL OR name = ?1 ORDER BY name",
                         arguments: [account]).map { row in
            let id: Int64 = row["id"]
            let chunks = try Int64.fetchOne(db, sql: "SELECT count(*) FROM account_chunks WHERE account_id = ?", arguments: [id]) ?? 0
            let metadata = try Int64.fetchOne(db, sql: "SELECT coalesce(sum(meta_bytes), 0) FROM containers WHERE account_id = ?", arguments: [id]) ?? 0
            let trash = try Int64.fetchOne(db, sql: """
                SELECT coalesce(sum(i.trash_bytes), 0) FROM items i JOIN containers c ON c.id = i.container_id
                WHERE c.account_id = ? AND i.deleted = 1 AND i.trash_root IS NOT NULL
                """, arguments: [id]) ?? 0
            return AccountUsage(account: row["name"], figures: QuotaFigures(usage: try usage(db, account: id), quota: row["quota"]),
                                chunks: chunks, metadata: metadata, trash: trash)
        }
    }

    public func setQuota(account: String, bytes: Int64?) async throws -> AccountUsage {
        if let bytes, !(0...Quotas.maxBytes).contains(bytes) { throw APIError(.badRequest, "a quota is 0…\(Quotas.maxBytes) bytes") }
        return try await immediate { db in
            try db.execute(sql: "UPDATE accounts SET quota = ? WHERE name = ?", arguments: [bytes, account])
            guard db.changesCount == 1, let usage = try Self.accountUsage(db, account: account).first else {
                throw Quotas.unknownAccount(account)
            }
            return usage
        }
    }

    public func accountUsage(account: String?) async throws -> [AccountUsage] {
        try await pool.read { db in try Self.accountUsage(db, account: account) }
    }
}
