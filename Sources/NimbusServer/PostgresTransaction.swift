import Logging
import NIOCore
import NimbusCore
import NimbusProtocol
import PostgresNIO
import Synchronization

/// Blocking queries on one leased connection. `CommitEngine` works over the synchronous
/// `StoreTransaction`, so a commit runs on a thread of the store's own thread pool (never an event
/// loop) and waits for answers there; the connection's event loop does the I/O.
///
/// Writes whose answer nothing needs (`send`) are queued on the connection without waiting: the
/// event loop sends each as soon as the one before is answered, and the thread waits only at the
/// next read or at COMMIT (`settle`). A failed write aborts the transaction, so the first error
/// of the queued writes is the one reported, whatever failed after it.
final class PostgresSync {
    let conn: PostgresConnection
    let logger: Logger
    private let counters: PostgresCounters?
    private var pending: [EventLoopFuture<PostgresQueryResult>] = []

    init(conn: PostgresConnection, logger: Logger, counters: PostgresCounters? = nil) {
        self.conn = conn
        self.logger = logger
        self.counters = counters
    }

    func rows(_ q: PostgresQuery) throws -> [PostgresRow] {
        let answer = conn.query(q, logger: logger)
        counters?.statement(waited: true)
        try settle()
        return try answer.wait().rows
    }

    /// Runs a prepared statement — parsed and planned once per connection instead of at every
    /// call (planning the commit's first statement costs PostgreSQL more than running it) — and
    /// waits for its rows. PostgresNIO runs prepared statements only from async code, so a task
    /// hands it over; it is written to the connection after every statement queued before it.
    func rows<S: PostgresPreparedStatement>(prepared statement: S) throws -> [PostgresRow] where S.Row == PostgresRow {
        let conn = conn, logger = logger
        let answer = conn.eventLoop.makeFutureWithTask {
            var out: [PostgresRow] = []
            for try await row in try await conn.execute(statement, logger: logger) { out.append(row) }
            return out
        }
        counters?.statement(waited: true)
        try settle()
        return try answer.wait()
    }

    /// Sends `q` and waits for it (and for every write queued before it).
    func exec(_ q: PostgresQuery) throws {
        send(q)
        counters?.waited()
        try settle()
    }

    /// Queues `q`; its outcome is checked at the next read, `exec` or `settle`.
    func send(_ q: PostgresQuery) {
        pending.append(conn.query(q, logger: logger))
        counters?.statement(waited: false)
    }

    /// Waits for the queued writes; throws the first one's error.
    func settle() throws {
        guard !pending.isEmpty else { return }
        let queued = pending
        pending = []
        var first: (any Error)?
        for answer in queued {
            do { _ = try answer.wait() } catch { if first == nil { first = error } }
        }
        if let first { throw first }
    }
}

/// Statements sent to PostgreSQL and the times a thread waited for answers (`/metrics`,
/// scripts/bench-server's round trips per commit).
final class PostgresCounters: Sendable {
    private let counts = Atomic<Int64>(0)
    private let waits = Atomic<Int64>(0)

    func statement(waited: Bool) {
        counts.add(1, ordering: .relaxed)
        if waited { waits.add(1, ordering: .relaxed) }
    }

    func waited() { waits.add(1, ordering: .relaxed) }

    var statements: Int64 { counts.load(ordering: .relaxed) }
    var waitsForAnswers: Int64 { waits.load(ordering: .relaxed) }
}

