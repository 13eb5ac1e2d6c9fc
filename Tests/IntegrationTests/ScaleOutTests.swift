import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Several `nimbus serve` processes on one PostgreSQL database and one S3 bucket (moto), as a
/// scaled deployment runs them. Each test gets its own database and bucket, dropped afterwards.
@Suite(.serialized, .enabled(if: PostgresScratch.available && S3Scratch.available,
                             "needs NIMBUS_TEST_POSTGRES and NIMBUS_TEST_S3; scripts/test starts both services"))
struct ScaleOutTests {
    static let container = "com.example.scale"

    /// Runs `count` instances on a fresh database + bucket, with a device token per instance.
    static func withCluster(_ count: Int, _ body: @Sendable ([ServerProcess], [String], _ database: String, _ chunks: String) async throws -> Void) async throws {
        try await withLocatedCluster(count) { servers, tokens, _, database, chunks in try await body(servers, tokens, database, chunks) }
    }

    static func withLocatedCluster(_ count: Int, _ body: @Sendable ([ServerProcess], [String], PostgresLocation, _ database: String, _ chunks: String) async throws -> Void) async throws {
        S3Scratch.exportEnvironment()
        try await PostgresScratch.withDatabase { location in
            let database = PostgresScratch.url(of: location)
            try await S3Scratch.withBucket { _, chunks in
                let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-scale-\(UUID().uuidString)").path
                defer { try? FileManager.default.removeItem(atPath: dir) }
                var tokens: [String] = []
                for i in 0..<count {
                    let r = try await NimbusBinary.run(["admin", "add-device", "--database", database, "--account", "alice", "--device", "device-\(i)"])
                    guard r.status == 0 else { throw FixtureError("add-device failed: \(r.stderr)") }
                    tokens.append(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
                }
                let servers = (0..<count).map { i in
                    ServerProcess(dataDir: dir + "/\(i)", extraArgs: ["--database", database, "--chunks", chunks])
                }
                defer { servers.forEach { $0.stop() } }
                for s in servers { try await s.start() }
                try await body(servers, tokens, location, database, chunks)
            }
        }
    }

    final class Counter: Sendable {
        private let count = Mutex(0)
        func add() { count.withLock { $0 += 1 } }
        var value: Int { count.withLock { $0 } }
    }

    static func draft(_ name: String, _ chunk: ChunkRef, t: Int64) -> ItemDraft {
        ItemDraft(kind: .file, parent: .root, name: ItemName(trusted: name), chunks: [chunk], mode: 0o644, modified: t)
    }

    @Test func commitOnOneInstanceWakesALongPollOnTheOther() async throws {
        try await Self.withCluster(2) { servers, tokens, _, _ in
            let a = NimbusClient(baseURL: servers[0].url, token: tokens[0])
            let b = NimbusClient(baseURL: servers[1].url, token: tokens[1])
            _ = try await a.createContainer(Self.container)
            let start = try await b.changes(Self.container, since: 0).cursor
            for round in 0..<3 {
                let poll = Task { try await b.changes(Self.container, since: start + Int64(round), wait: 20) }
                try await Task.sleep(for: .milliseconds(300))  // let the poll park on instance 2
                let committedAt = ContinuousClock.now
                let chunk = try await a.upload(Array("round \(round)".utf8))
                _ = try await a.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("r\(round).txt", chunk, t: 1)))
                let page = try await poll.value
                let latency = ContinuousClock.now - committedAt
                #expect(page.changes.map(\.seq) == [start + Int64(round) + 1], "round \(round): \(page.changes.map(\.seq))")
                print("sync figures: round \(round): long-poll on instance 2 woke \(latency) after the commit on instance 1")
                // Instance 2 heard of the commit by NOTIFY (not only by its 2 s catch-up read); asked
                // of its metrics, not of a clock, so a loaded machine cannot fail it.
                let notified = try await Self.announcements(b, source: "notification", atLeast: round + 1)
                #expect(notified >= round + 1, "round \(round): instance 2 announced \(notified) NOTIFYs")
                // The chunk put through instance 1 is readable through instance 2 (shared object store).
                #expect(try await b.getChunk(chunk.hash) == Array("round \(round)".utf8))
            }
        }
    }

    /// Commits NOTIFY only containers a long-poll may wait on: commits into a container nobody
    /// polls wake no instance; a poll makes its container watched before it reads, so the next
    /// commit there wakes it by NOTIFY.
    @Test func onlyWatchedContainersAreNotified() async throws {
        try await Self.withCluster(2) { servers, tokens, _, _ in
            let a = NimbusClient(baseURL: servers[0].url, token: tokens[0])
            let b = NimbusClient(baseURL: servers[1].url, token: tokens[1])
            let quiet = "com.example.quiet", watched = "com.example.watched"
            _ = try await a.createContainer(quiet)
            _ = try await a.createContainer(watched)
            let chunk = try await a.upload(Array("x".utf8))
            for k in 0..<20 {
                _ = try await a.commit(quiet, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("q\(k)", chunk, t: 1)))
            }
            let start = try await b.changes(watched, since: 0).cursor
            let poll = Task { try await b.changes(watched, since: start, wait: 20) }
            try await Task.sleep(for: .milliseconds(300))  // let the poll park on instance 2
            _ = try await a.commit(watched, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("w", chunk, t: 1)))
            #expect(try await poll.value.changes.count == 1)
            // One LISTEN connection delivers notifications in commit order: had the 20 commits into
            // the quiet container sent any, they would have been counted before this one.
            #expect(try await Self.announcements(b, source: "notification", atLeast: 1) == 1)
            // A poll on the quiet container watches it from then on: the next commit wakes it.
            let quietCursor = try await b.changes(quiet, since: 0).cursor
            let quietPoll = Task { try await b.changes(quiet, since: quietCursor, wait: 20) }
            try await Task.sleep(for: .milliseconds(300))
            _ = try await a.commit(quiet, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("q", chunk, t: 1)))
            #expect(try await quietPoll.value.changes.count == 1)
            #expect(try await Self.announcements(b, source: "notification", atLeast: 2) == 2)
        }
    }

    /// The value of `nimbus_journal_announcements_total{source=...}` on `client`'s instance, waiting
    /// (up to 10 s) for it to reach `atLeast`.
    static func announcements(_ client: NimbusClient, source: String, atLeast: Int) async throws -> Int {
        let deadline = ContinuousClock.now + .seconds(10)
        var value = 0
        while true {
            let text = try await client.send(.GET, "/metrics", authorized: false).text
            let key = "nimbus_journal_announcements_total{source=\"\(source)\"} "
            if let line = text.split(separator: "\n").first(where: { $0.hasPrefix(key) }) {
                value = Int(Double(line.dropFirst(key.count).trimmingCharacters(in: .whitespaces)) ?? 0)
            }
            if value >= atLeast || ContinuousClock.now > deadline { return value }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    @Test func concurrentConflictingCommitsOnTwoInstances() async throws {
        try await Self.withCluster(2) { servers, tokens, database, chunks in
            let clients = [NimbusClient(baseURL: servers[0].url, token: tokens[0]), NimbusClient(baseURL: servers[1].url, token: tokens[1])]
            _ = try await clients[0].createContainer(Self.container)
            let base = try await clients[0].upload(Array("base".utf8))
            for i in 0..<12 {
                let id = ItemID(UUID())
                let v1 = try await clients[0].commit(Self.container, CommitRequest(item: id, baseVersion: nil, state: Self.draft("f\(i).txt", base, t: 1))).item.version
                let results = try await withThrowingTaskGroup(of: CommitResponse.self) { group in
                    for (n, c) in clients.enumerated() {
                        group.addTask {
                            let chunk = try await c.upload(Array("edit \(i) by \(n)".utf8))
                            return try await c.commit(Self.container, CommitRequest(item: id, baseVersion: v1, state: Self.draft("f\(i).txt", chunk, t: Int64(10 + n))))
                        }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                let outcomes: [String] = results.map(\.outcome.rawValue).sorted()
                #expect(outcomes == ["applied", "conflict"], "one applies, the other conflicts: \(outcomes)")
                let versions = try await clients[1].versions(Self.container, id)
                #expect(versions.filter { $0.role == .current }.count == 1, "exactly one current version")
                #expect(versions.filter { $0.role == .conflict }.count == 1, "exactly one conflict version, none lost")
                #expect(try await clients[0].item(Self.container, id).conflicts == 1)
            }
            let check = try await NimbusBinary.run(["admin", "check", "--database", database, "--chunks", chunks])
            #expect(check.status == 0 && check.stdout == "consistent\n", "\(check.stdout) \(check.stderr)")
        }
    }

    @Test func killingOneInstanceMidBurstLeavesTheOtherServing() async throws {
        try await Self.withCluster(2) { servers, tokens, database, chunks in
            let clients = [NimbusClient(baseURL: servers[0].url, token: tokens[0]), NimbusClient(baseURL: servers[1].url, token: tokens[1])]
            _ = try await clients[0].createContainer(Self.container)
            let acked = Counter()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for worker in 0..<6 {
                    let client = clients[worker % 2]
                    group.addTask {
                        for i in 0..<200 {
                            do {
                                let chunk = try await client.upload(Array("w\(worker) i\(i)".utf8))
                                _ = try await client.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("w\(worker)-\(i)", chunk, t: 1)))
                                acked.add()
                            } catch {
                                if worker % 2 == 0 { return }  // instance 1 is gone
                                throw error  // instance 2 must keep serving
                            }
                        }
                    }
                }
                group.addTask {
                    try await Task.sleep(for: .milliseconds(1500))
                    await servers[0].kill(SIGKILL)
                }
                try await group.waitForAll()
            }
            #expect(servers[0].exitStatus != nil, "instance 1 was killed")
            // Instance 2 still serves reads and writes after the kill.
            let chunk = try await clients[1].upload(Array("after".utf8))
            let r = try await clients[1].commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("after", chunk, t: 1)))
            #expect(r.outcome == .applied)
            var since: Int64 = 0, seqs: [Int64] = []
            while true {
                let page = try await clients[1].changes(Self.container, since: since, limit: 1000)
                seqs += page.changes.map(\.seq)
                since = page.cursor
                if !page.more { break }
            }
            #expect(seqs == Array(1...Int64(seqs.count)), "journal without gaps")
            #expect(seqs.count >= acked.value + 1, "every acknowledged commit is in the journal")
            let check = try await NimbusBinary.run(["admin", "check", "--database", database, "--chunks", chunks])
            #expect(check.status == 0 && check.stdout == "consistent\n", "\(check.stdout) \(check.stderr)")
        }
    }

    /// The LISTEN connection of instance 2 is cut (as by a network failure or a database restart):
    /// a commit made meanwhile still wakes its long-poll through the periodic catch-up, and once
    /// re-subscribed, notifications wake polls promptly again.
    @Test func lostNotificationConnectionIsCaughtUpAndResubscribed() async throws {
        try await Self.withLocatedCluster(2) { servers, tokens, location, _, _ in
            let a = NimbusClient(baseURL: servers[0].url, token: tokens[0])
            let b = NimbusClient(baseURL: servers[1].url, token: tokens[1])
            _ = try await a.createContainer(Self.container)
            let terminated = try await PostgresStore.execute("""
                SELECT pg_terminate_backend(pid)::text FROM pg_stat_activity
                WHERE datname = current_database() AND query ILIKE 'LISTEN%'
                """, on: location)
            #expect(terminated.count == 2, "both instances were listening: \(terminated)")
            let chunk = try await a.upload(Array("while deaf".utf8))
            var since = try await b.changes(Self.container, since: 0).cursor
            for round in 0..<4 {
                let from = since
                let poll = Task { try await b.changes(Self.container, since: from, wait: 20) }
                try await Task.sleep(for: .milliseconds(200))
                let t0 = ContinuousClock.now
                _ = try await a.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("r\(round)", chunk, t: 1)))
                let page = try await poll.value
                let latency = ContinuousClock.now - t0
                #expect(page.changes.count == 1, "round \(round)")
                since = page.cursor
                // Right after the cut: at most the catch-up interval (2 s) plus slack; after the
                // reconnect (1 s), NOTIFY again.
                #expect(latency < (round == 0 ? .seconds(4) : .milliseconds(1500)), "round \(round): woke after \(latency)")
                if round == 0 { try await Task.sleep(for: .seconds(3)) }
            }
        }
    }

    /// A device revoked through one instance has its long-poll on the other answered 401 within
    /// the second the revocation takes to spread; a poll of a device still enrolled waits on.
    @Test func aRevocationOnOneInstanceEndsTheDevicesLongPollOnTheOther() async throws {
        try await Self.withCluster(3) { servers, tokens, _, _ in
            let a = NimbusClient(baseURL: servers[0].url, token: tokens[0])
            let b = NimbusClient(baseURL: servers[1].url, token: tokens[1])
            let c = NimbusClient(baseURL: servers[1].url, token: tokens[2])
            let start = try await a.createContainer(Self.container).cursor
            let polled = Task { try await b.changes(Self.container, since: start, wait: 25) }
            let other = Task { try await c.changes(Self.container, since: start, wait: 6) }
            try await Task.sleep(for: .milliseconds(300))
            let revoked = ContinuousClock.now
            _ = try await a.revokeDevice("device-1")
            do {
                let page = try await polled.value
                Issue.record("the revoked device's long-poll was answered with \(page.changes.count) changes")
            } catch let e as RemoteError {
                #expect(e.code == .unauthorized, "\(e)")
            }
            let answered = ContinuousClock.now - revoked
            print("sync figures: a revocation on instance 1 ended the device's long-poll on instance 2 after \(answered)")
            #expect(answered < .seconds(3), "answered \(answered) after the revocation")
            #expect(try await other.value.changes.isEmpty)
            #expect(ContinuousClock.now - revoked > .seconds(5), "the enrolled device's poll waited its whole time")
        }
    }
}
