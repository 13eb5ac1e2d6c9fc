import ArgumentParser
import AsyncHTTPClient
import Foundation
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusRemote

/// `nimbus-bench server`: small commits per second and long-poll wake-up latency against a running
/// server (scripts/bench-server starts one). Figures only; nothing here asserts a threshold.
@main
struct Bench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "nimbus-bench", subcommands: [ServerBench.self, PopulateBench.self, EventsBench.self])
}

/// `nimbus-bench events`: the cost of one `.nimbus/events` line (every create, change, move and
/// delete on a mount writes one), in process: paths like an untarred source tree's, a few that
/// need escaping. Figures only.
struct EventsBench: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "events")
    @Option var lines = 1_000_000

    func run() {
        let log = EventLog(firstSequence: 1)
        let paths = (0..<1000).map { i in
            i % 100 == 0 ? "/src/odd\\name\n-> \(i).txt" : "/src/swift-nio/Sources/NIOCore/Module\(i % 37)/ByteBuffer-aux\(i).swift"
        }
        let kinds: [EventKind] = [.created, .changed, .attributes, .deleted]
        let start = ContinuousClock.now
        for i in 0..<lines {
            let p = paths[i % paths.count]
            if i % 10 == 9 {
                log.append(.moved, origin: .local, path: p, to: p + ".bak")
            } else {
                log.append(kinds[i % kinds.count], origin: .local, path: p, detail: i % 3 == 0 ? "v\(i)" : nil)
            }
        }
        let took = ContinuousClock.now - start
        let ns = Double(took.components.seconds) * 1e9 + Double(took.components.attoseconds) / 1e9
        print(String(format: "events  %d lines in %.3f s: %.0f ns per line (%lld bytes written)", lines, ns / 1e9, ns / Double(lines), log.size))
    }
}

struct ServerBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "server")

    @Option var url: String
    @Option(help: "A second instance on the same database: B long-polls there and half the committers use it.") var urlB: String?
    @Option(help: "Token of device A (committer).") var tokenA: String
    @Option(help: "Token of device B (long-poller).") var tokenB: String
    @Option var commits = 5000
    @Option var concurrency = 16
    @Option var wakeups = 200

    func run() async throws {
        // A client of its own with one connection per worker (the shared client allows 8 per host).
        var config = HTTPClient.Configuration()
        config.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: max(8, concurrency + 2))
        let http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: config)
        do {
            try await measure(NimbusClient(baseURL: url, token: tokenA, http: http),
                              NimbusClient(baseURL: urlB ?? url, token: tokenA, http: http),
                              NimbusClient(baseURL: urlB ?? url, token: tokenB, http: http))
        } catch {
            try? await http.shutdown()
            throw error
        }
        try await http.shutdown()
    }

    /// `a` and `a2` are device A on the first and second instance (the same one without --url-b).
    func measure(_ a: NimbusClient, _ a2: NimbusClient, _ b: NimbusClient) async throws {
        let container = "com.example.bench-\(UInt32.random(in: 0...UInt32.max))"
        _ = try await a.createContainer(container)

        // Warm up connections.
        for _ in 0..<concurrency { _ = try await a.whoami() }

        // 1. Small commits (create of an empty file), `concurrency` in flight.
        let perWorker = commits / concurrency
        let start = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for w in 0..<concurrency {
                let a = w % 2 == 0 ? a : a2
                group.addTask {
                    for i in 0..<perWorker {
                        _ = try await a.commit(container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: ItemDraft(
                            kind: .file, parent: .root, name: ItemName(trusted: "w\(w)-\(i)"), mode: 0o644, modified: Int64(i))))
                    }
                }
            }
            try await group.waitForAll()
        }
        let elapsed = ContinuousClock.now - start
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        let total = perWorker * concurrency
        print(String(format: "server  small commits            %8d commits in %.2f s = %8.0f commits/s (concurrency %d",
                     total, seconds, Double(total) / seconds, concurrency) + (urlB == nil ? ")" : ", over 2 instances)"))

        // 2. Long-poll wake-up: B waits; A commits; time from A sending to B's poll returning.
        var cursor = try await a.container(container).cursor
        var latencies: [Double] = []
        for i in 0..<wakeups {
            let since = cursor
            async let polled = b.changes(container, since: since, wait: 30)
            try await Task.sleep(for: .milliseconds(5))
            let t0 = ContinuousClock.now
            _ = try await a.commit(container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: ItemDraft(
                kind: .file, parent: .root, name: ItemName(trusted: "wake-\(i)"), mode: 0o644, modified: 1)))
            let page = try await polled
            let d = ContinuousClock.now - t0
            latencies.append(Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15)
            cursor = page.cursor
        }
        latencies.sort()
        func pct(_ p: Double) -> Double { latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] }
        print(String(format: "server  long-poll wake-up         p50 %.2f ms  p99 %.2f ms  (%d wake-ups, commit sent → poll answered",
                     pct(0.5), pct(0.99), latencies.count) + (urlB == nil ? ")" : ", poll on the other instance)"))
    }
}

/// `nimbus-bench populate`: fills a container with many small items through the API (folders of
/// empty files), for first-sync figures (scripts/bench-sync). Prints how long it took.
struct PopulateBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "populate")

    @Option var url: String
    @Option var token: String
    @Option var container: String
    @Option(help: "Files in all (spread over --folders folders).") var items = 100_000
    @Option var folders = 100
    @Option var concurrency = 32

    func run() async throws {
        var config = HTTPClient.Configuration()
        config.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: concurrency + 2)
        let http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: config)
        do { try await fill(NimbusClient(baseURL: url, token: token, http: http)) } catch {
            try? await http.shutdown()
            throw error
        }
        try await http.shutdown()
    }

    func fill(_ c: NimbusClient) async throws {
        _ = try await c.createContainer(container)
        let start = ContinuousClock.now
        var parents: [ItemID] = []
        for f in 0..<max(1, folders) {
            let id = ItemID(UUID())
            _ = try await c.commit(container, CommitRequest(item: id, baseVersion: nil, state: ItemDraft(
                kind: .folder, parent: .root, name: ItemName(trusted: "folder-\(f)"), mode: 0o755, modified: 1)))
            parents.append(id)
        }
        let workers = max(1, concurrency)
        let parentList = parents
        try await withThrowingTaskGroup(of: Void.self) { group in
            for w in 0..<workers {
                group.addTask {
                    var i = w
                    while i < items {
                        _ = try await c.commit(container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: ItemDraft(
                            kind: .file, parent: parentList[i % parentList.count], name: ItemName(trusted: "file-\(i).txt"),
                            mode: 0o644, modified: Int64(i))))
                        i += workers
                    }
                }
            }
            try await group.waitForAll()
        }
        let d = ContinuousClock.now - start
        let seconds = Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
        print(String(format: "populate: %d files in %d folders in %.1f s", items, parentList.count, seconds))
    }
}
