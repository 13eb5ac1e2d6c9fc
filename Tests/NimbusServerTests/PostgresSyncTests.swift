import Logging
import NIOPosix
@testable import NimbusServer
import NimbusTesting
import PostgresNIO
import Testing

/// `PostgresSync` hands prepared statements to a task; what is sent after one must still reach the
/// connection after it, or a commit's COMMIT could overtake its writes.
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

    @Test func statementsAfterAPreparedOneKeepTheirOrder() async throws {
        try await PostgresScratch.withDatabase { location in
            let logger = Logger(label: "test")
            let conn = try await PostgresConnection.connect(configuration: location.connectionConfiguration, id: 1, logger: logger)
            do {
                try await NIOThreadPool.singleton.runIfActive {
                    let db = PostgresSync(conn: conn, logger: logger)
                    try db.exec("CREATE TABLE steps(id bigserial PRIMARY KEY, round bigint, kind text, tx bigint)")
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
                    // In each round: the prepared row, the plain one, the prepared one again, in
                    // that order and in one transaction (COMMIT came last).
                    let rows = try db.rows("SELECT round, kind, tx FROM steps ORDER BY id").map { try $0.decode((Int64, String, Int64).self) }
                    #expect(rows.count == 300)
                    for round in Int64(0)..<100 {
                        let mine = rows.filter { $0.0 == round }
                        #expect(mine.map(\.1) == ["prepared", "plain", "prepared"], "round \(round): \(mine.map(\.1))")
                        #expect(Set(mine.map(\.2)).count == 1, "round \(round) ran in \(Set(mine.map(\.2)).count) transactions")
                    }
                }
            } catch {
                try? await conn.close()
                throw error
            }
            try await conn.close()
        }
    }
}
