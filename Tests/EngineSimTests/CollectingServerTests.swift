import Foundation
import MountPorts
import NimbusServer
import NimbusTesting
import Testing

/// The engine simulation against a server that collects chunk garbage every 100 ms with a grace
/// of 2 s (`ChunkCollector`): three real engines, crashes, restarts and partitions, and still
/// every last write is kept and `nimbus admin check`'s checks pass at the end. (With a grace of
/// 0 a device can lose its uploaded chunks before every commit; that is a test setting only.)
@Suite struct CollectingServerTests {
    @Test(arguments: [UInt64(1), 2])
    func devicesConvergeWhileTheServerCollects(_ seed: UInt64) async throws {
        let plan = SimPlan(seed: seed, rounds: 80)
        let (report, problems) = try await LiveServer.with(configure: { app in
            app.gcInterval = .milliseconds(100)
            app.gcGraceSeconds = 2
        }) { server in
            let report = try await EngineSim(plan: plan, server: server).run()
            return (report, try await StoreCheck.problems(store: server.app.store, chunks: server.app.chunks))
        }
        #expect(report.failure == nil, "seed \(seed): \(report.failure ?? "")")
        #expect(problems.isEmpty, "seed \(seed): \(problems)")
    }
}
