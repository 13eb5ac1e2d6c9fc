import Logging
import PostgresNIO

/// The PostgreSQL schema, as numbered migrations. Applied on start by every instance; a
/// transaction-scoped advisory lock makes instances that start together apply each migration once.
/// `schema_migrations` records what was applied. Never edit a released migration: append one.
///
/// Same invariants as the SQLite schema: CHECKs, one live name per folder (partial unique index),
/// one current version per item (partial unique index). Ids and names use the "C" collation so
/// ordering and comparison are by bytes, as in SQLite, whatever the database's locale.
enum PostgresSchema {
    static let migrations: [(version: Int64, statements: [String])] = [
        (1, [
            """
            CREATE TABLE accounts (
                id BIGSERIAL PRIMARY KEY,
                name TEXT COLLATE "C" NOT NULL UNIQUE CHECK (octet_length(name) BETWEEN 1 AND 255))
            """,
            """
            CREATE TABLE devices (
                id TEXT COLLATE "C" PRIMARY KEY,
                account_id BIGINT NOT NULL REFERENCES accounts(id),
                name TEXT NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 255),
                token_hash TEXT COLLATE "C" NOT NULL UNIQUE CHECK (length(token_hash) = 64),
                created BIGINT NOT NULL)
            """,
            """
            CREATE TABLE containers (
                id BIGSERIAL PRIMARY KEY,
                account_id BIGINT NOT NULL REFERENCES accounts(id),
                name TEXT COLLATE "C" NOT NULL,
                cursor BIGINT NOT NULL DEFAULT 0 CHECK (cursor >= 0),
                UNIQUE (account_id, name))
            """,
            """
            CREATE TABLE items (
                container_id BIGINT NOT NULL REFERENCES containers(id),
                id TEXT COLLATE "C" NOT NULL,
                parent_id TEXT COLLATE "C" NOT NULL,
                name TEXT COLLATE "C" NOT NULL,
                kind TEXT NOT NULL CHECK (kind IN ('file', 'folder', 'symlink')),
                deleted BOOLEAN NOT NULL,
                version BIGINT NOT NULL CHECK (version > 0),
                conflicts BIGINT NOT NULL CHECK (conflicts >= 0),
                state TEXT NOT NULL,
                PRIMARY KEY (container_id, id))
            """,
            "CREATE UNIQUE INDEX items_live_name ON items(container_id, parent_id, name) WHERE NOT deleted",
            "CREATE INDEX items_parent ON items(container_id, parent_id)",
            """
            CREATE TABLE versions (
                container_id BIGINT NOT NULL,
                item_id TEXT COLLATE "C" NOT NULL,
                seq BIGINT NOT NULL CHECK (seq > 0),
                role TEXT NOT NULL CHECK (role IN ('current', 'previous', 'conflict', 'discarded')),
                was_current BOOLEAN NOT NULL,
                device_id TEXT NOT NULL,
                state TEXT NOT NULL,
                PRIMARY KEY (container_id, item_id, seq),
                FOREIGN KEY (container_id, item_id) REFERENCES items(container_id, id) DEFERRABLE INITIALLY DEFERRED)
            """,
            "CREATE UNIQUE INDEX versions_one_current ON versions(container_id, item_id) WHERE role = 'current'",
            """
            CREATE TABLE journal (
                container_id BIGINT NOT NULL REFERENCES containers(id),
                seq BIGINT NOT NULL CHECK (seq > 0),
                item_id TEXT COLLATE "C" NOT NULL,
                kind TEXT NOT NULL,
                device_id TEXT NOT NULL,
                record TEXT NOT NULL,
                PRIMARY KEY (container_id, seq))
            """,
            "CREATE INDEX journal_item ON journal(container_id, item_id, seq)",
            """
            CREATE TABLE account_chunks (
                account_id BIGINT NOT NULL REFERENCES accounts(id),
                hash TEXT COLLATE "C" NOT NULL CHECK (length(hash) = 64),
                size BIGINT NOT NULL CHECK (size >= 0),
                PRIMARY KEY (account_id, hash))
            """,
        ]),
        // History retention (as SQLite's "v2-history"): earlier versions record when they were
        // retired (NULL exactly on current and conflict rows; rows already earlier count as
        // retired now), items remember the newest pruned row that was current.
        (2, [
            "ALTER TABLE versions ADD COLUMN retired BIGINT",
            """
            UPDATE versions SET retired = (extract(epoch FROM now()) * 1000000000)::bigint
            WHERE role IN ('previous', 'discarded')
            """,
            """
            ALTER TABLE versions ADD CONSTRAINT versions_retired_when_earlier
                CHECK ((role IN ('previous', 'discarded')) = (retired IS NOT NULL))
            """,
            "ALTER TABLE items ADD COLUMN history_floor BIGINT NOT NULL DEFAULT 0 CHECK (history_floor >= 0)",
        ]),
        // A revoked device keeps its row (versions and the journal name it); its token stops working.
        (3, ["ALTER TABLE devices ADD COLUMN revoked BIGINT"]),
        // One-time pairing codes (hashed); a used or expired code stays until pruned at the next code.
        (4, ["""
            CREATE TABLE pairings (
                code_hash TEXT COLLATE "C" PRIMARY KEY,
                account_id BIGINT NOT NULL REFERENCES accounts(id),
                device_name TEXT NOT NULL,
                created_by TEXT NOT NULL,
                expires BIGINT NOT NULL,
                used BIGINT
            )
            """]),
        // Chunk garbage collection (ChunkCollector): an ownership's lease time (existing ones and
        // rows written by an instance not yet upgraded count as touched now), uploads in flight,
        // bodies being deleted; versions by sequence for the sweep's "what is new since the mark".
        (5, [
            "ALTER TABLE account_chunks ADD COLUMN touched BIGINT NOT NULL DEFAULT (extract(epoch FROM now()) * 1000000000)::bigint",
            "CREATE INDEX account_chunks_hash ON account_chunks(hash)",
            """
            CREATE TABLE chunk_uploads (
                id BIGSERIAL PRIMARY KEY,
                hash TEXT COLLATE "C" NOT NULL CHECK (length(hash) = 64),
                started BIGINT NOT NULL)
            """,
            "CREATE INDEX chunk_uploads_hash ON chunk_uploads(hash)",
            """
            CREATE TABLE chunk_deletions (
                hash TEXT COLLATE "C" PRIMARY KEY CHECK (length(hash) = 64),
                since BIGINT NOT NULL)
            """,
            "CREATE INDEX versions_seq ON versions(container_id, seq)",
        ]),
        // Quotas (Quotas.swift): an account's quota in bytes (NULL: none), and the account and
        // size of each upload in flight, which count against it until the upload ends. Uploads
        // recorded by an instance not yet upgraded have neither and do not count.
        (6, [
            "ALTER TABLE accounts ADD COLUMN quota BIGINT CHECK (quota IS NULL OR quota >= 0)",
            "ALTER TABLE chunk_uploads ADD COLUMN account_id BIGINT REFERENCES accounts(id)",
            "ALTER TABLE chunk_uploads ADD COLUMN size BIGINT CHECK (size IS NULL OR size > 0)",
            "CREATE INDEX chunk_uploads_account ON chunk_uploads(account_id, hash)",
        ]),
        // Until when a long-poll may wait on the container through some instance: a commit sends
        // its NOTIFY only before then (PostgresCommitFeed.swift, `watch`).
        (7, ["ALTER TABLE containers ADD COLUMN watched_until TIMESTAMPTZ"]),
        // What an account stores in version rows and journal entries counts in its usage
        // (Quotas.swift): per container, in bytes, counted from what is there now.
        (8, [
            "ALTER TABLE containers ADD COLUMN meta_bytes BIGINT NOT NULL DEFAULT 0",
            """
            UPDATE containers c SET meta_bytes =
                (SELECT coalesce(sum(octet_length(v.state)), 0) FROM versions v WHERE v.container_id = c.id)
              + (SELECT coalesce(sum(octet_length(j.record)), 0) FROM journal j WHERE j.container_id = c.id)
            """,
        ]),
        // Recently Deleted (CommitEngine+Trash): when and by whom an item was deleted, the entry
        // it belongs to and its bytes. Items deleted before this migration become entries at its
        // time (kept the whole retention from now), grouped under their topmost deleted folder.
        (9, [
            """
            ALTER TABLE items ADD COLUMN deleted_at BIGINT, ADD COLUMN deleted_by TEXT COLLATE "C",
                ADD COLUMN trash_root TEXT COLLATE "C", ADD COLUMN trash_bytes BIGINT
            """,
            """
            UPDATE items SET deleted_at = (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint,
                deleted_by = state::jsonb->>'modifiedBy',
                trash_bytes = CASE WHEN kind = 'file'
                    THEN (SELECT coalesce(sum((c->>'size')::bigint), 0) FROM jsonb_array_elements(state::jsonb->'content'->'chunks') c)
                    ELSE 0 END
            WHERE deleted
            """,
            """
            WITH RECURSIVE up(container_id, id, root) AS (
                SELECT i.container_id, i.id, i.id FROM items i WHERE i.deleted AND NOT EXISTS
                    (SELECT 1 FROM items p WHERE p.container_id = i.container_id AND p.id = i.parent_id AND p.deleted)
                UNION
                SELECT c.container_id, c.id, up.root FROM items c JOIN up ON c.container_id = up.container_id AND c.parent_id = up.id
                WHERE c.deleted)
            UPDATE items SET trash_root = up.root FROM up WHERE items.container_id = up.container_id AND items.id = up.id
            """,
            "CREATE INDEX items_trash ON items(container_id, trash_root) WHERE trash_root IS NOT NULL",
            "CREATE INDEX items_trash_time ON items(container_id, deleted_at, id) WHERE trash_root = id",
            "CREATE INDEX items_trash_expiry ON items(deleted_at) WHERE trash_root = id",
            "CREATE TABLE purged_items (container_id BIGINT NOT NULL, id TEXT COLLATE \"C\" NOT NULL, PRIMARY KEY (container_id, id))",
        ]),
        // Web view sessions (as SQLite's "v9-web-sessions"): when each was last used.
        (10, ["ALTER TABLE devices ADD COLUMN web_used BIGINT"]),
    ]