/// The commit's first statement: locks the container row and reads what the commit reads first
/// (`PostgresPrefetch`). `seen` is the cursor as of the statement's start, before it waited for the
/// lock; when it differs from the locked one, another commit ran in between and the rows read are
/// not used.
struct CommitPrefetch: PostgresPreparedStatement {
    typealias Row = PostgresRow
    static let name = "nimbus_commit_prefetch"
    static let sql = """
        SELECT c.cursor, (SELECT cursor FROM containers WHERE id = $1),
               i.id, i.version, i.conflicts, i.state, v.seq, v.was_current,
               coalesce(h.seqs, '{}'), coalesce(h.roles, '{}'), coalesce(h.was, '{}'), coalesce(h.retired, '{}'),
               p.id, p.version, p.conflicts, p.state,
               EXISTS (SELECT 1 FROM items n WHERE n.container_id = c.id AND n.parent_id = $4 AND n.name = $5
                       AND NOT n.deleted AND n.id <> $2)
        FROM containers c
        LEFT JOIN items i ON i.container_id = c.id AND i.id = $2
        LEFT JOIN versions v ON v.container_id = c.id AND v.item_id = $2 AND v.role = 'current'
        LEFT JOIN items p ON p.container_id = c.id AND p.id = $3
        LEFT JOIN LATERAL (
            SELECT array_agg(e.seq ORDER BY e.seq) AS seqs, array_agg(e.role ORDER BY e.seq) AS roles,
                   array_agg(e.was_current ORDER BY e.seq) AS was, array_agg(coalesce(e.retired, -1) ORDER BY e.seq) AS retired
            FROM versions e WHERE e.container_id = c.id AND e.item_id = $2 AND e.role IN ('previous', 'discarded')
        ) h ON true
        WHERE c.id = $1 FOR UPDATE OF c
        """
    static let bindingDataTypes: [PostgresDataType] = [.int8, .text, .text, .text, .text]

    var container: Int64
    var item: String
    /// The parent folder whose row is read ("" for none).
    var parent: String
    /// The place whose name is checked ("" for none).
    var placeParent: String
    var placeName: String

    func makeBindings() throws -> PostgresBindings {
        var b = PostgresBindings(capacity: 5)
        b.append(container)
        b.append(item)
        b.append(parent)
        b.append(placeParent)
        b.append(placeName)
        return b
    }

    func decodeRow(_ row: PostgresRow) throws -> PostgresRow { row }
}

/// What the commit transaction read together with the container lock (one statement instead
/// of five): the container's cursor, the committed item's row and current version, and for a
/// commit that places the item, its parent's row and whether its name is taken there.
struct PostgresPrefetch {
    var cursor: Int64
    var item: ItemID
    var row: StoredItem?
    /// The current version row: its seq and whether it was ever current.
    var current: (seq: Int64, wasCurrent: Bool)?
    /// The item's earlier versions (what history pruning reads).
    var earlier: [EarlierVersion] = []
    var parent: (id: ItemID, row: StoredItem?)?
    /// `isNameTaken(parent, name, excluding: item)`.
    var nameCheck: (parent: ItemID, name: String, taken: Bool)?
}

/// `StoreTransaction` inside an open PostgreSQL transaction, scoped to one container whose row the
/// caller has locked (`SELECT … FOR UPDATE`), so commits to one container run one at a time and
/// journal sequences stay gap-free, as SQLite's single writer guarantees for the embedded engine.
///
/// Few round trips while the lock is held (a new file: the lock's statement, one write statement
/// and COMMIT):
/// - the lock's statement also read what the commit reads first (`PostgresPrefetch`);
/// - sequences are counted here from the locked cursor, and the cursor written once (`finish`);
/// - the usual writes — a new version row, the item row, the journal entry, the cursor, the
///   notification — are gathered (`Batch`) and sent as one statement (data-modifying CTEs) when
///   the transaction next reads or finishes. A batch holds at most one item row and never two
///   writes of one row; a role change or a deletion sends the batch first and goes after it, so
///   the database sees the writes in the order the engine made them (a version stops being
///   current before another becomes current);
/// - rows this transaction read or wrote are answered from memory. Every write of an item row and
///   of a version's role goes through here, so what memory holds is what the database holds.
struct PostgresTransaction: StoreTransaction {
    let db: PostgresSync
    let container: ContainerRecord
    private let encoded = EncodedStateCache()
    private let known: Known

