import GRDB

/// Forward-only, named migrations (GRDB `DatabaseMigrator`). Never edit a shipped migration;
/// add a new one. The schema enforces what the code assumes.
enum Schema {
    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1-items") { db in
            try db.execute(sql: """
                CREATE TABLE item (
                    id      TEXT PRIMARY KEY NOT NULL,
                    node    INTEGER NOT NULL UNIQUE CHECK (node > 0),
                    parent  TEXT REFERENCES item(id) DEFERRABLE INITIALLY DEFERRED,
                    name    TEXT NOT NULL,
                    kind    TEXT NOT NULL CHECK (kind IN ('file', 'folder', 'symlink')),
                    mode    INTEGER NOT NULL,
                    uid     INTEGER NOT NULL,
                    gid     INTEGER NOT NULL,
                    size    INTEGER NOT NULL CHECK (size >= 0),
                    atime   INTEGER NOT NULL,
                    mtime   INTEGER NOT NULL,
                    ctime   INTEGER NOT NULL,
                    btime   INTEGER NOT NULL,
                    target  TEXT,
                    version INTEGER,
                    dirty   INTEGER NOT NULL DEFAULT 1 CHECK (dirty IN (0, 1)),
                    CHECK ((parent IS NULL) = (id = '00000000-0000-0000-0000-000000000000')),
                    CHECK ((kind = 'symlink') = (target IS NOT NULL))
                );
                -- Not UNIQUE: RENAME_EXCHANGE swaps two names in one step; the filesystem keeps
                -- names unique per folder in memory.
                CREATE INDEX item_parent ON item(parent, name);
                CREATE TABLE xattr (
                    item  TEXT NOT NULL REFERENCES item(id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
                    name  TEXT NOT NULL,
                    value BLOB NOT NULL,
                    PRIMARY KEY (item, name)
                ) WITHOUT ROWID;
                CREATE TABLE meta (
                    key   TEXT PRIMARY KEY NOT NULL,
                    value TEXT NOT NULL
                );
                """)
        }
        // The sync engine's state (issue 4). `sync_item` is the server state this device last
        // synced per item (the base of its next commit) plus which chunks of it are in the cache
        // file; no foreign key to `item`: a locally deleted item keeps its base until the delete
        // is committed. `sync_op` is the upload queue, written in the same transactions as the
        // item changes that caused it, so it survives kill -9 together with them.
        m.registerMigration("v2-sync") { db in
            try db.execute(sql: """
                CREATE TABLE sync_item (
                    id      TEXT PRIMARY KEY NOT NULL,
                    version INTEGER NOT NULL CHECK (version > 0),
                    record  BLOB NOT NULL,
                    present BLOB
                ) WITHOUT ROWID;
                CREATE TABLE sync_op (
                    seq  INTEGER PRIMARY KEY AUTOINCREMENT,
                    item TEXT NOT NULL,
                    kind TEXT NOT NULL CHECK (kind IN ('created', 'content', 'moved', 'attributes', 'deleted'))
                );
                CREATE INDEX sync_op_item ON sync_op(item);
                """)
        }
        // Pins (issue 4, cache): items whose content is downloaded and kept under cache pressure;
        // a pinned folder pins everything below it, present and future.
        m.registerMigration("v3-cache") { db in
            try db.execute(sql: "CREATE TABLE sync_pin (id TEXT PRIMARY KEY NOT NULL) WITHOUT ROWID")
        }
        // FIFOs, sockets and device nodes (local-only items): a device node's number.
        m.registerMigration("v4-special-files") { db in
            try db.execute(sql: "ALTER TABLE item ADD COLUMN rdev INTEGER NOT NULL DEFAULT 0")
        }
        // Hard links: the names of one file share its node (st_ino), each an item of its own.
        // SQLite cannot drop a UNIQUE constraint: the table is rebuilt (foreign keys are checked
        // once the migration is done).
        m.registerMigration("v5-hard-links") { db in
            try db.execute(sql: """
                CREATE TABLE item_new (
                    id      TEXT PRIMARY KEY NOT NULL,
                    node    INTEGER NOT NULL CHECK (node > 0),
                    parent  TEXT REFERENCES item(id) DEFERRABLE INITIALLY DEFERRED,
                    name    TEXT NOT NULL,
                    kind    TEXT NOT NULL CHECK (kind IN ('file', 'folder', 'symlink')),
                    mode    INTEGER NOT NULL,
                    uid     INTEGER NOT NULL,
                    gid     INTEGER NOT NULL,
                    size    INTEGER NOT NULL CHECK (size >= 0),
                    atime   INTEGER NOT NULL,
                    mtime   INTEGER NOT NULL,
                    ctime   INTEGER NOT NULL,
                    btime   INTEGER NOT NULL,
                    target  TEXT,
                    version INTEGER,
                    dirty   INTEGER NOT NULL DEFAULT 1 CHECK (dirty IN (0, 1)),
                    rdev    INTEGER NOT NULL DEFAULT 0,
                    CHECK ((parent IS NULL) = (id = '00000000-0000-0000-0000-000000000000')),
                    CHECK ((kind = 'symlink') = (target IS NOT NULL))
                );
                INSERT INTO item_new (id, node, parent, name, kind, mode, uid, gid, size, atime, mtime, ctime, btime, target, version, dirty, rdev)
                    SELECT id, node, parent, name, kind, mode, uid, gid, size, atime, mtime, ctime, btime, target, version, dirty, rdev FROM item;
                DROP TABLE item;
                ALTER TABLE item_new RENAME TO item;
                CREATE INDEX item_parent ON item(parent, name);
                CREATE INDEX item_node ON item(node);
                """)
        }
        return m
    }

    static let upsertItem = """
        INSERT INTO item (id, node, parent, name, kind, mode, uid, gid, size, atime, mtime, ctime, btime, target, version, dirty, rdev)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT(id) DO UPDATE SET node = excluded.node, parent = excluded.parent, name = excluded.name,
            kind = excluded.kind, mode = excluded.mode, uid = excluded.uid, gid = excluded.gid,
            size = excluded.size, atime = excluded.atime, mtime = excluded.mtime, ctime = excluded.ctime,
            btime = excluded.btime, target = excluded.target, version = excluded.version, dirty = excluded.dirty, rdev = excluded.rdev
        """
}
