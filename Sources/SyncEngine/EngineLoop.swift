import NimbusCore
import Synchronization

/// The engine's one decision loop: every decision about items — showing server states, deciding
/// and settling a push, letting in a state held for a lock, the tick's quiet periods and pacing —
/// runs as a *turn*, and turns run one at a time, in the order they were asked for. Between turns
/// only I/O happens (the long poll, chunk uploads, commits, server lookups), so a pull never
/// interleaves its decisions with a push's: each turn sees the state the previous one left.
///
/// A turn is synchronous (it cannot await), so it never waits for another turn and a turn cannot
/// be opened inside one (`inTurn` checks it in debug builds). Waiting for a turn parks the task,
/// not a thread. libfuse threads do not take turns: they record facts (a local change, a read's
/// download) under `SyncEngine.state` and leave the decisions to the loop.
final class EngineLoop: Sendable {
    /// What a turn is for (traced with `NIMBUS_SYNC_TRACE=1`).
    enum Event: Sendable, CustomStringConvertible {
        case listed(Int)
        case page(Int)
        case skippedRetried(Int)
        case pushDue
        case pushStep(ItemID)
        case contentSent(ItemID)
        case contentApart(ItemID)
        case contentReady(ItemID)
        case commitAnswered(ItemID)
        case pushEnded(ItemID)
        case pushFailed(ItemID)
        case reverted(ItemID)
        case locksReleased(ItemID)
        case resolved(ItemID)
        case tick

        var description: String {
            switch self {
            case .listed(let n): "listed \(n)"
            case .page(let n): "page of \(n)"
            case .skippedRetried(let n): "skipped retried \(n)"
            case .pushDue: "push due"
            case .pushStep(let id): "push step \(id)"
            case .contentSent(let id): "content sent \(id)"
            case .contentApart(let id): "content apart \(id)"
            case .contentReady(let id): "content ready \(id)"
            case .commitAnswered(let id): "commit answered \(id)"
            case .pushEnded(let id): "push ended \(id)"
            case .pushFailed(let id): "push failed \(id)"
            case .reverted(let id): "reverted \(id)"
            case .locksReleased(let id): "locks released \(id)"
            case .resolved(let id): "resolved \(id)"
            case .tick: "tick"
            }
        }
    }

    private struct Queue {
        var busy = false
        /// Tasks waiting for their turn, first come first served.
        var waiting: [CheckedContinuation<Void, Never>] = []
        var head = 0
    }
    private let queue = Mutex(Queue())

    /// Set while a turn runs on this task.
    @TaskLocal static var inTurn = false

    /// Runs `body` as the next turn: after every turn asked for before it, before any asked for
    /// after it, with no other turn running.
    func turn<T>(_ event: Event, _ body: () throws -> T) async rethrows -> T {
        assert(!Self.inTurn, "a turn (\(event)) opened inside a turn")
        await enter()
        defer { leave() }
        return try Self.$inTurn.withValue(true) { try body() }
    }

    private func enter() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let now = queue.withLock { q -> Bool in
                if q.busy {
                    q.waiting.append(c)
                    return false
                }
                q.busy = true
                return true
            }
            if now { c.resume() }
        }
    }

    private func leave() {
        let next = queue.withLock { q -> CheckedContinuation<Void, Never>? in
            guard q.head < q.waiting.count else {
                q.busy = false
                q.waiting.removeAll(keepingCapacity: true)
                q.head = 0
                return nil
            }
            defer { q.head += 1 }
            return q.waiting[q.head]  // busy stays set: handed over
        }
        next?.resume()
    }
}
