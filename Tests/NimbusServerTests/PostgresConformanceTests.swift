import Foundation
import NimbusServer
import NimbusTesting
import Testing

/// The store conformance suite on the PostgreSQL engine, each case on a fresh database.
/// Skipped (loudly) when NIMBUS_TEST_POSTGRES is unset; scripts/test always sets it.
@Suite(.enabled(if: PostgresScratch.available, "NIMBUS_TEST_POSTGRES is unset; scripts/test starts PostgreSQL and sets it"))
struct PostgresConformanceTests {
    @Test(arguments: StoreConformance.allCases)
    func conformance(_ c: StoreConformance) async throws {
        try await PostgresScratch.withStore(history: c.retention) { store in try await c.run(store) }
    }

    /// Migrations are versioned and applied once: reopening finds nothing to do and keeps the data.
    @Test func reopenKeepsSchemaAndData() async throws {
        try await PostgresScratch.withDatabase { location in
            let first = try await PostgresStore.open(location)
            let device = try await first.addDevice(account: "alice", deviceName: "laptop", tokenHash: String(repeating: "a", count: 64))
            await first.shutdown()
            let second = try await PostgresStore.open(location)
            let found = try await second.device(tokenHash: String(repeating: "a", count: 64))
            await second.shutdown()
            #expect(found == device)
        }
    }

    /// Two stores (as two instances would) opening one fresh database at once migrate it once.
    @Test func concurrentStartsMigrateOnce() async throws {
        try await PostgresScratch.withDatabase { location in
            async let a = PostgresStore.open(location)
            async let b = PostgresStore.open(location)
            let (sa, sb) = try await (a, b)
            let problems = try await sa.consistencyProblems()
            await sa.shutdown()
            await sb.shutdown()
            #expect(problems.isEmpty)
        }
    }
}
