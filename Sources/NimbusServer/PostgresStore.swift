import Foundation
import Logging
import NIOCore
import NIOPosix
import NimbusCore
import NimbusProtocol
import PostgresNIO
import Synchronization

/// The scale-out metadata engine: PostgreSQL, shared by any number of `nimbus serve` instances.
///
/// The race rules are `CommitEngine`'s, over `PostgresTransaction`. Each commit is one
/// READ COMMITTED transaction that first locks its container row (`SELECT cursor … FOR UPDATE`):
/// commits to one container are serialized across all instances, which keeps journal sequences
/// gap-free, while commits to different containers run in parallel. Deadlocks and serialization
/// failures (possible only between unrelated statements, e.g. concurrent account creation) are
/// retried. Each commit announces its new cursor with `pg_notify`, delivered on COMMIT only.
public final class PostgresStore: ServerStore {
    public let location: PostgresLocation
    let client: PostgresClient
    let runner: Task<Void, Never>
    /// Threads that run synchronous transaction code that reads as it goes (`write(locking:)`, and
    /// commits that need more than their first statement read); one waiting for a container lock
    /// blocks one.
    let threads: NIOThreadPool
    let logger: Logger
    let counters = PostgresCounters()
    let warm = WarmStatements()
    /// What commits and resolves prune (`HistoryRetention`).
    public let history: HistoryRetention
    /// The NOTIFY channel on which commits announce "CONTAINER:CURSOR".
    static let channel = "nimbus_commits"
    /// Until when (this process's clock) each container is known watched (`watch`).
    let watched = Mutex<[Int64: ContinuousClock.Instant]>([:])
    /// Connections an answer timeout is closing. Over TLS a close waits for the server's
    /// close_notify (up to NIOSSL's shutdown timeout), and meanwhile the pool can hand the
    /// connection out again: `answered` waits for such a one to close and takes another.
    let closing = Mutex<Set<ObjectIdentifier>>([])

    private init(location: PostgresLocation, logger: Logger, history: HistoryRetention) {
        self.location = location
        self.logger = logger
        self.history = history
        // The pool's own chatter (reconnects, closing on shutdown) only at warning and above.
        var background = logger
        background.logLevel = max(logger.logLevel, .warning)
        client = PostgresClient(configuration: location.clientConfiguration, backgroundLogger: background)
        let client = client
        runner = Task { await client.run() }
        threads = NIOThreadPool(numberOfThreads: 16)
        threads.start()
    }

    /// Connects, applies pending schema migrations and returns the store. Fails with a message
    /// naming the database when it cannot be reached.
    public static func open(_ location: PostgresLocation, logger: Logger = Logger(label: "nimbus.postgres"),
                            history: HistoryRetention = .default) async throws -> PostgresStore {
        let store = PostgresStore(location: location, logger: logger, history: history)
        do {
            try await location.probe(logger: logger)
            let applied = try await store.client.withConnection { conn in try await PostgresSchema.migrate(conn, logger: logger) }
            if !applied.isEmpty { logger.info("applied schema migrations \(applied) to \(location)") }
        } catch {
            await store.shutdown()
            throw APIError(.unavailable, "cannot open the PostgreSQL metadata database \(location): \(location.connectFailure(error)); check that the server runs, the URL, user and password are right and the database exists (createdb)")
        }
        return store
    }

    /// Closes the connections. The store is unusable afterwards.
    public func shutdown() async {
        runner.cancel()
        _ = await runner.value
        try? await threads.shutdownGracefully()
    }

    // MARK: transactions

    /// Runs `body` in one transaction on a pool thread, after locking `container`'s row when given.
    /// Rolls back on any error; retries the whole transaction on deadlock or serialization failure.
    func write<R: Sendable>(locking container: ContainerRecord?, _ body: @escaping @Sendable (PostgresSync) throws -> R) async throws -> R {
        try await transaction { db in
            if let c = container {
                guard !(try db.rows("SELECT cursor FROM containers WHERE id = \(c.id) FOR UPDATE")).isEmpty else {
                    throw APIError.containerNotFound(c.name)
                }
            }
            return try body(db)
        }
    }

