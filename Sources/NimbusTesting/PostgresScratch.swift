import Foundation
import Logging
import NimbusServer

/// A fresh PostgreSQL database per test, on the server named by NIMBUS_TEST_POSTGRES
/// (postgres://USER:PASS@HOST:PORT/DB; the user needs CREATEDB). `scripts/test` starts a cluster
/// and sets it; run by hand without it, the PostgreSQL tests are skipped with `skipReason`.
public enum PostgresScratch {
    public static let url = ProcessInfo.processInfo.environment["NIMBUS_TEST_POSTGRES"].flatMap { $0.isEmpty ? nil : $0 }
    public static var available: Bool {
        if url == nil { FileHandle.standardError.write(Data("\n*** \(skipReason) ***\n\n".utf8)) }
        return url != nil
    }
    public static let skipReason = "SKIPPING the PostgreSQL tests: NIMBUS_TEST_POSTGRES is unset. Run scripts/test (it starts PostgreSQL), or set NIMBUS_TEST_POSTGRES=postgres://USER:PASS@127.0.0.1:PORT/DB for a user with CREATEDB"

    public static func admin() throws -> PostgresLocation {
        guard let url else { throw FixtureError(skipReason) }
        return try PostgresLocation.parse(url)
    }

    /// Creates an empty database with a fresh name and returns its location; `drop` removes it.
    public static func create() async throws -> PostgresLocation {
        let admin = try admin()
        let name = "nimbus_t_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(16)
        try await again("create database \(name)") { try await PostgresStore.createDatabase(String(name), admin: admin) }
        return admin.with(database: String(name))
    }

    /// Drops a database made by `create` (closing connections left open).
    public static func drop(_ location: PostgresLocation) async throws {
        let admin = try admin()
        try await again("drop database \(location.database)") { try await PostgresStore.dropDatabase(location.database, admin: admin) }
    }

    /// Runs an idempotent admin statement up to three times. Tests create and drop databases in
    /// parallel, and PostgreSQL may refuse one while another runs (a template or catalog in use);
    /// each refusal is printed with what the server said, so a run that still fails says why.
    static func again(_ what: String, _ body: () async throws -> Void) async throws {
        for attempt in 1...3 {
            do {
                return try await body()
            } catch where attempt < 3 {
                FileHandle.standardError.write(Data("PostgresScratch: \(what) failed (attempt \(attempt) of 3): \(error)\n".utf8))
                try await Task.sleep(for: .milliseconds(200 * attempt))
            }
        }
    }

    /// The `postgres://` URL `nimbus serve --database` takes for `location`.
    public static func url(of location: PostgresLocation) -> String {
        "postgres://\(location.username):\(location.password ?? "")@\(location.host):\(location.port)/\(location.database)"
    }

    /// Creates an empty database, passes its location to `body`, and drops it afterwards (also
    /// when `body` throws).
    public static func withDatabase<T: Sendable>(_ body: @Sendable (PostgresLocation) async throws -> T) async throws -> T {
        let location = try await create()
        do {
            let result = try await body(location)
            try await drop(location)
            return result
        } catch {
            try? await drop(location)
            throw error
        }
    }

    /// An open store (with `history` retention) on a fresh database, shut down and dropped after `body`.
    public static func withStore<T: Sendable>(history: HistoryRetention = .default,
                                              _ body: @Sendable (PostgresStore) async throws -> T) async throws -> T {
        try await withDatabase { location in
            var quiet = Logger(label: "nimbus.test-postgres")
            quiet.logLevel = .warning
            let store = try await PostgresStore.open(location, logger: quiet, history: history)
            do {
                let result = try await body(store)
                await store.shutdown()
                return result
            } catch {
                await store.shutdown()
                throw error
            }
        }
    }
}
