import Logging
import NIOPosix
@testable import NimbusServer
import NimbusTesting
import PostgresNIO
import Testing

/// `PostgresSync` hands prepared statements to a task; what is sent after one must still reach the
/// connection after it, or a commit's COMMIT could overtake its writes. On the event loop
/// (`deferring`), the kept writes and COMMIT go out together, and a write that failed must be
/// reported even though COMMIT then answers with a silent rollback.
@Suite(.enabled(if: PostgresScratch.available, "NIMBUS_TEST_POSTGRES is unset; scripts/test starts PostgreSQL and sets it"))
struct PostgresSyncTests {
    struct InsertStep: PostgresPreparedStatement {
        typealias Row = PostgresRow
        static let sql = "INSERT INTO steps(round, kind, tx) VALUES ($1, 'prepared', txid_current())"
        var round: Int64
        func makeBindings() throws -> PostgresBindings {
            var b = PostgresBindings()
            b.append(round)
            return b
        }
        func decodeRow(_ row: PostgresRow) throws -> PostgresRow { row }
    }

    static let table: PostgresQuery = "CREATE TABLE steps(id bigserial PRIMARY KEY, round bigint, kind text CHECK (kind <> 'bad'), tx bigint)"

    /// A connection to a fresh database with the `steps` table, closed after `body`.
    static func withConnection(_ body: @Sendable (PostgresConnection, Logger) async throws -> Void) async throws {
        try await PostgresScratch.withDatabase { location in
            let logger = Logger(label: "test")
            let conn = try await PostgresConnection.connect(configuration: location.connectionConfiguration, id: 1, logger: logger)
            do {
                _ = try await PostgresSync.start(Self.table, on: conn, logger: logger).get()
                try await body(conn, logger)
            } catch {
                try? await conn.close()
                throw error
            }
            try await conn.close()
        }
    }

    /// Each of 100 rounds wrote the prepared row, the plain one, the prepared one again, in that
    /// order and in one transaction (COMMIT came last).
    static func expectRoundsInOrder(_ rows: [(Int64, String, Int64)]) {
        #expect(rows.count == 300)
        for round in Int64(0)..<100 {
            let mine = rows.filter { $0.0 == round }
            #expect(mine.map(\.1) == ["prepared", "plain", "prepared"], "round \(round): \(mine.map(\.1))")
            #expect(Set(mine.map(\.2)).count == 1, "round \(round) ran in \(Set(mine.map(\.2)).count) transactions")
        }
    }

    @Test func statementsAfterAPreparedOneKeepTheirOrder() async throws {
        try await Self.withConnection { conn, logger in
            try await NIOThreadPool.singleton.runIfActive {
                let db = PostgresSync(conn: conn, logger: logger)
                for round in Int64(0)..<100 {
                    db.send("BEGIN")
                    db.send(prepared: InsertStep(round: round))
                    db.send("INSERT INTO steps(round, kind, tx) VALUES (\(round), 'plain', txid_current())")
                    // A read after them sees both.
                    let seen = try db.rows("SELECT count(*) FROM steps WHERE round = \(round)").first?.decode(Int64.self)
                    #expect(seen == 2, "round \(round): \(seen ?? -1) rows seen")
                    db.send(prepared: InsertStep(round: round))
                    try db.exec("COMMIT")
                }
                Self.expectRoundsInOrder(try db.rows("SELECT round, kind, tx FROM steps ORDER BY id").map { try $0.decode((Int64, String, Int64).self) })
            }
        }
    }

    @Test func keptWritesAndCommitReachTheConnectionInOrder() async throws {
        try await Self.withConnection { conn, logger in
            try await withTaskExecutorPreference(LoopTaskExecutor(conn.eventLoop)) {
                let warm = WarmStatements(), counters = PostgresCounters()
                for round in Int64(0)..<100 {
                    let db = PostgresSync(conn: conn, logger: logger, counters: counters, deferring: true, warm: warm)
                    _ = try await PostgresSync.start("BEGIN", on: conn, logger: logger).get()
                    #expect(throws: PostgresSync.WouldWait.self) { _ = try db.rows("SELECT 1") }
                    db.send(prepared: InsertStep(round: round))
                    db.send("INSERT INTO steps(round, kind, tx) VALUES (\(round), 'plain', txid_current())")
                    db.send(prepared: InsertStep(round: round))
                    try await db.commitDeferred()
                }
                // The first round waited for each statement (the prepared one was new on the
                // connection), every later one once for all of them.
                #expect(counters.waitsForAnswers == 4 + 99)
                // A write that fails: reported, and nothing of its transaction stays.
                let db = PostgresSync(conn: conn, logger: logger, deferring: true, warm: warm)
                _ = try await PostgresSync.start("BEGIN", on: conn, logger: logger).get()
                db.send(prepared: InsertStep(round: 100))
                db.send("INSERT INTO steps(round, kind, tx) VALUES (100, 'bad', txid_current())")
                db.send(prepared: InsertStep(round: 100))
                do {
                    try await db.commitDeferred()
                    Issue.record("a failed write was not reported")
                } catch let error as PSQLError {
                    #expect(error.serverInfo?[.sqlState] == "23514", "\(error)")
                }
                Self.expectRoundsInOrder(try await PostgresSync.start("SELECT round, kind, tx FROM steps ORDER BY id", on: conn, logger: logger).get()
                    .rows.map { try $0.decode((Int64, String, Int64).self) })
            }
        }
    }
}
