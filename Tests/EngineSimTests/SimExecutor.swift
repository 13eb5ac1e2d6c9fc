import Foundation
import Synchronization
import SyncEngine

/// The deterministic simulation's executor: one queue of jobs, run one at a time, in the order
/// they were enqueued, on the thread that drives it (`SimWorld.drive`). Every task of every
/// device (engines, their jobs, the steps) prefers it, so which job runs next depends only on
/// what ran before: a seed replays byte for byte.
///
/// A job enqueued from another thread means something escaped the simulation (a dispatch
/// queue, a thread, the global pool): `foreign` counts them and the run fails.
final class SimExecutor: TaskExecutor, SerialExecutor, @unchecked Sendable {
    // @unchecked: `jobs`, `driver` and `foreign` are guarded by `lock`.
    private let lock = NSLock()
    private var jobs: [UnownedJob] = []
    private var head = 0
    private var driver: pthread_t?
    private(set) var foreign = 0
    private(set) var ran = 0

    func enqueue(_ job: consuming ExecutorJob) {
        let j = UnownedJob(job)
        lock.withLock {
            if let d = driver, pthread_equal(d, pthread_self()) == 0 { foreign += 1 }
            jobs.append(j)
        }
    }

    func asUnownedTaskExecutor() -> UnownedTaskExecutor { UnownedTaskExecutor(ordinary: self) }
    func asUnownedSerialExecutor() -> UnownedSerialExecutor { UnownedSerialExecutor(ordinary: self) }

    /// Runs jobs until none is ready; the number run.
    @discardableResult
    func runUntilIdle() -> Int {
        lock.withLock { if driver == nil { driver = pthread_self() } }
        var n = 0
        while let job = next() {
            job.runSynchronously(isolatedTo: asUnownedSerialExecutor(), taskExecutor: asUnownedTaskExecutor())
            n += 1
        }
        lock.withLock { ran += n }
        return n
    }

    private func next() -> UnownedJob? {
        lock.withLock {
            guard head < jobs.count else {
                jobs.removeAll(keepingCapacity: true)
                head = 0
                return nil
            }
            defer { head += 1 }
            return jobs[head]
        }
    }
}

/// Simulated time: it moves only when the driver finds every task waiting (`advance`), to the
/// earliest sleeper's deadline. Sleepers with the same deadline wake in the order they slept.
final class SimClock: TimeSource, @unchecked Sendable {
    // @unchecked: everything is guarded by `lock`.
    private let lock = NSLock()
    let origin = ContinuousClock.now
    private var elapsed: Duration = .zero
    private var sleepers: [(at: Duration, seq: UInt64, cont: CheckedContinuation<Void, Never>)] = []
    private var seq: UInt64 = 0

    var now: ContinuousClock.Instant { origin + lock.withLock { elapsed } }
    var time: Duration { lock.withLock { elapsed } }
    /// Nanoseconds since the start (the filesystem's clocks).
    var nanoseconds: Int64 {
        let c = time.components
        return c.seconds * 1_000_000_000 + c.attoseconds / 1_000_000_000
    }

    func sleep(for d: Duration) async {
        let id: UInt64 = lock.withLock { seq += 1; return seq }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let now = lock.withLock { () -> Bool in
                    if Task.isCancelled { return true }
                    sleepers.append((elapsed + max(d, .zero), id, c))
                    return false
                }
                if now { c.resume() }
            }
        } onCancel: {
            let c = lock.withLock { () -> CheckedContinuation<Void, Never>? in
                guard let i = sleepers.firstIndex(where: { $0.seq == id }) else { return nil }
                return sleepers.remove(at: i).cont
            }
            c?.resume()
        }
    }

    /// Moves time to the earliest deadline and wakes that sleeper; false when nobody sleeps.
    func advance() -> Bool {
        let c = lock.withLock { () -> CheckedContinuation<Void, Never>? in
            guard let i = sleepers.indices.min(by: { (sleepers[$0].at, sleepers[$0].seq) < (sleepers[$1].at, sleepers[$1].seq) }) else { return nil }
            let s = sleepers.remove(at: i)
            elapsed = max(elapsed, s.at)
            return s.cont
        }
        c?.resume()
        return c != nil
    }
}
