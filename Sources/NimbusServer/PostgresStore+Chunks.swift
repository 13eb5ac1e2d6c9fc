import NimbusCore
import PostgresNIO

/// Chunk ownership, uploads and the garbage collector's primitives on PostgreSQL, shared by any
/// number of instances. Three kinds of lock keep them apart (the procedure and why it cannot race
/// are in ChunkCollector.swift):
/// - a commit reads its chunks' ownerships `FOR KEY SHARE` (PostgresTransaction.ownedChunks); the
///   sweep takes ownerships `FOR UPDATE SKIP LOCKED`, so it never deletes one a commit in flight
///   relies on, and never waits (no deadlock with commits);
/// - uploads and the sweep's decision to delete a chunk's bytes take a transaction-scoped
///   advisory lock on the chunk's hash (`hashLock`; the sweep only tries it, and leaves the
///   chunk for the next run when it is taken);
/// - one collector at a time across all instances: a session advisory lock held for the run.
/// Lock order: an upload takes its hash's lock, then (beginning one of a chunk it does not own)
/// its account's row for the quota, or (ending) its ownership row; a commit takes
/// ownership rows only; the sweep takes ownership rows, then hash locks, but only ever tries
/// (`SKIP LOCKED`, `pg_try_advisory_xact_lock`), so it never waits and no cycle can form.
extension PostgresStore {
    /// Advisory lock class of chunk hashes (the two-key form; the migration and collector locks
    /// use the one-key form, a separate key space).
    static let chunkLockClass: Int32 = 0x6e63
    /// The one-key advisory lock held by the running collector ("nimbgc").
    static let collectorLock: Int64 = 0x6e696d626763

    /// The hash's advisory lock key: its first 32 bits (collisions only serialize more).
    static func hashKey(_ hash: ContentHash) -> Int32 {
        Int32(bitPattern: UInt32(hash.hex.prefix(8), radix: 16) ?? 0)
    }

    static func lockHash(_ db: PostgresSync, _ hash: ContentHash) throws {
        try db.exec("SELECT pg_advisory_xact_lock(\(chunkLockClass), \(hashKey(hash)))")
    }

    static func refuseIfDeleting(_ db: PostgresSync, _ hash: ContentHash) throws {
        if !(try db.rows("SELECT 1 FROM chunk_deletions WHERE hash = \(hash.hex)")).isEmpty { throw APIError.chunkBeingFreed(hash) }
    }

    static func own(_ db: PostgresSync, account: Int64, hash: ContentHash, size: Int64, now: Int64) throws {
        try db.exec("""
            INSERT INTO account_chunks(account_id, hash, size, touched) VALUES (\(account), \(hash.hex), \(size), \(now))
            ON CONFLICT (account_id, hash) DO UPDATE SET touched = GREATEST(account_chunks.touched, excluded.touched)
            """)
    }

    public func recordChunk(account: Int64, hash: ContentHash, size: Int64, now: Int64) async throws {
        try await write(locking: nil) { db in
            try Self.lockHash(db, hash)
            try Self.refuseIfDeleting(db, hash)
            try Self.own(db, account: account, hash: hash, size: size, now: now)
        }
    }

    public func claimChunks(account: Int64, hashes: [ContentHash], now: Int64) async throws -> [ContentHash: Int64] {
        let hexes = Array(Set(hashes.map(\.hex))).sorted()
        return try await write(locking: nil) { db in
            try Self.ownedChunks(try db.rows("""
                UPDATE account_chunks SET touched = GREATEST(touched, \(now))
                WHERE account_id = \(account) AND hash = ANY(\(hexes)) RETURNING hash, size
                """))
        }
    }