    /// Rows known in this transaction (read with the lock or written since), and the writes not
    /// sent yet.
    private final class Known {
        var cursor: Int64
        var cursorMoved = false
        /// nil value: known to have no row.
        var items: [ItemID: StoredItem?] = [:]
        /// The seq of the item's `current` version row; nil value: known to have none.
        var currentSeqs: [ItemID: Int64?] = [:]
        /// `was_current` of version rows known here.
        var wasCurrent: [ItemID: [Int64: Bool]] = [:]
        /// The earlier versions of items whose every earlier row is known here.
        var earlier: [ItemID: [EarlierVersion]] = [:]
        /// `isNameTaken(parent, name, excluding: nameCheckFor)`, valid until an item row is written.
        var nameCheck: (parent: ItemID, name: String, taken: Bool)?
        var nameCheckFor: ItemID?
        var batch = Batch()
        var notify: String?
        init(cursor: Int64) { self.cursor = cursor }
    }

    /// Writes sent together as one statement.
    struct Batch {
        var versions: [String] = []
        var item: String?
        var journal: [String] = []
        var binds = PostgresBindings()
        var isEmpty: Bool { versions.isEmpty && item == nil && journal.isEmpty }

        mutating func bind<T: PostgresDynamicTypeEncodable>(_ value: T) -> String {
            binds.append(value)
            return "$\(binds.count)"
        }

        mutating func bind<T: PostgresDynamicTypeEncodable>(_ value: T?) -> String {
            binds.append(value)
            return "$\(binds.count)"
        }
    }

    init(db: PostgresSync, container: ContainerRecord, cursor: Int64, prefetched: PostgresPrefetch?) {
        self.db = db
        self.container = container
        known = Known(cursor: cursor)
        if let p = prefetched {
            known.items[p.item] = .some(p.row)
            known.currentSeqs[p.item] = .some(p.current?.seq)
            if let c = p.current { known.wasCurrent[p.item, default: [:]][c.seq] = c.wasCurrent }
            known.earlier[p.item] = p.earlier
            if let parent = p.parent { known.items[parent.id] = .some(parent.row) }
            known.nameCheck = p.nameCheck
            known.nameCheckFor = p.item
        }
    }

    private var cid: Int64 { container.id }

    private func encode(_ state: ItemState) throws -> String { try encoded.encode(state) }

    /// Sends the gathered writes as one statement (not waited for).
    private func flush() {
        var b = known.batch
        known.batch = Batch()
        var parts: [String] = []
        if !b.versions.isEmpty {
            parts.append("INSERT INTO versions(container_id, item_id, seq, role, was_current, device_id, state) VALUES \(b.versions.joined(separator: ", "))")
        }
        if let item = b.item { parts.append(item) }
        if !b.journal.isEmpty {
            parts.append("INSERT INTO journal(container_id, seq, item_id, kind, device_id, record) VALUES \(b.journal.joined(separator: ", "))")
        }
        if known.cursorMoved {
            parts.append("UPDATE containers SET cursor = \(b.bind(known.cursor)) WHERE id = \(b.bind(cid))")
            known.cursorMoved = false
        }
        var tail = "SELECT 1"
        if let payload = known.notify {
            tail = "SELECT pg_notify(\(b.bind(PostgresStore.channel)), \(b.bind(payload)))"
            known.notify = nil
        }
        guard !parts.isEmpty || tail != "SELECT 1" else { return }
        let ctes = parts.enumerated().map { "w\($0.offset) AS (\($0.element))" }
        let sql = (ctes.isEmpty ? "" : "WITH " + ctes.joined(separator: ", ") + " ") + tail
        db.send(PostgresQuery(unsafeSQL: sql, binds: b.binds))
    }

    /// Writes the cursor the sequences of this transaction reached and the notification, with
    /// whatever writes are gathered. Called once, after the engine's operation, before COMMIT.
    func finish(notify payload: String?) {
        known.notify = payload
        flush()
    }

    /// Reads go after the gathered writes.
    private func rows(_ q: PostgresQuery) throws -> [PostgresRow] {
        if !known.batch.isEmpty { flush() }
        return try db.rows(q)
    }