    /// A commit's transaction: one statement locks `container`'s row and reads what the commit
    /// reads first (`PostgresPrefetch`: the item, its current version, and for `place` — the
    /// folder and name a commit puts the item in — that folder and whether the name is taken),
    /// then `body` runs `CommitEngine`, then the gathered writes go out with the notification.
    ///
    /// It runs first as a task on the connection's event loop (`commitOnLoop`), where no thread
    /// waits for the database: the common commit reads nothing beyond the prefetch. A commit that
    /// needs another read there is rolled back and run again on a pool thread, where reads wait.
    ///
    /// The statement reads as of its start; when it had to wait for the lock, another commit to
    /// the container may have changed those rows meanwhile. Every commit that writes moves the
    /// cursor, so the cursor as of the start (`seen`, a subquery: not read again after the wait)
    /// equal to the locked row's means nothing changed; otherwise the statement runs once more
    /// under the lock it now holds, and reads the latest rows.
    func commitTransaction(_ container: ContainerRecord, item: ItemID, place: (parent: ItemID, name: String)?,
                           _ body: @escaping @Sendable (PostgresTransaction) throws -> CommitResponse) async throws -> CommitResponse {
        let parent = place.map(\.parent).flatMap { $0.isRoot || $0 == item ? nil : $0 }
        let statement = CommitPrefetch(container: container.id, item: item.description, parent: parent?.description ?? "",
                                       placeParent: place?.parent.description ?? "", placeName: place?.name ?? "")
        let prefetch = { @Sendable (columns: CommitPrefetch.Columns) throws -> PostgresPrefetch? in
            try Self.prefetch(columns, item: item, parent: parent, place: place)
        }
        if let response = try await retrying({
            try await self.commitOnLoop(container, statement: statement, prefetch: prefetch, body)
        }) {
            return response
        }
        return try await transaction { db in
            func read() throws -> CommitPrefetch.Columns {
                guard let row = try db.rows(prepared: statement).first else { throw APIError.containerNotFound(container.name) }
                return try row.decode(CommitPrefetch.Columns.self)
            }
            var columns = try read()
            // Another commit went in while this one waited for the lock: read again under it.
            if columns.0 != columns.1 { columns = try read() }
            let tx = PostgresTransaction(db: db, container: container, cursor: columns.0, quota: .some(columns.18), prefetched: try prefetch(columns))
            let response = try body(tx)
            // Other instances' long-polls learn of it by NOTIFY, sent by PostgreSQL on COMMIT only.
            tx.finish(notify: Self.notification(container, response, watched: columns.17))
            return response
        }
    }

