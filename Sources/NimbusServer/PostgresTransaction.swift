import Logging
import NIOCore
import NimbusCore
import NimbusProtocol
import PostgresNIO
import Synchronization

/// Queries on one leased connection for the synchronous `StoreTransaction` code, in two ways:
/// - on the connection's event loop (`deferring`, `PostgresStore.commitOnLoop`), where nothing may
///   wait: a read throws `WouldWait` (the commit is rolled back and run again on a pool thread),
///   and writes are kept in `deferred` and sent with COMMIT when the synchronous part is done
///   (`commitDeferred`);
/// - on a thread of the store's own thread pool (never an event loop), which blocks for answers
///   while the connection's event loop does the I/O.
///
/// On a pool thread, writes whose answer nothing needs (`send`) are queued on the connection without waiting: the
/// event loop sends each as soon as the one before is answered, and the thread waits only at the
/// next read or at COMMIT (`settle`). A failed write aborts the transaction, so the first error
/// of the queued writes is the one reported, whatever failed after it.
///
/// Prepared statements (parsed and planned once per connection instead of at every call: planning
/// the commit's statements costs PostgreSQL more than running them) run only from async code in
/// PostgresNIO, so a task hands each over. Statements after one of them wait for its answer
/// (`chain`) and so reach the connection in the order they were made.
final class PostgresSync {
    let conn: PostgresConnection
    let logger: Logger
    private let counters: PostgresCounters?
    private var pending: [EventLoopFuture<Void>] = []
    /// Answered when the last prepared statement handed to a task and every statement queued
    /// after it are; nil when nothing waits on a task.
    private var chain: EventLoopFuture<Void>?
    /// Writes are kept, reads throw `WouldWait`.
    let deferring: Bool
    /// The writes kept by a `deferring` transaction, in the order they were made, with the name of
    /// the prepared statement each runs (nil: a plain query).
    private(set) var deferred: [Deferred] = []
    typealias Deferred = (prepared: String?, run: @Sendable (PostgresConnection, Logger) async throws -> Void)
    /// Which prepared statements ran on which connection (`commitDeferred`).
    private let warm: WarmStatements?

    /// A deferring transaction needed an answer from the database before it could go on.
    struct WouldWait: Error {}

    init(conn: PostgresConnection, logger: Logger, counters: PostgresCounters? = nil, deferring: Bool = false,
         warm: WarmStatements? = nil) {
        self.conn = conn
        self.logger = logger
        self.counters = counters
        self.deferring = deferring
        self.warm = warm
    }

    /// Sends `q` now (written before the caller's next wait, in the order of the calls).
    static func start(_ q: PostgresQuery, on conn: PostgresConnection, logger: Logger) -> EventLoopFuture<PostgresQueryResult> {
        let loop = conn.eventLoop
        // Checked on the connection's loop, where it closes: a statement written to a closed
        // connection is dropped without an answer, and would be waited for for ever.
        func send() -> EventLoopFuture<PostgresQueryResult> {
            conn.isClosed ? loop.makeFailedFuture(closed) : conn.query(q, logger: logger)
        }
        return loop.inEventLoop ? send() : loop.flatSubmit(send)
    }

    /// What a statement for a connection that closed meanwhile fails with.
    static let closed = APIError(.unavailable, "the connection to the metadata database closed; retry later")

    /// `q`'s answer, sent now or after the chain.
    private func start(_ q: PostgresQuery) -> EventLoopFuture<PostgresQueryResult> {
        let conn = conn, logger = logger
        guard let chain else { return Self.start(q, on: conn, logger: logger) }
        let answer = chain.flatMap { Self.start(q, on: conn, logger: logger) }
        self.chain = answer.map { _ in }
        return answer
    }

    /// Runs a prepared statement in a task (after the chain, if any) and collects its rows.
    private func start<S: PostgresPreparedStatement>(_ statement: S) -> EventLoopFuture<[PostgresRow]> where S.Row == PostgresRow {
        let conn = conn, logger = logger
        let run = { @Sendable () -> EventLoopFuture<[PostgresRow]> in
            let promise = conn.eventLoop.makePromise(of: [PostgresRow].self)
            // On the connection's own event loop: the statement is written and its rows are read
            // there, with no thread between them and the connection.
            Task(executorPreference: LoopTaskExecutor(conn.eventLoop)) {
                do {
                    guard !conn.isClosed else { throw Self.closed }
                    var out: [PostgresRow] = []
                    for try await row in try await conn.execute(statement, logger: logger) { out.append(row) }
                    promise.succeed(out)
                } catch {
                    promise.fail(error)
                }
            }
            return promise.futureResult
        }
        let answer = chain.map { $0.flatMap(run) } ?? run()
        chain = answer.map { _ in }
        return answer
    }