    func loadItem(_ id: ItemID) throws -> StoredItem? {
        if let row = known.items[id] { return row }
        let row = try rows("SELECT id, version, conflicts, state FROM items WHERE container_id = \(cid) AND id = \(id.description)")
            .first.map(PostgresStore.storedItem)
        known.items[id] = .some(row)
        return row
    }

    func stateCurrent(at version: Int64, of id: ItemID) throws -> ItemState? {
        guard let row = try rows("""
            SELECT v.seq, v.state, i.history_floor FROM versions v
            JOIN items i ON i.container_id = v.container_id AND i.id = v.item_id
            WHERE v.container_id = \(cid) AND v.item_id = \(id.description) AND v.was_current AND v.seq <= \(version)
            ORDER BY v.seq DESC LIMIT 1
            """).first else { return nil }
        let (seq, state, floor) = try row.decode((Int64, String, Int64).self)
        return seq > floor ? try Codec.decodeState(state) : nil
    }

    func isNameTaken(parent: ItemID, name: String, excluding id: ItemID) throws -> Bool {
        if let c = known.nameCheck, c.parent == parent, c.name == name, known.nameCheckFor == id { return c.taken }
        return !(try rows("""
            SELECT 1 FROM items WHERE container_id = \(cid) AND parent_id = \(parent.description) AND name = \(name)
              AND NOT deleted AND id <> \(id.description)
            """).isEmpty)
    }

    func liveChildren(of id: ItemID) throws -> [StoredItem] {
        try rows("""
            SELECT id, version, conflicts, state FROM items WHERE container_id = \(cid) AND parent_id = \(id.description) AND NOT deleted
            """).map(PostgresStore.storedItem)
    }

    func nextSeq() throws -> Int64 {
        known.cursor += 1
        known.cursorMoved = true
        return known.cursor
    }

    func saveItem(_ item: StoredItem) throws {
        let s = item.state
        // One item row per batch: rows of several items go in the order they were written (a
        // name one item leaves may be the name the next one takes).
        if known.batch.item != nil { flush() }
        known.items[item.id] = .some(item)
        known.nameCheck = nil
        var b = known.batch
        b.item = """
            INSERT INTO items(container_id, id, parent_id, name, kind, deleted, version, conflicts, state)
            VALUES (\(b.bind(cid)), \(b.bind(item.id.description)), \(b.bind(s.location.parent.description)), \(b.bind(s.location.name.value)),
                    \(b.bind(s.kind.rawValue)), \(b.bind(s.deleted)), \(b.bind(item.version)), \(b.bind(Int64(item.conflicts))), \(b.bind(try encode(s))))
            ON CONFLICT (container_id, id) DO UPDATE SET parent_id = excluded.parent_id, name = excluded.name,
                deleted = excluded.deleted, version = excluded.version, conflicts = excluded.conflicts, state = excluded.state
            """
        known.batch = b
    }

    func currentVersionSeq(of id: ItemID) throws -> Int64? {
        if let seq = known.currentSeqs[id] { return seq }
        let seq = try rows("SELECT seq FROM versions WHERE container_id = \(cid) AND item_id = \(id.description) AND role = 'current'")
            .first.map { try $0.decode(Int64.self) }
        known.currentSeqs[id] = .some(seq)
        return seq
    }

    func insertVersion(item: ItemID, seq: Int64, role: StoredRole, wasCurrent: Bool, state: ItemState) throws {
        if role == .current { known.currentSeqs[item] = .some(seq) }
        known.wasCurrent[item, default: [:]][seq] = wasCurrent
        if role.isEarlier { known.earlier[item] = nil }  // not made by the engine; read if asked
        var b = known.batch
        b.versions.append("(\(b.bind(cid)), \(b.bind(item.description)), \(b.bind(seq)), \(b.bind(role.rawValue)), \(b.bind(wasCurrent)), \(b.bind(state.modifiedBy.description)), \(b.bind(try encode(state))))")
        known.batch = b
    }