    /// `commitTransaction` as a task on the connection's event loop: BEGIN and the prefetch, `body`
    /// with reads refused (`PostgresSync.deferring`), then its writes with COMMIT right behind them
    /// (`commitDeferred`), one wait. No thread waits for the database. nil: `body` needed a read;
    /// the transaction was rolled back.
    private func commitOnLoop(_ container: ContainerRecord, statement: CommitPrefetch,
                              prefetch: @escaping @Sendable (CommitPrefetch.Columns) throws -> PostgresPrefetch?,
                              _ body: @escaping @Sendable (PostgresTransaction) throws -> CommitResponse) async throws -> CommitResponse? {
        let logger = logger, counters = counters, warm = warm
        return try await client.withConnection { conn in
            try await self.answered(on: conn) {
            try await withTaskExecutorPreference(LoopTaskExecutor(conn.eventLoop)) {
                func read() async throws -> CommitPrefetch.Columns {
                    counters.statement(waited: true)
                    guard !conn.isClosed else { throw PostgresSync.closed }
                    var rows: [PostgresRow] = []
                    for try await row in try await conn.execute(statement, logger: logger) { rows.append(row) }
                    guard let row = rows.first else { throw APIError.containerNotFound(container.name) }
                    return try row.decode(CommitPrefetch.Columns.self)
                }
                // BEGIN goes out with the prefetch, in order: both are written before any wait.
                counters.statement(waited: false)
                let begun = PostgresSync.start("BEGIN", on: conn, logger: logger)
                do {
                    var columns = try await read()
                    try await begun.get()
                    // Another commit went in while this one waited for the lock: read again under it.
                    if columns.0 != columns.1 { columns = try await read() }
                    let db = PostgresSync(conn: conn, logger: logger, counters: counters, deferring: true, warm: warm)
                    let tx = PostgresTransaction(db: db, container: container, cursor: columns.0, quota: .some(columns.18), prefetched: try prefetch(columns))
                    let response: CommitResponse
                    do {
                        response = try body(tx)
                    } catch is PostgresSync.WouldWait {
                        _ = try await PostgresSync.start("ROLLBACK", on: conn, logger: logger).get()
                        return nil
                    }
                    tx.finish(notify: Self.notification(container, response, watched: columns.17))
                    try await db.commitDeferred()
                    return response
                } catch {
                    _ = try? await PostgresSync.start("ROLLBACK", on: conn, logger: logger).get()
                    throw error
                }
            }
            }
        }
    }

    /// The NOTIFY payload announcing `response` ("CONTAINER:CURSOR"), sent by PostgreSQL on COMMIT
    /// only; none when nothing was committed or no long-poll can be waiting on the container.
    static func notification(_ container: ContainerRecord, _ response: CommitResponse, watched: Bool) -> String? {
        response.cursor > 0 && watched ? "\(container.id):\(response.cursor)" : nil
    }

    /// The prefetch's columns as what `PostgresTransaction` knows; nil when another commit changed
    /// the rows after they were read (`seen` ≠ `cursor`).
    static func prefetch(_ columns: CommitPrefetch.Columns, item: ItemID, parent: ItemID?,
                         place: (parent: ItemID, name: String)?) throws -> PostgresPrefetch? {
        let (cursor, seen, iid, iversion, iconflicts, istate, seq, wasCurrent, seqs, roles, wereCurrent, retired,
             pid, pversion, pconflicts, pstate, taken, _, _) = columns
        guard seen == cursor else { return nil }
        var p = PostgresPrefetch(cursor: cursor, item: item, row: try storedItem(iid, iversion, iconflicts, istate),
                                 current: seq.map { ($0, wasCurrent ?? true) })
        guard roles.count == seqs.count, wereCurrent.count == seqs.count, retired.count == seqs.count else {
            throw APIError(.internal, "corrupt earlier versions of item \(item) in the database")
        }
        p.earlier = try seqs.indices.map { k in
            guard let role = StoredRole(rawValue: roles[k]), retired[k] >= 0 else {
                throw APIError(.internal, "corrupt earlier version \(seqs[k]) of item \(item) in the database")
            }
            return EarlierVersion(seq: seqs[k], role: role, wasCurrent: wereCurrent[k], retired: retired[k])
        }
        if let parent { p.parent = (parent, try storedItem(pid, pversion, pconflicts, pstate)) }
        if let place { p.nameCheck = (place.parent, place.name, taken) }
        return p
    }

    /// A row of `items` read through a LEFT JOIN (all nil: no row).
    static func storedItem(_ id: String?, _ version: Int64?, _ conflicts: Int64?, _ state: String?) throws -> StoredItem? {
        guard let id, let version, let conflicts, let state else { return nil }
        guard let itemID = ItemID(id) else { throw APIError(.internal, "corrupt item id \(id) in the database") }
        return StoredItem(id: itemID, version: version, conflicts: Int(conflicts), state: try Codec.decodeState(state))
    }

