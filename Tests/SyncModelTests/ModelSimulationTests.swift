import Foundation
import Testing

/// The planner-level simulation (`ModelWorld`, docs/sync.md "Simulation"). The default run takes
/// seeds 1–10,000 of 200 steps each on every core; `NIMBUS_MODEL_SEEDS=17` (or `1-1000000`,
/// `3,9`) and `NIMBUS_MODEL_STEPS=500` change it, and `scripts/soak --model` runs millions.
/// A failing seed prints its replay line and the last events of its run.
@Suite struct ModelSimulationTests {
    static var seeds: [ClosedRange<UInt64>] {
        guard let env = ProcessInfo.processInfo.environment["NIMBUS_MODEL_SEEDS"] else { return [1...10_000] }
        return env.split(separator: ",").compactMap { part in
            let ends = part.split(separator: "-").compactMap { UInt64($0.trimmingCharacters(in: .whitespaces)) }
            if ends.count == 2, ends[0] <= ends[1] { return ends[0]...ends[1] }
            return ends.count == 1 ? ends[0]...ends[0] : nil
        }
    }
    static var steps: Int { Int(ProcessInfo.processInfo.environment["NIMBUS_MODEL_STEPS"] ?? "") ?? 200 }

    struct Failure: Sendable {
        var seed: UInt64
        var what: String
        var events: [String]
    }

    /// Runs `seeds` spread over the cores; the failures, at most `limit` of them, in seed order.
    static func run(_ ranges: [ClosedRange<UInt64>], steps: Int, limit: Int = Int(ProcessInfo.processInfo.environment["NIMBUS_MODEL_LIMIT"] ?? "") ?? 5) async -> (runs: Int, failures: [Failure], figures: String) {
        let all = ranges.flatMap { Array($0) }
        let workers = max(1, ProcessInfo.processInfo.activeProcessorCount)
        let results = await withTaskGroup(of: ([Failure], Int, Int, Int, Int).self) { group in
            for w in 0..<workers {
                group.addTask {
                    var failures: [Failure] = []
                    var commits = 0, lost = 0, crashes = 0, ops = 0
                    for i in stride(from: w, to: all.count, by: workers) {
                        var world = ModelWorld(seed: all[i])
                        if let what = world.run(steps: steps) {
                            failures.append(Failure(seed: all[i], what: what, events: Array(world.events.suffix(Int(ProcessInfo.processInfo.environment["NIMBUS_MODEL_EVENTS"] ?? "") ?? 40))))
                            if failures.count >= limit { break }
                        }
                        commits += world.figures.commits
                        lost += world.figures.lost
                        crashes += world.figures.crashes
                        ops += world.figures.ops
                    }
                    return (failures, commits, lost, crashes, ops)
                }
            }
            return await group.reduce(into: [([Failure], Int, Int, Int, Int)]()) { $0.append($1) }
        }
        let failures = results.flatMap(\.0).sorted { $0.seed < $1.seed }
        let figures = "\(all.count) seeds × \(steps) steps: \(results.map(\.4).reduce(0, +)) local operations, \(results.map(\.1).reduce(0, +)) commits, \(results.map(\.2).reduce(0, +)) messages lost, \(results.map(\.3).reduce(0, +)) crashes"
        return (all.count, Array(failures.prefix(limit)), figures)
    }

    @Test func everySeedConvergesAndLosesNothing() async {
        let started = ContinuousClock.now
        let (_, failures, figures) = await Self.run(Self.seeds, steps: Self.steps)
        print("model sim figures: \(figures) in \(ContinuousClock.now - started)")
        for f in failures {
            Issue.record("model sim seed \(f.seed) (replay: NIMBUS_MODEL_SEEDS=\(f.seed) NIMBUS_MODEL_STEPS=\(Self.steps) swift test --filter ModelSimulationTests): \(f.what)\nlast events:\n\(f.events.joined(separator: "\n"))")
        }
    }

    /// Same seed, same run: event for event.
    @Test(arguments: [UInt64(7), 4242]) func aSeedReplaysExactly(_ seed: UInt64) {
        var a = ModelWorld(seed: seed), b = ModelWorld(seed: seed)
        let ra = a.run(steps: 300), rb = b.run(steps: 300)
        #expect(a.events.count > 200)
        #expect(a.events == b.events)
        #expect(ra == rb)
        #expect(a.server.t.journal == b.server.t.journal)
    }
}
