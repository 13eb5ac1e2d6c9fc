import Foundation
import NimbusCore
import NimbusProtocol
@testable import NimbusServer
import NimbusTesting
import PostgresNIO
import Logging
import Testing

#if canImport(Glibc)
import Glibc
#endif

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

    /// A store on a fresh database at `adjust(location)`, with one device and container; `commit(name)`
    /// commits a new file into it. The store is shut down after `body`, also when it throws.
    static func withContainer(_ adjust: @Sendable (inout PostgresLocation) -> Void,
                              _ body: @Sendable (PostgresLocation, PostgresStore, ContainerRecord,
                                                 _ commit: @Sendable (String) async throws -> CommitResponse) async throws -> Void) async throws {
        try await PostgresScratch.withDatabase { base in
            var location = base
            adjust(&location)
            let store = try await PostgresStore.open(location)
            do {
                let device = try await store.addDevice(account: "alice", deviceName: "laptop", tokenHash: String(repeating: "c", count: 64))
                guard let container = try await store.container(account: device.accountID, name: "docs", create: true) else {
                    throw FixtureError("no container")
                }
                try await body(location, store, container) { name in
                    try await store.commit(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: ItemDraft(
                        kind: .file, parent: .root, name: ItemName(trusted: name), mode: 0o644, modified: 1)), in: container, by: device, now: 1)
                }
                await store.shutdown()
            } catch {
                await store.shutdown()
                throw error
            }
        }
    }

    /// A stuck instance (paused, cut off) that locked a container's row mid-commit and went quiet:
    /// commits into that container fail within the lock timeout with a retryable error instead of
    /// waiting for ever, and PostgreSQL ends the stuck session after the idle-in-transaction
    /// timeout, which releases the lock; commits go through again.
    @Test func aLockHeldByAStuckSessionFailsCommitsQuicklyUntilTheServerEndsIt() async throws {
        try await Self.withContainer({ $0.lockTimeout = .milliseconds(500); $0.idleInTransactionTimeout = .seconds(3) }) { location, store, container, commit in
            _ = try await commit("before")
            let logger = Logger(label: "test")
            let stuck = try await PostgresConnection.connect(configuration: location.connectionConfiguration, id: 99, logger: logger)
            _ = try await stuck.query("BEGIN", logger: logger)
            _ = try await stuck.query("SELECT cursor FROM containers WHERE id = \(container.id) FOR UPDATE", logger: logger)
            let started = ContinuousClock.now
            do {
                _ = try await commit("while stuck")
                Issue.record("a commit went through while another session held the container's lock")
            } catch let error as APIError {
                #expect(error.code == .unavailable, "\(error)")
                #expect(error.message.contains("lock"), "\(error)")
            }
            // The lock timeout once, then the answer (bound generously for a loaded machine;
            // without the timeout this would not return at all).
            #expect(ContinuousClock.now - started < .seconds(20))
            // PostgreSQL ends the stuck session once it sat idle in its transaction too long.
            let deadline = ContinuousClock.now + .seconds(20)
            while !stuck.isClosed, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(100)) }
            #expect(stuck.isClosed, "the stuck session is still open")
            try? await stuck.close()
            let after = try await commit("after")
            #expect(after.outcome == .applied)
            #expect(try await store.consistencyProblems().isEmpty)
        }
    }

    /// PostgreSQL stops answering without closing (its processes stopped: what a cut network with
    /// no reset looks like): a commit and a read fail after the answer timeout with `unavailable`
    /// instead of waiting for ever, and once the database answers again, commits go through.
    @Test func aDatabaseThatStopsAnsweringFailsACommitAfterTheAnswerTimeout() async throws {
        try await Self.withContainer({ $0.answerTimeout = .seconds(2) }) { location, store, container, commit in
            _ = try await commit("before")
            // Several connections in the pool: the commit below and the read after it each
            // take one of those (then stopped), not a new one. Reads that overlap in time (each
            // sleeps) make the pool open one connection per read; quick reads may share one.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<4 { group.addTask { _ = try await store.read("SELECT pg_sleep(0.3)") } }
                try await group.waitForAll()
            }
            // The server processes of this database's connections (the store's pool).
            let stopped = try await PostgresStore.execute(
                "SELECT pid::text FROM pg_stat_activity WHERE datname = '\(location.database)'", on: try PostgresScratch.admin())
                .compactMap { $0.flatMap { Int32($0) } }
            #expect(stopped.count >= 4, "the pool has \(stopped.count) connections")
            for pid in stopped { kill(pid, SIGSTOP) }
            do {
                let started = ContinuousClock.now
                do {
                    _ = try await commit("while stopped")
                    Issue.record("a commit went through while the database answered nothing")
                } catch let error as APIError {
                    #expect(error.code == .unavailable, "\(error)")
                    #expect(error.message.contains("did not answer"), "\(error)")
                }
                #expect(ContinuousClock.now - started < .seconds(20))
                // A read on another of the stopped connections fails the same way, as bounded. (It
                // may be handed the connection the commit's timeout is closing: then it fails at
                // once, saying the connection closed.)
                let readStarted = ContinuousClock.now
                do {
                    _ = try await store.cursor(of: container)
                    Issue.record("a read was answered while the database answered nothing")
                } catch let error as APIError {
                    #expect(error.code == .unavailable && (error.message.contains("did not answer") || error.message.contains("closed")), "\(error)")
                }
                #expect(ContinuousClock.now - readStarted < .seconds(20))
            } catch {
                for pid in stopped { kill(pid, SIGCONT) }
                throw error
            }
            for pid in stopped { kill(pid, SIGCONT) }
            let after = try await commit("after")
            #expect(after.outcome == .applied)
            #expect(try await store.consistencyProblems().isEmpty)
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

    /// The commit's round trips are what docs/deploy.md says: a new file costs 4 statements
    /// (BEGIN, the lock with its prefetch, the writes, COMMIT) and 2 waits (the prefetch; the
    /// writes with COMMIT right behind them); an edit and a move one statement more (demoting the
    /// old current version), no wait more; a commit that finds nothing to change writes nothing.
    @Test func aCommitCostsFourStatementsAndTwoWaits() async throws {
        try await PostgresScratch.withStore { store in
            let device = try await store.addDevice(account: "alice", deviceName: "laptop", tokenHash: String(repeating: "b", count: 64))
            guard let container = try await store.container(account: device.accountID, name: "docs", create: true) else {
                Issue.record("no container"); return
            }
            let folder = ItemID(UUID())
            _ = try await store.commit(CommitRequest(item: folder, baseVersion: nil, state: ItemDraft(
                kind: .folder, parent: .root, name: ItemName(trusted: "folder"), mode: 0o755, modified: 1)), in: container, by: device, now: 1)
            // A connection's first commit waits for its writes apart from COMMIT (PostgresSync.
            // commitDeferred); these leave the pool's connections warm.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for k in 0..<8 {
                    group.addTask {
                        _ = try await store.commit(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: ItemDraft(
                            kind: .file, parent: folder, name: ItemName(trusted: "warm \(k)"), mode: 0o644, modified: 1)), in: container, by: device, now: 1)
                    }
                }
                try await group.waitForAll()
            }
            func cost(_ request: CommitRequest) async throws -> (statements: Int64, waits: Int64, CommitResponse) {
                let before = store.databaseRoundTrips!
                let r = try await store.commit(request, in: container, by: device, now: 2)
                let after = store.databaseRoundTrips!
                return (after.statements - before.statements, after.waits - before.waits, r)
            }
            let id = ItemID(UUID())
            let create = try await cost(CommitRequest(item: id, baseVersion: nil, state: ItemDraft(
                kind: .file, parent: folder, name: ItemName(trusted: "a.txt"), mode: 0o644, modified: 1)))
            #expect(create.statements == 4 && create.waits == 2, "create: \(create.statements) statements, \(create.waits) waits")
            let edit = try await cost(CommitRequest(item: id, baseVersion: create.2.item.version, state: ItemDraft(
                kind: .file, parent: folder, name: ItemName(trusted: "a.txt"), mode: 0o600, modified: 2)))
            // An edit also demotes the old current version (its own statement, queued).
            #expect(edit.statements == 5 && edit.waits == 2, "edit: \(edit.statements) statements, \(edit.waits) waits")
            let move = try await cost(CommitRequest(item: id, baseVersion: edit.2.item.version, state: ItemDraft(
                kind: .file, parent: .root, name: ItemName(trusted: "b.txt"), mode: 0o600, modified: 2)))
            #expect(move.statements == 5 && move.waits == 2, "move: \(move.statements) statements, \(move.waits) waits")
            let same = try await cost(CommitRequest(item: id, baseVersion: move.2.item.version, state: ItemDraft(
                kind: .file, parent: .root, name: ItemName(trusted: "b.txt"), mode: 0o600, modified: 2)))
            #expect(same.2.outcome == .unchanged)
            #expect(same.statements == 3 && same.waits == 2, "unchanged: \(same.statements) statements, \(same.waits) waits")
            // What was written reads back as sent.
            let stored = try await store.item(id, in: container)
            #expect(stored?.state.location.name.value == "b.txt" && stored?.state.mode == 0o600 && stored?.version == move.2.item.version)
            #expect(try await store.cursor(of: container) == move.2.cursor)
            #expect(try await store.consistencyProblems().isEmpty)
        }
    }
}
