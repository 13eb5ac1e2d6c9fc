import Foundation
import NimbusServer
import Testing

/// The long-poll waits: woken by a commit past their cursor, by their timeout, by cancellation
/// and by the server stopping; none is left registered afterwards.
@Suite struct CommitNotifierTests {
    @Test func aCommitWakesOnlyThePollsBehindIt() async throws {
        let n = CommitNotifier()
        let behind = Task { await n.wait(container: 1, after: 5, timeout: .seconds(30)) }
        let ahead = Task { await n.wait(container: 1, after: 9, timeout: .seconds(30)) }
        let other = Task { await n.wait(container: 2, after: 0, timeout: .seconds(30)) }
        while n.waitingCount < 3 { try await Task.sleep(for: .milliseconds(5)) }
        let t0 = ContinuousClock.now
        n.notify(container: 1, seq: 7)
        await behind.value
        #expect(ContinuousClock.now - t0 < .seconds(5))
        #expect(n.waitingCount == 2, "the poll at 9 and the other container's wait on")
        // A poll that registers after a commit it has not read returns at once.
        await n.wait(container: 1, after: 6, timeout: .seconds(30))
        ahead.cancel()
        other.cancel()
        await ahead.value
        await other.value
        #expect(n.waitingCount == 0)
    }

    @Test func thousandsOfWaitsEndAtTheirTimeoutAndLeaveNothing() async throws {
        let n = CommitNotifier()
        let t0 = ContinuousClock.now
        await withDiscardingTaskGroup { group in
            for i in 0..<5000 { group.addTask { await n.wait(container: Int64(i % 7), after: 0, timeout: .milliseconds(300)) } }
        }
        let took = ContinuousClock.now - t0
        #expect(took >= .milliseconds(300) && took < .seconds(20), "\(took)")
        #expect(n.waitingCount == 0 && n.waitedContainers.isEmpty)
    }

    @Test func closingAnswersEveryPollAndEveryLaterOneAtOnce() async throws {
        let n = CommitNotifier()
        let polls = (0..<50).map { i in Task { await n.wait(container: Int64(i % 3), after: 0, timeout: .seconds(60)) } }
        while n.waitingCount < 50 { try await Task.sleep(for: .milliseconds(5)) }
        let t0 = ContinuousClock.now
        n.close()
        for p in polls { await p.value }
        await n.wait(container: 9, after: 0, timeout: .seconds(60))
        #expect(ContinuousClock.now - t0 < .seconds(5))
        #expect(n.waitingCount == 0)
    }

    @Test func aCancelledPollEndsAtOnce() async throws {
        let n = CommitNotifier()
        let poll = Task { await n.wait(container: 1, after: 0, timeout: .seconds(60)) }
        while n.waitingCount < 1 { try await Task.sleep(for: .milliseconds(5)) }
        let t0 = ContinuousClock.now
        poll.cancel()
        await poll.value
        #expect(ContinuousClock.now - t0 < .seconds(5) && n.waitingCount == 0)
        // Cancelled before it even starts: returns at once too.
        let early = Task { await n.wait(container: 1, after: 0, timeout: .seconds(60)) }
        early.cancel()
        await early.value
        #expect(ContinuousClock.now - t0 < .seconds(5))
    }

    /// Thousands of polls where wake-ups, timeouts, cancellations (a client that goes away, before
    /// or after its poll registered or ended) and the server's stop race each other: every poll
    /// returns, and nothing is left registered (no waiter, no mark of a cancellation).
    @Test func wakeUpsTimeoutsCancellationsAndCloseRaceWithoutALeak() async throws {
        var notifiers: [CommitNotifier] = []
        for round in 0..<3 {
            let n = CommitNotifier()
            notifiers.append(n)
            var rng = SystemRandomNumberGenerator()
            var polls: [Task<Void, Never>] = []
            for k in 0..<3_000 {
                let container = Int64(k % 7)
                let after = Int64.random(in: 0...40, using: &rng)
                let timeout = Duration.milliseconds(Int.random(in: 0...30, using: &rng))
                let poll = Task { await n.wait(container: container, after: after, timeout: timeout) }
                polls.append(poll)
                switch Int.random(in: 0..<10, using: &rng) {
                case 0: poll.cancel()
                case 1: n.notify(container: container, seq: Int64.random(in: 0...50, using: &rng))
                case 2: Task { try? await Task.sleep(for: .microseconds(Int.random(in: 0...2_000))); poll.cancel() }
                case 3 where k % 50 == 0: n.wakeAll()
                default: break
                }
            }
            for poll in polls.shuffled().prefix(500) { poll.cancel() }
            if round == 2 { n.close() }
            for poll in polls { await poll.value }
            // Cancellations that came after their poll had ended leave nothing behind either.
            for poll in polls.prefix(100) { poll.cancel() }
            try await Task.sleep(for: .milliseconds(50))
            #expect(n.waitingCount == 0 && n.waitedContainers.isEmpty, "round \(round): \(n.waitingCount) polls left, containers \(n.waitedContainers)")
        }
        // Marks of cancellations go by themselves.
        try await Task.sleep(for: .milliseconds(2_300))
        for (round, n) in notifiers.enumerated() { #expect(n.registeredCount == 0, "round \(round): \(n.registeredCount) entries left") }
    }
}