    func rows(_ q: PostgresQuery) throws -> [PostgresRow] {
        if deferring { throw WouldWait() }
        let answer = start(q)
        counters?.statement(waited: true)
        try settle()
        return try answer.wait().rows
    }

    /// Runs a prepared statement and waits for its rows.
    func rows<S: PostgresPreparedStatement>(prepared statement: S) throws -> [PostgresRow] where S.Row == PostgresRow {
        if deferring { throw WouldWait() }
        let answer = start(statement)
        counters?.statement(waited: true)
        try settle()
        return try answer.wait()
    }

    /// Sends `q` and waits for it (and for every write queued before it).
    func exec(_ q: PostgresQuery) throws {
        if deferring { throw WouldWait() }
        send(q)
        counters?.waited()
        try settle()
    }

    /// Queues `q`; its outcome is checked at the next read, `exec` or `settle`.
    func send(_ q: PostgresQuery) {
        counters?.statement(waited: false)
        if deferring {
            deferred.append((nil, { conn, logger in _ = try await Self.start(q, on: conn, logger: logger).get() }))
            return
        }
        pending.append(start(q).map { _ in })
    }

    /// Queues a prepared statement whose rows nothing needs.
    func send<S: PostgresPreparedStatement>(prepared statement: S) where S.Row == PostgresRow {
        counters?.statement(waited: false)
        if deferring {
            deferred.append((S.name, { conn, logger in
                guard !conn.isClosed else { throw Self.closed }
                for try await _ in try await conn.execute(statement, logger: logger) {}
            }))
            return
        }
        pending.append(start(statement).map { _ in })
    }

    /// Sends the kept writes and COMMIT, then awaits them: one wait for the whole tail of the
    /// transaction when every prepared statement among them already ran on this connection
    /// (`warm`), else one per statement. Called from a task on the connection's event loop. Throws
    /// the first write's error: the transaction was then rolled back, whatever COMMIT answered.
    ///
    /// Together, each statement is written by a task of its own, all started here in order on the
    /// connection's loop: the loop runs its jobs in the order they came, and each task writes its
    /// statement in its first job, so the statements reach the connection in order. Not so for a
    /// prepared statement's first run on a connection: PostgresNIO parses it first and holds its
    /// execution until PostgreSQL answered, letting what was sent after it overtake it, so then
    /// every statement waits for the one before.
    func commitDeferred() async throws {
        let commit: Deferred = (nil, { conn, logger in _ = try await Self.start("COMMIT", on: conn, logger: logger).get() })
        let statements = deferred + [commit]
        deferred = []
        counters?.statement(waited: false)
        let conn = conn, logger = logger
        let prepared = statements.compactMap(\.prepared)
        guard let warm, warm.contains(prepared, on: conn.id) else {
            for statement in statements {
                counters?.waited()
                try await statement.run(conn, logger)
            }
            warm?.insert(prepared, on: conn.id)
            return
        }
        counters?.waited()
        let executor = LoopTaskExecutor(conn.eventLoop)
        let answers = statements.map { statement in
            let promise = conn.eventLoop.makePromise(of: Void.self)
            let run = statement.run
            Task(executorPreference: executor) {
                do {
                    try await run(conn, logger)
                    promise.succeed()
                } catch {
                    promise.fail(error)
                }
            }
            return promise.futureResult
        }
        var first: (any Error)?
        for answer in answers {
            do { try await answer.get() } catch { if first == nil { first = error } }
        }
        if let first { throw first }
    }

    /// Waits for the queued writes; throws the first one's error.
    func settle() throws {
        let queued = pending
        pending = []
        defer { chain = nil }
        guard !queued.isEmpty else { return }
        var first: (any Error)?
        for answer in queued {
            do { try answer.wait() } catch { if first == nil { first = error } }
        }
        if let first { throw first }
    }
}

/// The prepared statements that ran to completion on each connection (by the pool's connection id,
/// never reused): PostgresNIO has them prepared there, and executes them as soon as they are sent.
final class WarmStatements: Sendable {
    private let seen = Mutex<Set<String>>([])