    public func beginChunkUpload(account: Int64, hash: ContentHash, size: Int64, now: Int64) async throws -> ChunkUpload {
        try await write(locking: nil) { db in
            try Self.lockHash(db, hash)
            try Self.refuseIfDeleting(db, hash)
            let owned = !(try db.rows("SELECT 1 FROM account_chunks WHERE account_id = \(account) AND hash = \(hash.hex)")).isEmpty
            if !owned {
                // Quota: the account's row locked until this transaction, which records the
                // upload, commits: uploads of one account are admitted one at a time on every
                // instance (Quotas.swift).
                let quota = try db.rows("SELECT quota FROM accounts WHERE id = \(account) FOR NO KEY UPDATE").first?.decode(Int64?.self) ?? nil
                if let quota {
                    let underWay = !(try db.rows("""
                        SELECT 1 FROM chunk_uploads WHERE account_id = \(account) AND hash = \(hash.hex) AND size IS NOT NULL
                        """)).isEmpty
                    if !underWay { try Quotas.admit(usage: try Self.usage(db, account: account), quota: quota, size: size) }
                }
            }
            guard let id = try db.rows("""
                INSERT INTO chunk_uploads(hash, started, account_id, size) VALUES (\(hash.hex), \(now), \(account), \(size)) RETURNING id
                """).first?.decode(Int64.self) else { throw APIError(.internal, "recording an upload returned no id") }
            return ChunkUpload(id: id, account: account, hash: hash, owned: owned)
        }
    }

    public func finishChunkUpload(_ upload: ChunkUpload, size: Int64, now: Int64) async throws {
        try await write(locking: nil) { db in
            try Self.lockHash(db, upload.hash)
            guard !(try db.rows("DELETE FROM chunk_uploads WHERE id = \(upload.id) RETURNING id")).isEmpty else {
                throw APIError.chunkBeingFreed(upload.hash)
            }
            try Self.own(db, account: upload.account, hash: upload.hash, size: size, now: now)
        }
    }

    public func abandonChunkUpload(_ upload: ChunkUpload) async throws {
        try await write(locking: nil) { db in try db.exec("DELETE FROM chunk_uploads WHERE id = \(upload.id)") }
    }

    public func ownedChunkHashes() async throws -> Set<ContentHash> {
        Set(try await read("SELECT DISTINCT hash FROM account_chunks").compactMap { ContentHash(hex: try $0.decode(String.self)) })
    }

    // MARK: the collector's primitives

    public func withCollectorLock<T: Sendable>(_ body: @Sendable () async throws -> T) async throws -> T? {
        do {
            return try await client.withConnection { conn in
                let got = try await conn.query("SELECT pg_try_advisory_lock(\(Self.collectorLock))", logger: logger)
                    .collect().first?.decode(Bool.self) ?? false
                guard got else { return nil }
                let result: Result<T, any Error>
                do { result = .success(try await body()) } catch { result = .failure(error) }
                // If this fails the connection is broken, and the lock went with its session.
                _ = try? await conn.query("SELECT pg_advisory_unlock(\(Self.collectorLock))", logger: logger)
                return try result.get()
            }
        } catch let error as PSQLError {
            throw Self.unavailable(error)
        }
    }

    public func chunkDeletions() async throws -> [ContentHash] {
        try await read("SELECT hash FROM chunk_deletions ORDER BY hash").compactMap { ContentHash(hex: try $0.decode(String.self)) }
    }

    public func forgetChunkDeletions(_ hashes: [ContentHash]) async throws {
        let hexes = hashes.map(\.hex)
        try await write(locking: nil) { db in try db.exec("DELETE FROM chunk_deletions WHERE hash = ANY(\(hexes))") }
    }

    public func markChunks(staleAt cutoff: Int64) async throws -> ChunkMark {
        try await write(locking: nil) { db in
            try db.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            var cursors: [Int64: Int64] = [:]
            for row in try db.rows("SELECT id, cursor FROM containers") {
                let (id, cursor) = try row.decode((Int64, Int64).self)
                cursors[id] = cursor
            }
            let referenced = try Self.referencedChunks(try db.rows("SELECT state FROM versions"))
            var claims: [ContentHash: ChunkClaims] = [:]
            for row in try db.rows("""
                SELECT hash, max(size), count(*) FILTER (WHERE touched <= \(cutoff)), count(*) FROM account_chunks GROUP BY hash
                """) {
                let (hex, size, stale, n) = try row.decode((String, Int64, Int64, Int64).self)
                guard let h = ContentHash(hex: hex), !referenced.contains(h) else { continue }
                claims[h, default: ChunkClaims()].add(size: size, stale: stale, of: n)
            }
            for row in try db.rows("""
                SELECT hash, count(*) FILTER (WHERE started <= \(cutoff)), count(*) FROM chunk_uploads GROUP BY hash
                """) {
                let (hex, stale, n) = try row.decode((String, Int64, Int64).self)
                guard let h = ContentHash(hex: hex), !referenced.contains(h) else { continue }
                claims[h, default: ChunkClaims()].add(size: nil, stale: stale, of: n)
            }
            return ChunkMark(cursors: cursors, candidates: claims.compactMapValues(\.candidate))
        }
    }