    /// BEGIN, `body`, COMMIT on a pool thread (BEGIN is queued with body's first statement, so it
    /// costs no wait). Rolls back on any error; retries the whole transaction on deadlock or
    /// serialization failure.
    private func transaction<R: Sendable>(_ body: @escaping @Sendable (PostgresSync) throws -> R) async throws -> R {
        try await retrying {
            try await self.client.withConnection { conn in
                try await self.answered(on: conn) {
                    try await self.threads.runIfActive {
                        let db = PostgresSync(conn: conn, logger: self.logger, counters: self.counters)
                        db.send("BEGIN")
                        do {
                            let result = try body(db)
                            try db.exec("COMMIT")
                            return result
                        } catch {
                            try? db.settle()
                            try? db.exec("ROLLBACK")
                            throw error
                        }
                    }
                }
            }
        }
    }

    /// Runs `body`, statements on `conn`, within `location.answerTimeout`: past it the connection
    /// is closed, which fails every wait on it, so a database that stops answering without closing
    /// (a network cut with no reset, a stopped server) costs a commit an error, not a request that
    /// never ends.
    private func answered<R: Sendable>(on conn: PostgresConnection, _ body: () async throws -> R) async throws -> R {
        let limit = location.answerTimeout
        // The pool may hand out a connection that is closed or still closing (one an answer
        // timeout closed): nothing is sent on it; the caller takes another once it has closed.
        let key = ObjectIdentifier(conn)
        if closing.withLock({ $0.contains(key) }) { await Self.closed(conn, within: limit) }
        guard !conn.isClosed else { throw HandedClosedConnection() }
        let timedOut = DeadlineFlag()
        let deadline = conn.eventLoop.scheduleTask(in: TimeAmount(limit)) { [self] in
            timedOut.raise()
            closing.withLock { _ = $0.insert(key) }
            conn.closeFuture.whenComplete { _ in self.closing.withLock { _ = $0.remove(key) } }
            let closed: EventLoopFuture<Void> = conn.close()
            closed.whenComplete { _ in }
        }
        defer { deadline.cancel() }
        do {
            return try await body()
        } catch {
            guard timedOut.isRaised else { throw error }
            throw APIError(.unavailable, "the metadata database did not answer within \(limit) (its connection was closed); retry later")
        }
    }

    /// Runs `attempt` again on deadlock or serialization failure, or when the pool handed it a
    /// closed connection (up to 8 times); other database errors become `unavailable`.
    private func retrying<R: Sendable>(_ attempt: @Sendable () async throws -> R) async throws -> R {
        var count = 0
        while true {
            count += 1
            do {
                return try await attempt()
            } catch let error as PSQLError where Self.isRetryable(error) && count < 8 {
                logger.debug("retrying a transaction after \(error.serverInfo?[.sqlState] ?? "?")")
                try await Task.sleep(for: .milliseconds(Int.random(in: 1...(5 * count))))
            } catch is HandedClosedConnection where count < 8 {
                try await Task.sleep(for: .milliseconds(5 * count))
            } catch is HandedClosedConnection {
                throw PostgresSync.closed
            } catch let error as PSQLError {
                throw Self.unavailable(error)
            }
        }
    }

    /// The pool handed out a connection already closed; nothing was sent on it.
    struct HandedClosedConnection: Error {}

    /// Returns once `conn` has closed, or after `limit`.
    static func closed(_ conn: PostgresConnection, within limit: Duration) async {
        let done = conn.eventLoop.makePromise(of: Void.self)
        let once = DeadlineFlag()
        func finish() { if once.raiseOnce() { done.succeed(()) } }
        let timer = conn.eventLoop.scheduleTask(in: TimeAmount(limit)) { finish() }
        conn.closeFuture.whenComplete { _ in finish() }
        try? await done.futureResult.get()
        timer.cancel()
    }