    func contains(_ names: [String], on connection: Int) -> Bool {
        seen.withLock { s in names.allSatisfy { s.contains("\(connection) \($0)") } }
    }

    func insert(_ names: [String], on connection: Int) {
        seen.withLock { s in
            // Connections come and go; forgetting them all costs one unpipelined commit each.
            if s.count > 10_000 { s.removeAll() }
            for n in names { s.insert("\(connection) \(n)") }
        }
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
                       AND NOT n.deleted AND n.id <> $2),
               coalesce(c.watched_until > now(), false),
               (SELECT quota FROM accounts a WHERE a.id = c.account_id)
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
    /// cursor, seen, the item (id, version, conflicts, state), its current version (seq,
    /// was_current), its earlier versions (seqs, roles, was_current, retired), the parent (id,
    /// version, conflicts, state), whether the name is taken, whether a long-poll may wait on the
    /// container (`PostgresStore.watch`: the commit NOTIFYs only then), the account's quota.
    typealias Columns = (Int64, Int64, String?, Int64?, Int64?, String?, Int64?, Bool?, [Int64], [String], [Bool], [Int64],
                         String?, Int64?, Int64?, String?, Bool, Bool, Int64?)

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

/// The writes a commit gathers (`PostgresTransaction.Batch`), as one statement of fixed shape so
/// that it is prepared once per connection: rows go in as arrays, a missing item row, cursor or
/// notification as NULL.
struct CommitWrites: PostgresPreparedStatement {
    typealias Row = PostgresRow
    static let name = "nimbus_commit_writes"
    static let sql = """
        WITH w0 AS (INSERT INTO versions(container_id, item_id, seq, role, was_current, device_id, state)
                    SELECT $1, v.item, v.seq, v.role, v.was, v.device, v.state
                    FROM unnest($2::text[], $3::int8[], $4::text[], $5::bool[], $6::text[], $7::text[]) AS v(item, seq, role, was, device, state)),
             w1 AS (INSERT INTO items(container_id, id, parent_id, name, kind, deleted, version, conflicts, state)
                    SELECT $1, $8, $9, $10, $11, $12, $13, $14, $15 WHERE $8::text IS NOT NULL
                    ON CONFLICT (container_id, id) DO UPDATE SET parent_id = excluded.parent_id, name = excluded.name,
                        deleted = excluded.deleted, version = excluded.version, conflicts = excluded.conflicts, state = excluded.state),
             w2 AS (INSERT INTO journal(container_id, seq, item_id, kind, device_id, record)
                    SELECT $1, j.seq, j.item, j.kind, j.device, j.record
                    FROM unnest($16::int8[], $17::text[], $18::text[], $19::text[], $20::text[]) AS j(seq, item, kind, device, record)),
             w3 AS (UPDATE containers SET cursor = coalesce($21::int8, cursor), meta_bytes = meta_bytes + $24
                    WHERE id = $1 AND ($21::int8 IS NOT NULL OR $24::int8 <> 0))
        SELECT pg_notify($22, $23) WHERE $23::text IS NOT NULL
        """
    static let bindingDataTypes: [PostgresDataType] = [
        .int8, .textArray, .int8Array, .textArray, .boolArray, .textArray, .textArray,
        .text, .text, .text, .text, .bool, .int8, .int8, .text,
        .int8Array, .textArray, .textArray, .textArray, .textArray,
        .int8, .text, .text, .int8,
    ]

    struct Versions {
        var item: [String] = [], seq: [Int64] = [], role: [String] = [], wasCurrent: [Bool] = [], device: [String] = [], state: [String] = []
        mutating func append(item: String, seq: Int64, role: String, wasCurrent: Bool, device: String, state: String) {
            self.item.append(item); self.seq.append(seq); self.role.append(role)
            self.wasCurrent.append(wasCurrent); self.device.append(device); self.state.append(state)
        }
    }
    struct Item {
        var id: String, parent: String, name: String, kind: String, deleted: Bool, version: Int64, conflicts: Int64, state: String
    }
    struct Journal {
        var seq: [Int64] = [], item: [String] = [], kind: [String] = [], device: [String] = [], record: [String] = []
        mutating func append(seq: Int64, item: String, kind: String, device: String, record: String) {
            self.seq.append(seq); self.item.append(item); self.kind.append(kind); self.device.append(device); self.record.append(record)
        }
    }

