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
}