    /// Deadlock detected, serialization failure: the transaction did nothing and can be rerun.
    static func isRetryable(_ error: PSQLError) -> Bool {
        ["40001", "40P01"].contains(error.serverInfo?[.sqlState] ?? "")
    }

    static func unavailable(_ error: PSQLError) -> APIError {
        if error.serverInfo?[.sqlState] == "55P03" {
            return APIError(.unavailable, "the metadata database waited too long for a lock another connection holds (a stuck instance or transaction; PostgreSQL ends one idle in its transaction); retry later")
        }
        return APIError(.unavailable, "the metadata database failed: \(error.serverInfo?[.message] ?? String(describing: error.code)); retry later")
    }

    /// Runs one statement on a pooled connection and collects its rows, within `answerTimeout`.
    func read(_ q: PostgresQuery) async throws -> [PostgresRow] {
        try await retrying {
            try await self.client.withConnection { conn in
                try await self.answered(on: conn) {
                    try await PostgresSync.start(q, on: conn, logger: self.logger).get().rows
                }
            }
        }
    }

    // MARK: accounts and devices

    public func addDevice(account: String, deviceName: String, tokenHash: String) async throws -> DeviceRecord {
        guard (1...255).contains(account.utf8.count), (1...255).contains(deviceName.utf8.count) else {
            throw APIError(.badRequest, "account and device names must be 1…255 bytes")
        }
        let id = DeviceID(UUID())
        let created = Int64(Date().timeIntervalSince1970)
        let accountID = try await write(locking: nil) { db -> Int64 in
            try db.exec("INSERT INTO accounts(name) VALUES (\(account)) ON CONFLICT (name) DO NOTHING")
            guard let row = try db.rows("SELECT id FROM accounts WHERE name = \(account)").first else {
                throw APIError(.internal, "account \(account) vanished while adding a device")
            }
            let accountID = try row.decode(Int64.self)
            try db.exec("""
                INSERT INTO devices(id, account_id, name, token_hash, created)
                VALUES (\(id.description), \(accountID), \(deviceName), \(tokenHash), \(created))
                """)
            return accountID
        }
        return DeviceRecord(id: id, name: deviceName, accountID: accountID, accountName: account)
    }

    public func revocationMark() async throws -> RevocationMark {
        guard let row = try await read("SELECT count(revoked), coalesce(max(revoked), 0) FROM devices").first else {
            return RevocationMark(count: 0, latest: 0)
        }
        let (count, latest) = try row.decode((Int64, Int64).self)
        return RevocationMark(count: count, latest: latest)
    }

    public func device(tokenHash: String) async throws -> DeviceRecord? {
        guard let row = try await read("""
            SELECT d.id, d.name, d.account_id, a.name FROM devices d JOIN accounts a ON a.id = d.account_id
            WHERE d.token_hash = \(tokenHash) AND d.revoked IS NULL
            """).first else { return nil }
        let (id, name, accountID, accountName) = try row.decode((String, String, Int64, String).self)
        guard let deviceID = DeviceID(id) else { return nil }
        return DeviceRecord(id: deviceID, name: name, accountID: accountID, accountName: accountName)
    }

    public func devices(account: String?) async throws -> [DeviceListing] {
        let rows = try await read("""
            SELECT d.id, d.name, a.name, d.created, d.revoked, d.web_used FROM devices d JOIN accounts a ON a.id = d.account_id
            WHERE \(account)::text IS NULL OR a.name = \(account) ORDER BY a.name, d.name, d.id
            """)
        return try rows.compactMap { row in
            let (id, name, account, created, revoked, web) = try row.decode((String, String, String, Int64, Int64?, Int64?).self)
            return DeviceID(id).map { DeviceListing(id: $0, name: name, account: account, created: created, revoked: revoked, webUsed: web) }
        }
    }