    func setRole(item: ItemID, seq: Int64, role: StoredRole, at time: Int64) throws {
        let retired: Int64? = role.isEarlier ? time : nil
        if role == .current {
            known.currentSeqs[item] = .some(seq)
        } else if let c = known.currentSeqs[item], c == seq {
            known.currentSeqs[item] = .some(nil)
        }
        if var earlier = known.earlier[item] {
            earlier.removeAll { $0.seq == seq }
            if role.isEarlier {
                if let was = known.wasCurrent[item]?[seq], let retired {
                    earlier.append(EarlierVersion(seq: seq, role: role, wasCurrent: was, retired: retired))
                    known.earlier[item] = earlier
                } else {
                    known.earlier[item] = nil
                }
            } else {
                known.earlier[item] = earlier
            }
        }
        if !known.batch.isEmpty { flush() }
        db.send("""
            UPDATE versions SET role = \(role.rawValue), retired = \(retired)
            WHERE container_id = \(cid) AND item_id = \(item.description) AND seq = \(seq)
            """)
    }

    func version(item: ItemID, seq: Int64) throws -> (role: StoredRole, state: ItemState)? {
        guard let row = try rows("SELECT role, state FROM versions WHERE container_id = \(cid) AND item_id = \(item.description) AND seq = \(seq)").first
        else { return nil }
        let (role, state) = try row.decode((String, String).self)
        guard let r = StoredRole(rawValue: role) else { return nil }
        return (r, try Codec.decodeState(state))
    }

    func versionSeqs(item: ItemID, role: StoredRole) throws -> [Int64] {
        try rows("SELECT seq FROM versions WHERE container_id = \(cid) AND item_id = \(item.description) AND role = \(role.rawValue) ORDER BY seq")
            .map { try $0.decode(Int64.self) }
    }

    func earlierVersions(of id: ItemID) throws -> [EarlierVersion] {
        if let known = known.earlier[id] { return known }
        return try rows("""
            SELECT seq, role, was_current, retired FROM versions
            WHERE container_id = \(cid) AND item_id = \(id.description) AND role IN ('previous', 'discarded')
            """).map { row in
            let (seq, role, wasCurrent, retired) = try row.decode((Int64, String, Bool, Int64?).self)
            guard let r = StoredRole(rawValue: role), let retired else {
                throw APIError(.internal, "corrupt earlier version \(seq) of item \(id) in the database")
            }
            return EarlierVersion(seq: seq, role: r, wasCurrent: wasCurrent, retired: retired)
        }
    }

    func deleteVersions(item: ItemID, seqs: [Int64], historyFloor: Int64?) throws {
        known.earlier[item]?.removeAll { seqs.contains($0.seq) }
        if !known.batch.isEmpty { flush() }
        // Only earlier rows, whatever the caller asks: the current and conflict versions stay.
        db.send("""
            DELETE FROM versions WHERE container_id = \(cid) AND item_id = \(item.description)
              AND role IN ('previous', 'discarded') AND seq = ANY(\(seqs))
            """)
        if let historyFloor {
            db.send("""
                UPDATE items SET history_floor = GREATEST(history_floor, \(historyFloor))
                WHERE container_id = \(cid) AND id = \(item.description)
                """)
        }
    }

    func appendJournal(seq: Int64, kind: ChangeKind, item: StoredItem, device: DeviceID) throws {
        var b = known.batch
        b.journal.append("(\(b.bind(cid)), \(b.bind(seq)), \(b.bind(item.id.description)), \(b.bind(kind.rawValue)), \(b.bind(device.description)), \(b.bind(try Codec.encode(item.record))))")
        known.batch = b
    }

    /// Locks the rows it finds (FOR KEY SHARE) until the commit ends: the garbage collector
    /// deletes an ownership only under FOR UPDATE, so it either sees this commit's versions or
    /// leaves the rows alone, and a row it deleted first is not found here (`missing_chunks`).
    func ownedChunks(_ hashes: [ContentHash]) throws -> [ContentHash: Int64] {
        try PostgresStore.ownedChunks(try rows(PostgresStore.ownedChunksQuery(account: container.accountID, hashes, lock: true)))
    }
}
