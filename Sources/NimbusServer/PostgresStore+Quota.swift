import NimbusCore
import NimbusProtocol
import PostgresNIO

/// Quotas on PostgreSQL (the rules are in Quotas.swift).
extension PostgresStore {
    /// Bytes the account owns plus those of its uploads under way of chunks it does not own yet
    /// (each chunk once).
    static func usage(_ db: PostgresSync, account: Int64) throws -> Int64 {
        try db.rows("""
            SELECT (SELECT coalesce(sum(size), 0) FROM account_chunks WHERE account_id = \(account))::bigint
                 + (SELECT coalesce(sum(meta_bytes), 0) FROM containers WHERE account_id = \(account))::bigint
                 + (SELECT coalesce(sum(s), 0) FROM (
                       SELECT max(u.size) AS s FROM chunk_uploads u
                       WHERE u.account_id = \(account) AND u.size IS NOT NULL
                         AND NOT EXISTS (SELECT 1 FROM account_chunks c WHERE c.account_id = u.account_id AND c.hash = u.hash)
                       GROUP BY u.hash) AS under_way)::bigint
            """).first?.decode(Int64.self) ?? 0
    }

    static func accountUsage(_ db: PostgresSync, account: String?) throws -> [AccountUsage] {
        try db.rows("""
            SELECT a.id, a.name, a.quota, (SELECT count(*) FROM account_chunks c WHERE c.account_id = a.id),
                   (SELECT coalesce(sum(meta_bytes), 0) FROM containers k WHERE k.account_id = a.id)::bigint,
                   (SELECT coalesce(sum(i.trash_bytes), 0) FROM items i JOIN containers k ON k.id = i.container_id
                    WHERE k.account_id = a.id AND i.deleted AND i.trash_root IS NOT NULL)::bigint
            FROM accounts a WHERE \(account)::text IS NULL OR a.name = \(account) ORDER BY a.name
            """).map { row in
            let (id, name, quota, chunks, metadata, trash) = try row.decode((Int64, String, Int64?, Int64, Int64, Int64).self)
            return AccountUsage(account: name, figures: QuotaFigures(usage: try usage(db, account: id), quota: quota), chunks: chunks,
                                metadata: metadata, trash: trash)
        }
    }

    public func setQuota(account: String, bytes: Int64?) async throws -> AccountUsage {
        if let bytes, !(0...Quotas.maxBytes).contains(bytes) { throw APIError(.badRequest, "a quota is 0…\(Quotas.maxBytes) bytes") }
        return try await write(locking: nil) { db in
            guard !(try db.rows("UPDATE accounts SET quota = \(bytes) WHERE name = \(account) RETURNING id")).isEmpty,
                  let usage = try Self.accountUsage(db, account: account).first else { throw Quotas.unknownAccount(account) }
            return usage
        }
    }

    public func accountUsage(account: String?) async throws -> [AccountUsage] {
        try await write(locking: nil) { db in try Self.accountUsage(db, account: account) }
    }
}