    public func webSession(_ id: DeviceID, _ use: WebSessionUse, now: Int64, idleSeconds: Int64) async throws -> Bool {
        let device = id.description
        if use == .start {
            try await write(locking: nil) { db in try db.exec("UPDATE devices SET web_used = \(now) WHERE id = \(device) AND revoked IS NULL") }
            return true
        }
        // Used within the idle time: lives (and `.use` marks it used now); idle longer: revoked now.
        let cutoff = now - idleSeconds
        let mark = use == .use
        return try await write(locking: nil) { db in
            let alive = mark
                ? try db.rows("UPDATE devices SET web_used = \(now) WHERE id = \(device) AND revoked IS NULL AND web_used >= \(cutoff) RETURNING 1")
                : try db.rows("SELECT 1 FROM devices WHERE id = \(device) AND revoked IS NULL AND web_used >= \(cutoff)")
            if !alive.isEmpty { return true }
            let expired = try db.rows("UPDATE devices SET revoked = \(now) WHERE id = \(device) AND revoked IS NULL AND web_used < \(cutoff) RETURNING 1")
            if !expired.isEmpty { return false }
            let other = try db.rows("SELECT 1 FROM devices WHERE id = \(device) AND revoked IS NULL AND web_used IS NULL")
            return !other.isEmpty
        }
    }

    public func revokeDevice(account: String, device: String, now: Int64) async throws -> DeviceListing {
        var d = try await devices(account: account).one(named: device, account: account)
        if d.revoked == nil {
            let id = d.id.description
            try await write(locking: nil) { db in
                try db.exec("UPDATE devices SET revoked = \(now) WHERE id = \(id) AND revoked IS NULL")
            }
            d.revoked = now
        }
        return d
    }

    public func addPairing(account: Int64, codeHash: String, deviceName: String, createdBy: DeviceID, expires: Int64) async throws {
        guard (1...255).contains(deviceName.utf8.count) else { throw APIError(.badRequest, "device names must be 1…255 bytes") }
        let stale = expires - PairingLimits.lifetimeSeconds - 86_400
        let by = createdBy.description
        try await write(locking: nil) { db in
            if try Self.nameTaken(db, account: account, deviceName) { throw APIError.deviceNameTaken(deviceName) }
            try db.exec("DELETE FROM pairings WHERE expires < \(stale)")
            try db.exec("""
                INSERT INTO pairings(code_hash, account_id, device_name, created_by, expires)
                VALUES (\(codeHash), \(account), \(deviceName), \(by), \(expires))
                """)
        }
    }

    public func redeemPairing(codeHash: String, deviceName: String?, tokenHash: String, now: Int64) async throws -> DeviceRecord? {
        if let deviceName, !(1...255).contains(deviceName.utf8.count) { throw APIError(.badRequest, "device names must be 1…255 bytes") }
        let id = DeviceID(UUID())
        let idText = id.description
        return try await write(locking: nil) { db -> DeviceRecord? in
            // The UPDATE … RETURNING spends the code exactly once, also with several instances.
            guard let row = try db.rows("""
                UPDATE pairings SET used = \(now) WHERE code_hash = \(codeHash) AND used IS NULL AND expires >= \(now)
                RETURNING account_id, device_name
                """).first else { return nil }
            let (accountID, codeName) = try row.decode((Int64, String).self)
            let name = deviceName ?? codeName
            // Refused inside the transaction: the code stays unspent.
            if try Self.nameTaken(db, account: accountID, name) { throw APIError.deviceNameTaken(name) }
            guard let account = try db.rows("SELECT name FROM accounts WHERE id = \(accountID)").first?.decode(String.self) else {
                throw APIError(.internal, "the account of a pairing code vanished")
            }
            try db.exec("""
                INSERT INTO devices(id, account_id, name, token_hash, created)
                VALUES (\(idText), \(accountID), \(name), \(tokenHash), \(now))
                """)
            return DeviceRecord(id: id, name: name, accountID: accountID, accountName: account)
        }
    }

