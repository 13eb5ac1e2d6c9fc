import Foundation
import GRDB
import NimbusCore

#if canImport(Glibc)
import Glibc
#endif

/// Chunk ownership, uploads and the garbage collector's primitives on SQLite. Every write here is
/// an IMMEDIATE transaction: it holds the database's one write lock from its first statement, so
/// it is serialized with every commit (which checks ownership inside its own write transaction)
/// and with any other process on the file (`nimbus admin gc` beside `nimbus serve`). The reasons
/// the procedure cannot race are in ChunkCollector.swift.
extension SQLiteStore {
    func immediate<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await pool.writeWithoutTransaction { db in
            var result: T?
            try db.inTransaction(.immediate) {
                result = try body(db)
                return .commit
            }
            return result!
        }
    }

    static func refuseIfDeleting(_ db: Database, _ hash: ContentHash) throws {
        if try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM chunk_deletions WHERE hash = ?"), arguments: [hash.hex]) ?? false {
            throw APIError.chunkBeingFreed(hash)
        }
    }

    static func own(_ db: Database, account: Int64, hash: ContentHash, size: Int64, now: Int64) throws {
        try db.cachedStatement(sql: """
            INSERT INTO account_chunks(account_id, hash, size, touched) VALUES (?, ?, ?, ?)
            ON CONFLICT(account_id, hash) DO UPDATE SET touched = max(touched, excluded.touched)
            """).execute(arguments: [account, hash.hex, size, now])
    }

    public func recordChunk(account: Int64, hash: ContentHash, size: Int64, now: Int64) async throws {
        try await immediate { db in
            try Self.refuseIfDeleting(db, hash)
            try Self.own(db, account: account, hash: hash, size: size, now: now)
        }
    }

    public func claimChunks(account: Int64, hashes: [ContentHash], now: Int64) async throws -> [ContentHash: Int64] {
        let unique = Array(Set(hashes))
        return try await immediate { db in
            var out: [ContentHash: Int64] = [:]
            for start in stride(from: 0, to: unique.count, by: 500) {
                let part = unique[start..<min(start + 500, unique.count)]
                var args: [any DatabaseValueConvertible] = [now, account]
                args.append(contentsOf: part.map(\.hex))
                for row in try Row.fetchAll(db, sql: """
                    UPDATE account_chunks SET touched = max(touched, ?)
                    WHERE account_id = ? AND hash IN (\(part.map { _ in "?" }.joined(separator: ",")))
                    RETURNING hash, size
                    """, arguments: StatementArguments(args)) {
                    if let h = ContentHash(hex: row["hash"]) { out[h] = row["size"] }
                }
            }
            return out
        }
    }

    public func beginChunkUpload(account: Int64, hash: ContentHash, size: Int64, now: Int64) async throws -> ChunkUpload {
        try await immediate { db in try Self.beginUpload(db, account: account, hash: hash, size: size, now: now) }
    }

    /// All in one IMMEDIATE transaction: each chunk admitted (quota) after the ones before it are
    /// recorded, as one at a time would be. A refusal (`busy`, `quota_exceeded`: decided before
    /// anything of it is written) leaves the others; a database error fails them all.
    public func beginChunkUploads(account: Int64, chunks: [(hash: ContentHash, size: Int64)], now: Int64) async -> [Result<ChunkUpload, any Error>] {
        do {
            return try await immediate { db in
                try chunks.map { c in
                    do { return .success(try Self.beginUpload(db, account: account, hash: c.hash, size: c.size, now: now)) } catch let e as APIError { return .failure(e) }
                }
            }
        } catch {
            return chunks.map { _ in .failure(error) }
        }
    }

    /// All in one IMMEDIATE transaction, each answered on its own (`busy`: reclaimed meanwhile);
    /// a database error fails them all.
    public func finishChunkUploads(_ uploads: [(upload: ChunkUpload, size: Int64)], now: Int64) async -> [(any Error)?] {
        do {
            return try await immediate { db in
                try uploads.map { u in
                    do { try Self.finishUpload(db, u.upload, size: u.size, now: now); return nil } catch let e as APIError { return e }
                }
            }
        } catch {
            return uploads.map { _ in error }
        }
    }

    static func beginUpload(_ db: Database, account: Int64, hash: ContentHash, size: Int64, now: Int64) throws -> ChunkUpload {
        try Self.refuseIfDeleting(db, hash)
        let owned = try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM account_chunks WHERE account_id = ? AND hash = ?"),
                                      arguments: [account, hash.hex]) ?? false
        // Quota: decided in this IMMEDIATE transaction, which also records the upload, so
        // uploads of one account are admitted one at a time (Quotas.swift).
        if !owned, let quota = try Int64.fetchOne(db.cachedStatement(sql: "SELECT quota FROM accounts WHERE id = ?"), arguments: [account]) {
            let underWay = try Bool.fetchOne(db.cachedStatement(sql: "SELECT 1 FROM chunk_uploads WHERE account_id = ? AND hash = ? AND size IS NOT NULL"),
                                             arguments: [account, hash.hex]) ?? false
            if !underWay { try Quotas.admit(usage: try Self.usage(db, account: account), quota: quota, size: size) }
        }
        guard let id = try Int64.fetchOne(db.cachedStatement(sql: "INSERT INTO chunk_uploads(hash, started, account_id, size) VALUES (?, ?, ?, ?) RETURNING id"),
                                          arguments: [hash.hex, now, account, size]) else {
            throw APIError(.internal, "recording an upload returned no id")
        }
        return ChunkUpload(id: id, account: account, hash: hash, owned: owned)
    }

    public func finishChunkUpload(_ upload: ChunkUpload, size: Int64, now: Int64) async throws {
        try await immediate { db in try Self.finishUpload(db, upload, size: size, now: now) }
    }

    static func finishUpload(_ db: Database, _ upload: ChunkUpload, size: Int64, now: Int64) throws {
        guard try Int64.fetchOne(db.cachedStatement(sql: "DELETE FROM chunk_uploads WHERE id = ? RETURNING id"), arguments: [upload.id]) != nil else {
            throw APIError.chunkBeingFreed(upload.hash)
        }
        try Self.own(db, account: upload.account, hash: upload.hash, size: size, now: now)
    }

    public func abandonChunkUpload(_ upload: ChunkUpload) async throws {
        try await pool.write { db in try db.execute(sql: "DELETE FROM chunk_uploads WHERE id = ?", arguments: [upload.id]) }
    }

    public func ownedChunkHashes() async throws -> Set<ContentHash> {
        try await pool.read { db in
            Set(try String.fetchAll(db, sql: "SELECT DISTINCT hash FROM account_chunks").compactMap { ContentHash(hex: $0) })
        }
    }

    public func referencedChunks() async throws -> Set<ContentHash> {
        try await pool.read { db in try Self.referencedChunks(db, sql: "SELECT state FROM versions") }
    }

    static func referencedChunks(_ db: Database, sql: String, arguments: StatementArguments = StatementArguments()) throws -> Set<ContentHash> {
        var out = Set<ContentHash>()
        let cursor = try String.fetchCursor(db, sql: sql, arguments: arguments)
        while let text = try cursor.next() {
            for c in try Codec.decodeState(text).content.chunks { out.insert(c.hash) }
        }
        return out
    }

    // MARK: the collector's primitives

    /// An exclusive `flock` on `metadata.sqlite-gc.lock`: one collector per database file,
    /// across processes, released by the kernel if the holder dies.
    public func withCollectorLock<T: Sendable>(_ body: @Sendable () async throws -> T) async throws -> T? {
        let path = pool.path + "-gc.lock"
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw APIError(.unavailable, "cannot open the collector's lock file \(path) (errno \(errno))") }
        defer { close(fd) }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            if errno == EWOULDBLOCK { return nil }
            throw APIError(.unavailable, "cannot lock \(path) (errno \(errno))")
        }
        return try await body()
    }

    public func chunkDeletions() async throws -> [ContentHash] {
        try await pool.read { db in
            try String.fetchAll(db, sql: "SELECT hash FROM chunk_deletions ORDER BY hash").compactMap { ContentHash(hex: $0) }
        }
    }

    public func forgetChunkDeletions(_ hashes: [ContentHash]) async throws {
        try await immediate { db in
            for h in hashes { try db.execute(sql: "DELETE FROM chunk_deletions WHERE hash = ?", arguments: [h.hex]) }
        }
    }

    public func markChunks(staleAt cutoff: Int64) async throws -> ChunkMark {
        try await pool.read { db in
            var cursors: [Int64: Int64] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT id, cursor FROM containers") { cursors[row["id"]] = row["cursor"] }
            let referenced = try Self.referencedChunks(db, sql: "SELECT state FROM versions")
            var claims: [ContentHash: ChunkClaims] = [:]
            for row in try Row.fetchAll(db, sql: """
                SELECT hash, max(size) AS size, sum(touched <= ?) AS stale, count(*) AS n FROM account_chunks GROUP BY hash
                """, arguments: [cutoff]) {
                guard let h = ContentHash(hex: row["hash"]), !referenced.contains(h) else { continue }
                claims[h, default: ChunkClaims()].add(size: row["size"], stale: row["stale"], of: row["n"])
            }
            for row in try Row.fetchAll(db, sql: """
                SELECT hash, sum(started <= ?) AS stale, count(*) AS n FROM chunk_uploads GROUP BY hash
                """, arguments: [cutoff]) {
                guard let h = ContentHash(hex: row["hash"]), !referenced.contains(h) else { continue }
                claims[h, default: ChunkClaims()].add(size: nil, stale: row["stale"], of: row["n"])
            }
            return ChunkMark(cursors: cursors, candidates: claims.compactMapValues(\.candidate))
        }
    }

    public func sweepChunks(_ hashes: [ContentHash], mark: ChunkMark, staleAt cutoff: Int64, now: Int64) async throws -> ChunkSweep {
        try await immediate { db in
            // Versions written since the mark (the only ones the mark did not see).
            var current: [Int64: Int64] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT id, cursor FROM containers") { current[row["id"]] = row["cursor"] }
            var fresh = Set<ContentHash>()
            for (container, after) in mark.moved(now: current) {
                fresh.formUnion(try Self.referencedChunks(db, sql: "SELECT state FROM versions WHERE container_id = ? AND seq > ?",
                                                          arguments: [container, after]))
            }
            var sweep = ChunkSweep()
            for hash in hashes where !fresh.contains(hash) {
                let sizes = try Int64.fetchAll(db, sql: "DELETE FROM account_chunks WHERE hash = ? AND touched <= ? RETURNING size",
                                               arguments: [hash.hex, cutoff])
                let uploads = try Int64.fetchAll(db, sql: "DELETE FROM chunk_uploads WHERE hash = ? AND started <= ? RETURNING id",
                                                 arguments: [hash.hex, cutoff])
                sweep.released += sizes.count
                guard !sizes.isEmpty || !uploads.isEmpty else { continue }
                let claimed = try Bool.fetchOne(db, sql: """
                    SELECT EXISTS (SELECT 1 FROM account_chunks WHERE hash = ?1) OR EXISTS (SELECT 1 FROM chunk_uploads WHERE hash = ?1)
                    """, arguments: [hash.hex]) ?? true
                if claimed { continue }
                try db.execute(sql: "INSERT INTO chunk_deletions(hash, since) VALUES (?, ?) ON CONFLICT DO NOTHING", arguments: [hash.hex, now])
                sweep.doomed.append((hash, sizes.first))
            }
            return sweep
        }
    }
}

/// Ownerships and uploads of one chunk, as the mark counts them.
struct ChunkClaims {
    var size: Int64?
    var stale = 0
    var total = 0

    mutating func add(size: Int64?, stale: Int64, of total: Int64) {
        self.size = self.size ?? size
        self.stale += Int(stale)
        self.total += Int(total)
    }

    /// A candidate when something about the chunk is stale.
    var candidate: ChunkMark.Candidate? {
        stale > 0 ? ChunkMark.Candidate(size: size, freeable: stale == total) : nil
    }
}