    var container: Int64
    var versions: Versions
    var item: Item?
    var journal: Journal
    var cursor: Int64?
    /// (channel, payload)
    var notify: (String, String)?
    /// Bytes added to the container's metadata count.
    var metadata: Int64 = 0

    func makeBindings() throws -> PostgresBindings {
        var b = PostgresBindings(capacity: 24)
        b.append(container)
        b.append(versions.item); b.append(versions.seq); b.append(versions.role)
        b.append(versions.wasCurrent); b.append(versions.device); b.append(versions.state)
        b.append(item?.id); b.append(item?.parent); b.append(item?.name); b.append(item?.kind)
        b.append(item?.deleted); b.append(item?.version); b.append(item?.conflicts); b.append(item?.state)
        b.append(journal.seq); b.append(journal.item); b.append(journal.kind); b.append(journal.device); b.append(journal.record)
        b.append(cursor)
        b.append(notify?.0); b.append(notify?.1)
        b.append(metadata)
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
        /// Metadata bytes stored by this transaction (`metadataAdded`), and those not yet added
        /// to the container's count.
        var metadataAdded: Int64 = 0
        var metadataUnsent: Int64 = 0
        /// The account's quota as the lock's statement read it (nil: not read).
        var quota: Int64??
        init(cursor: Int64) { self.cursor = cursor }
    }

    /// Writes sent together as one statement (`CommitWrites`).
    struct Batch {
        var versions = CommitWrites.Versions()
        var item: CommitWrites.Item?
        var journal = CommitWrites.Journal()
        var isEmpty: Bool { versions.item.isEmpty && item == nil && journal.seq.isEmpty }
    }

    init(db: PostgresSync, container: ContainerRecord, cursor: Int64, quota: Int64??, prefetched: PostgresPrefetch?) {
        self.db = db
        self.container = container
        known = Known(cursor: cursor)
        known.quota = quota
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
        let b = known.batch
        known.batch = Batch()
        let cursor = known.cursorMoved ? known.cursor : nil
        known.cursorMoved = false
        let notify = known.notify
        known.notify = nil
        let metadata = known.metadataUnsent
        known.metadataUnsent = 0
        guard !b.isEmpty || cursor != nil || notify != nil || metadata != 0 else { return }
        db.send(prepared: CommitWrites(container: cid, versions: b.versions, item: b.item, journal: b.journal,
                                       cursor: cursor, notify: notify.map { (PostgresStore.channel, $0) }, metadata: metadata))
    }

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

    func firstState(of id: ItemID) throws -> ItemState? {
        guard let row = try rows("""
            SELECT v.state, i.history_floor FROM versions v
            JOIN items i ON i.container_id = v.container_id AND i.id = v.item_id
            WHERE v.container_id = \(cid) AND v.item_id = \(id.description) AND v.was_current
            ORDER BY v.seq LIMIT 1
            """).first else { return nil }
        let (state, floor) = try row.decode((String, Int64).self)
        return floor == 0 ? try Codec.decodeState(state) : nil
    }