    /// A device of the account (not revoked) has the name.
    static func nameTaken(_ db: PostgresSync, account: Int64, _ name: String) throws -> Bool {
        try db.rows("SELECT 1 FROM devices WHERE account_id = \(account) AND name = \(name) AND revoked IS NULL").isEmpty == false
    }

    // MARK: containers

    public func container(account: Int64, name: String, create: Bool) async throws -> ContainerRecord? {
        let find: PostgresQuery = "SELECT id FROM containers WHERE account_id = \(account) AND name = \(name)"
        if let row = try await read(find).first {
            return ContainerRecord(id: try row.decode(Int64.self), accountID: account, name: name)
        }
        guard create else { return nil }
        let id = try await write(locking: nil) { db -> Int64? in
            try db.exec("INSERT INTO containers(account_id, name) VALUES (\(account), \(name)) ON CONFLICT DO NOTHING")
            return try db.rows("SELECT id FROM containers WHERE account_id = \(account) AND name = \(name)").first?.decode(Int64.self)
        }
        return id.map { ContainerRecord(id: $0, accountID: account, name: name) }
    }

    public func cursor(of container: ContainerRecord) async throws -> Int64 {
        try await read("SELECT cursor FROM containers WHERE id = \(container.id)").first?.decode(Int64.self) ?? 0
    }

    // MARK: commits