    static func referencedChunks(_ rows: [PostgresRow]) throws -> Set<ContentHash> {
        var out = Set<ContentHash>()
        for row in rows {
            for c in try Codec.decodeState(try row.decode(String.self)).content.chunks { out.insert(c.hash) }
        }
        return out
    }

    public func sweepChunks(_ hashes: [ContentHash], mark: ChunkMark, staleAt cutoff: Int64, now: Int64) async throws -> ChunkSweep {
        let hexes = hashes.map(\.hex).sorted()
        return try await write(locking: nil) { db in
            // First the ownerships (a commit holding one keeps it), then the hashes (an upload
            // beginning or ending keeps its chunk); neither waits.
            var locked: [String: [Int64]] = [:]
            var sizes: [String: Int64] = [:]
            for row in try db.rows("""
                SELECT account_id, hash, size FROM account_chunks WHERE hash = ANY(\(hexes)) AND touched <= \(cutoff)
                FOR UPDATE SKIP LOCKED
                """) {
                let (account, hex, size) = try row.decode((Int64, String, Int64).self)
                locked[hex, default: []].append(account)
                sizes[hex] = size
            }
            var mine = Set<String>()
            for hex in hexes {
                let key = Self.hashKey(ContentHash(hex: hex)!)
                if try db.rows("SELECT pg_try_advisory_xact_lock(\(Self.chunkLockClass), \(key))").first?.decode(Bool.self) == true {
                    mine.insert(hex)
                }
            }
            // Versions written since the mark; read after the locks, so every commit that could
            // still refer to a locked ownership has committed and is seen here (READ COMMITTED:
            // each statement sees what committed before it began).
            var current: [Int64: Int64] = [:]
            for row in try db.rows("SELECT id, cursor FROM containers") {
                let (id, cursor) = try row.decode((Int64, Int64).self)
                current[id] = cursor
            }
            let moved = mark.moved(now: current)
            let ids = moved.map(\.container), afters = moved.map(\.after)
            let fresh = moved.isEmpty ? [] : try Self.referencedChunks(try db.rows("""
                SELECT v.state FROM versions v JOIN unnest(\(ids)::bigint[], \(afters)::bigint[]) AS m(id, after)
                  ON v.container_id = m.id AND v.seq > m.after
                """))
            var sweep = ChunkSweep()
            for hex in hexes where mine.contains(hex) {
                guard let hash = ContentHash(hex: hex), !fresh.contains(hash) else { continue }
                let accounts = locked[hex] ?? []
                if !accounts.isEmpty {
                    try db.exec("DELETE FROM account_chunks WHERE hash = \(hex) AND account_id = ANY(\(accounts))")
                }
                let uploads = try db.rows("DELETE FROM chunk_uploads WHERE hash = \(hex) AND started <= \(cutoff) RETURNING id")
                sweep.released += accounts.count
                guard !accounts.isEmpty || !uploads.isEmpty else { continue }
                let claimed = try db.rows("""
                    SELECT EXISTS (SELECT 1 FROM account_chunks WHERE hash = \(hex)) OR EXISTS (SELECT 1 FROM chunk_uploads WHERE hash = \(hex))
                    """).first?.decode(Bool.self) ?? true
                if claimed { continue }
                try db.exec("INSERT INTO chunk_deletions(hash, since) VALUES (\(hex), \(now)) ON CONFLICT DO NOTHING")
                sweep.doomed.append((hash, sizes[hex]))
            }
            return sweep
        }
    }
}