    func currentStatesMade(of id: ItemID, after version: Int64) throws -> [(seq: Int64, by: DeviceID?)] {
        try rows("""
            SELECT v.seq, j.device_id FROM versions v LEFT JOIN journal j ON j.container_id = v.container_id AND j.seq = v.seq
            WHERE v.container_id = \(cid) AND v.item_id = \(id.description) AND v.was_current AND v.seq > \(version) ORDER BY v.seq
            """).map { row in
            let (seq, device) = try row.decode((Int64, String?).self)
            return (seq, device.flatMap(DeviceID.init))
        }
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
        known.batch.item = CommitWrites.Item(id: item.id.description, parent: s.location.parent.description, name: s.location.name.value,
                                             kind: s.kind.rawValue, deleted: s.deleted, version: item.version,
                                             conflicts: Int64(item.conflicts), state: try encode(s))
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
        let text = try encode(state)
        known.batch.versions.append(item: item.description, seq: seq, role: role.rawValue, wasCurrent: wasCurrent,
                                    device: state.modifiedBy.description, state: text)
        known.metadataAdded += Int64(text.utf8.count)
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
            WITH gone AS (DELETE FROM versions WHERE container_id = \(cid) AND item_id = \(item.description)
                            AND role IN ('previous', 'discarded') AND seq = ANY(\(seqs))
                          RETURNING octet_length(state) AS n)
            UPDATE containers SET meta_bytes = meta_bytes - (SELECT coalesce(sum(n), 0) FROM gone) WHERE id = \(cid)
            """)
        if let historyFloor {
            db.send("""
                UPDATE items SET history_floor = GREATEST(history_floor, \(historyFloor))
                WHERE container_id = \(cid) AND id = \(item.description)
                """)
        }
    }

    func appendJournal(seq: Int64, kind: ChangeKind, item: StoredItem, device: DeviceID) throws {
        let record = try Codec.encode(item.record)
        known.batch.journal.append(seq: seq, item: item.id.description, kind: kind.rawValue, device: device.description,
                                   record: record)
        known.metadataAdded += Int64(record.utf8.count)
    }

    var metadataAdded: Int64 { known.metadataAdded }

    /// Sent with the next batch (or the commit's last statement).
    func recordMetadata() throws {
        known.metadataUnsent += known.metadataAdded
    }

    func accountQuota() throws -> Int64? {
        if let q = known.quota { return q }
        let q = try rows("SELECT quota FROM accounts WHERE id = \(container.accountID)").first?.decode(Int64?.self) ?? nil
        known.quota = .some(q)
        return q
    }

    /// A read: the gathered writes (and the metadata count) go first.
    func accountUsage() throws -> Int64 {
        flush()
        return try PostgresStore.usage(db, account: container.accountID)
    }

    /// Locks the rows it finds (FOR KEY SHARE) until the commit ends: the garbage collector
    /// deletes an ownership only under FOR UPDATE, so it either sees this commit's versions or
    /// leaves the rows alone, and a row it deleted first is not found here (`missing_chunks`).
    func ownedChunks(_ hashes: [ContentHash]) throws -> [ContentHash: Int64] {
        try PostgresStore.ownedChunks(try rows(PostgresStore.ownedChunksQuery(account: container.accountID, hashes, lock: true)))
    }

    // MARK: Recently Deleted (the item row is written first: these follow it)

    private func sendAfterBatch(_ q: PostgresQuery) {
        if !known.batch.isEmpty { flush() }
        db.send(q)
    }

    func markTrashed(_ id: ItemID, at time: Int64, by device: DeviceID, bytes: Int64) throws {
        sendAfterBatch("""
            UPDATE items SET deleted_at = \(time), deleted_by = \(device.description), trash_root = id, trash_bytes = \(bytes)
            WHERE container_id = \(cid) AND id = \(id.description)
            """)
    }

    func adoptTrash(into folder: ItemID, deletedSince since: Int64) throws {
        sendAfterBatch("""
            UPDATE items SET trash_root = \(folder.description) WHERE container_id = \(cid) AND deleted AND trash_root IN (
                SELECT id FROM items WHERE container_id = \(cid) AND parent_id = \(folder.description) AND deleted AND trash_root = id
                  AND deleted_at >= \(since) AND id <> \(folder.description))
            """)
    }

    func trashRoot(of id: ItemID) throws -> ItemID? {
        try rows("SELECT trash_root FROM items WHERE container_id = \(cid) AND id = \(id.description)")
            .first.flatMap { try $0.decode(String?.self) }.flatMap(ItemID.init)
    }

    func clearTrash(_ id: ItemID) throws {
        sendAfterBatch("""
            UPDATE items SET deleted_at = NULL, deleted_by = NULL, trash_root = NULL, trash_bytes = NULL
            WHERE container_id = \(cid) AND id = \(id.description)
            """)
    }

    func trashMembers(of root: ItemID) throws -> [(id: ItemID, parent: ItemID)] {
        try rows("SELECT id, parent_id FROM items WHERE container_id = \(cid) AND trash_root = \(root.description) AND deleted").map { row in
            let (id, parent) = try row.decode((String, String).self)
            guard let i = ItemID(id), let p = ItemID(parent) else { throw APIError(.internal, "corrupt item id \(id) in the database") }
            return (i, p)
        }
    }

    func setTrashRoot(_ ids: [ItemID], to root: ItemID) throws {
        guard !ids.isEmpty else { return }
        sendAfterBatch("""
            UPDATE items SET trash_root = \(root.description) WHERE container_id = \(cid) AND deleted AND id = ANY(\(ids.map(\.description)))
            """)
    }

    private func trashRows(_ q: PostgresQuery) throws -> [TrashRow] {
        try rows(q).map { row in
            let (id, version, conflicts, state, at, by, n, bytes) = try row.decode((String, Int64, Int64, String, Int64?, String?, Int64, Int64).self)
            guard let device = by.flatMap(DeviceID.init), let at,
                  let item = try PostgresStore.storedItem(id, version, conflicts, state) else {
                throw APIError(.internal, "corrupt deletion of item \(id) in the database")
            }
            return TrashRow(item: item, deletedAt: at, deletedBy: device, items: Int(n), bytes: bytes)
        }
    }

    func trashEntries(after: TrashCursor?, limit: Int) throws -> [TrashRow] {
        // The first page starts after the newest possible entry.
        let at = after?.deletedAt ?? Int64.max, id = after?.id.description ?? ""
        return try trashRows("""
            SELECT r.id, r.version, r.conflicts, r.state, r.deleted_at, r.deleted_by,
                (SELECT count(*) FROM items m WHERE m.container_id = r.container_id AND m.trash_root = r.id AND m.deleted),
                (SELECT coalesce(sum(m.trash_bytes), 0)::bigint FROM items m WHERE m.container_id = r.container_id AND m.trash_root = r.id AND m.deleted)
            FROM items r WHERE r.container_id = \(cid) AND r.trash_root = r.id AND r.deleted
              AND (r.deleted_at < \(at) OR (r.deleted_at = \(at) AND \(after == nil) = false AND r.id < \(id)))
            ORDER BY r.deleted_at DESC, r.id DESC LIMIT \(Int64(limit))
            """)
    }

    func trashEntry(_ id: ItemID) throws -> TrashRow? {
        try trashRows("""
            SELECT r.id, r.version, r.conflicts, r.state, r.deleted_at, r.deleted_by,
                (SELECT count(*) FROM items m WHERE m.container_id = r.container_id AND m.trash_root = r.id AND m.deleted),
                (SELECT coalesce(sum(m.trash_bytes), 0)::bigint FROM items m WHERE m.container_id = r.container_id AND m.trash_root = r.id AND m.deleted)
            FROM items r WHERE r.container_id = \(cid) AND r.id = \(id.description) AND r.trash_root = r.id AND r.deleted
            """).first
    }

    func trashTotals() throws -> TrashTotals {
        guard let row = try rows("""
            SELECT count(*) FILTER (WHERE id = trash_root), count(*), coalesce(sum(trash_bytes), 0)::bigint
            FROM items WHERE container_id = \(cid) AND trash_root IS NOT NULL AND deleted
            """).first else { return TrashTotals(entries: 0, items: 0, bytes: 0) }
        let (entries, items, bytes) = try row.decode((Int64, Int64, Int64).self)
        return TrashTotals(entries: Int(entries), items: Int(items), bytes: bytes)
    }

    func purgeItems(_ ids: [ItemID]) throws -> Set<ContentHash> {
        guard !ids.isEmpty else { return [] }
        for id in ids { known.items[id] = .some(nil); known.currentSeqs[id] = .some(nil); known.earlier[id] = nil }
        let list = ids.map(\.description)
        var hashes = Set<ContentHash>()
        for row in try rows("SELECT state FROM versions WHERE container_id = \(cid) AND item_id = ANY(\(list))") {
            for c in try Codec.decodeState(try row.decode(String.self)).content.chunks { hashes.insert(c.hash) }
        }
        sendAfterBatch("""
            WITH gone AS (DELETE FROM versions WHERE container_id = \(cid) AND item_id = ANY(\(list)) RETURNING octet_length(state) AS n)
            UPDATE containers SET meta_bytes = meta_bytes - (SELECT coalesce(sum(n), 0) FROM gone) WHERE id = \(cid)
            """)
        db.send("DELETE FROM items WHERE container_id = \(cid) AND deleted AND id = ANY(\(list))")
        db.send("INSERT INTO purged_items(container_id, id) SELECT \(cid), unnest(\(list)::text[]) ON CONFLICT DO NOTHING")
        return hashes
    }

    func wasPurged(_ id: ItemID) throws -> Bool {
        !(try rows("SELECT 1 FROM purged_items WHERE container_id = \(cid) AND id = \(id.description)").isEmpty)
    }
}
