import Foundation
import NimbusServer
import NimbusTesting
import Testing

/// The store conformance suite on the embedded SQLite engine, each case on a fresh database file.
@Suite struct SQLiteConformanceTests {
    @Test(arguments: StoreConformance.allCases)
    func conformance(_ c: StoreConformance) async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-conf-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try SQLiteStore(path: dir + "/metadata.sqlite", history: c.retention)
        try await c.run(store)
    }
}