    /// Arbitrary constant naming the advisory lock held while migrating ("nimbus" in ASCII).
    static let migrationLock: Int64 = 0x6e696d627573

    /// Applies pending migrations in one transaction; returns the versions applied.
    static func migrate(_ conn: PostgresConnection, logger: Logger) async throws -> [Int64] {
        _ = try await conn.query("BEGIN", logger: logger)
        do {
            // An instance starting while another migrates waits for it however long it takes.
            _ = try await conn.query("SET LOCAL lock_timeout = 0", logger: logger)
            _ = try await conn.query("SELECT pg_advisory_xact_lock(\(migrationLock))", logger: logger)
            _ = try await conn.query("""
                CREATE TABLE IF NOT EXISTS schema_migrations (
                    version BIGINT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())
                """, logger: logger)
            var done = Set<Int64>()
            for try await v in try await conn.query("SELECT version FROM schema_migrations", logger: logger).decode(Int64.self) {
                done.insert(v)
            }
            if let newest = done.max(), newest > migrations.last?.version ?? 0 {
                throw APIError(.unavailable, "the database has schema version \(newest), newer than this nimbus knows (\(migrations.last?.version ?? 0)); upgrade nimbus on this machine")
            }
            var applied: [Int64] = []
            for m in migrations where !done.contains(m.version) {
                for s in m.statements { _ = try await conn.query(PostgresQuery(unsafeSQL: s), logger: logger) }
                _ = try await conn.query("INSERT INTO schema_migrations(version) VALUES (\(m.version))", logger: logger)
                applied.append(m.version)
            }
            _ = try await conn.query("COMMIT", logger: logger)
            return applied
        } catch {
            _ = try? await conn.query("ROLLBACK", logger: logger)
            throw error
        }
    }
}