    public func commit(_ request: CommitRequest, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> CommitResponse {
        let place = request.state.deleted ? nil : (parent: request.state.parent, name: request.state.name.value)
        return try await commitTransaction(container, item: request.item, place: place) { tx in
            var engine = CommitEngine(tx: tx, device: device, now: now, history: self.history)
            return try engine.commit(request)
        }
    }

    public func resolve(_ request: ResolveRequest, item: ItemID, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> CommitResponse {
        try await commitTransaction(container, item: item, place: nil) { tx in
            var engine = CommitEngine(tx: tx, device: device, now: now, history: self.history)
            return try engine.resolve(request, item: item)
        }
    }

    // MARK: Recently Deleted

    /// `body` in a transaction holding the container's lock (as a commit does), with the
    /// container's cursor; a change that moved the cursor wakes the long-polls.
    private func lockedTransaction<R: Sendable>(_ container: ContainerRecord,
                                                _ body: @escaping @Sendable (PostgresTransaction) throws -> (R, cursor: Int64?)) async throws -> R {
        let statement = CommitPrefetch(container: container.id, item: ItemID.root.description, parent: "", placeParent: "", placeName: "")
        return try await transaction { db in
            guard let row = try db.rows(prepared: statement).first else { throw APIError.containerNotFound(container.name) }
            let columns = try row.decode(CommitPrefetch.Columns.self)
            let tx = PostgresTransaction(db: db, container: container, cursor: columns.0, quota: .some(columns.18), prefetched: nil)
            let (result, cursor) = try body(tx)
            tx.finish(notify: cursor.flatMap { $0 > columns.0 && columns.17 ? "\(container.id):\($0)" : nil })
            return result
        }
    }

    public func trash(in container: ContainerRecord, after: TrashCursor?, limit: Int) async throws -> [TrashListed] {
        try await lockedTransaction(container) { tx in
            (try TrashStore(tx: tx).entries(after: after, limit: limit).map { TrashListed(row: $0.row, path: $0.path) }, nil)
        }
    }

    public func trashTotals(in container: ContainerRecord) async throws -> TrashTotals {
        try await lockedTransaction(container) { tx in (try tx.trashTotals(), nil) }
    }

    public func trashEntry(_ id: ItemID, in container: ContainerRecord) async throws -> TrashListed? {
        try await lockedTransaction(container) { tx in
            (try TrashStore(tx: tx).entry(id).map { TrashListed(row: $0.row, path: $0.path, items: $0.items) }, nil)
        }
    }

    public func restoreTrash(_ id: ItemID, to folder: ItemID?, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> TrashRestoreResponse {
        try await lockedTransaction(container) { tx in
            var engine = CommitEngine(tx: tx, device: device, now: now, history: self.history)
            let r = try engine.restoreTrash(id, to: folder)
            return (r, r.cursor)
        }
    }

    public func purgeTrash(_ ids: [ItemID]?, in container: ContainerRecord) async throws -> TrashPurgeResponse {
        try await lockedTransaction(container) { tx in
            let trash = TrashStore(tx: tx)
            return (try trash.purge(ids ?? trash.allEntries()), nil)
        }
    }

    public func expireTrash(deletedBefore cutoff: Int64) async throws -> TrashPurgeResponse {
        var total = TrashPurgeResponse(entries: 0, items: 0, bytes: 0)
        while true {
            let due = try await read("""
                SELECT c.id, c.account_id, c.name, i.id FROM items i JOIN containers c ON c.id = i.container_id
                WHERE i.trash_root = i.id AND i.deleted AND i.deleted_at < \(cutoff) ORDER BY i.deleted_at LIMIT 500
                """).map { row -> (ContainerRecord, ItemID) in
                let (cid, account, name, id) = try row.decode((Int64, Int64, String, String).self)
                guard let item = ItemID(id) else { throw APIError(.internal, "corrupt item id \(id) in the database") }
                return (ContainerRecord(id: cid, accountID: account, name: name), item)
            }
            if due.isEmpty { return total }
            try await purgeDue(due, into: &total)
        }
    }

    public func purgeOldestTrash(account: Int64, bytes: Int64) async throws -> (response: TrashPurgeResponse, chunks: Set<ContentHash>) {
        var total = TrashPurgeResponse(entries: 0, items: 0, bytes: 0)
        var chunks = Set<ContentHash>()
        let due = try await read("""
            SELECT c.id, c.name, i.id FROM items i JOIN containers c ON c.id = i.container_id
            WHERE c.account_id = \(account) AND i.trash_root = i.id AND i.deleted ORDER BY i.deleted_at, i.id LIMIT 10000
            """).map { row -> (ContainerRecord, ItemID) in
            let (cid, name, id) = try row.decode((Int64, String, String).self)
            guard let item = ItemID(id) else { throw APIError(.internal, "corrupt item id \(id) in the database") }
            return (ContainerRecord(id: cid, accountID: account, name: name), item)
        }
        for (container, id) in due where total.entries == 0 || total.bytes < bytes {
            let r = try await lockedTransaction(container) { tx in (try TrashStore(tx: tx).purgeWithChunks([id]), nil) }
            total.entries += r.response.entries
            total.items += r.response.items
            total.bytes += r.response.bytes
            chunks.formUnion(r.chunks)
        }
        return (total, chunks)
    }

    public var databaseRoundTrips: DatabaseRoundTrips? {
        DatabaseRoundTrips(statements: counters.statements, waits: counters.waitsForAnswers)
    }

    static func storedItem(_ row: PostgresRow) throws -> StoredItem {
        let (id, version, conflicts, state) = try row.decode((String, Int64, Int64, String).self)
        guard let itemID = ItemID(id) else { throw APIError(.internal, "corrupt item id \(id) in the database") }
        return StoredItem(id: itemID, version: version, conflicts: Int(conflicts), state: try Codec.decodeState(state))
    }
}

/// Set once a deadline fired.
final class DeadlineFlag: Sendable {
    private let raised = Atomic<Bool>(false)
    func raise() { raised.store(true, ordering: .relaxed) }
    /// Raises the flag; true for the one call that raised it.
    func raiseOnce() -> Bool { !raised.exchange(true, ordering: .acquiringAndReleasing) }
    var isRaised: Bool { raised.load(ordering: .relaxed) }
}
