import Foundation
import NIOCore
import Synchronization

/// Wakes long-polls when a container's journal advances.
///
/// `latest` remembers the newest sequence announced per container, so a poll that registers after
/// a commit it has not read yet returns at once instead of sleeping through it. Waiters and
/// `latest` are guarded by one `Mutex`; continuations are resumed outside it. `close()` (the
/// server begins to stop) answers every open poll at once, and every later one without waiting.
public final class CommitNotifier: Sendable {
    private enum Slot {
        case waiting(CheckedContinuation<Void, Never>)
        case cancelled
    }
    private struct State {
        var latest: [Int64: Int64] = [:]
        var waiters: [Int64: [UUID: (after: Int64, slot: Slot)]] = [:]
        var closed = false
    }
    private let state = Mutex(State())

    /// Where an announcement came from: a commit on this instance, another instance's NOTIFY, or
    /// the periodic catch-up read of a shared store.
    public enum Source: String, Sendable, CaseIterable {
        case commit
        case notification
        case catchUp = "catch-up"
    }
    private let onAnnounce: @Sendable (Source) -> Void

    /// `onAnnounce` is told of every announcement (the server counts them by source in /metrics).
    public init(onAnnounce: @escaping @Sendable (Source) -> Void = { _ in }) {
        self.onAnnounce = onAnnounce
    }

    /// Announces that `container`'s journal reached `seq`.
    public func notify(container: Int64, seq: Int64, source: Source = .commit) {
        onAnnounce(source)
        let ready: [CheckedContinuation<Void, Never>] = state.withLock { s in
            s.latest[container] = max(s.latest[container] ?? 0, seq)
            guard var list = s.waiters[container] else { return [] }
            var out: [CheckedContinuation<Void, Never>] = []
            for (id, w) in list where w.after < seq {
                if case .waiting(let c) = w.slot { out.append(c) }
                list[id] = nil
            }
            s.waiters[container] = list.isEmpty ? nil : list
            return out
        }
        for c in ready { c.resume() }
    }

    /// Returns when `container` passes `after`, or after `timeout`, or when the task is cancelled.
    ///
    /// A waiting poll costs one continuation and one timer, no task of its own: thousands of idle
    /// devices hold a poll each (scripts/bench-server measures 10,000).
    /// `closed`: the client's connection; when it closes the wait ends (nobody is left to answer).
    public func wait(container: Int64, after: Int64, timeout: Duration, closed: EventLoopFuture<Void>? = nil) async {
        let id = UUID()
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let resumeNow: Bool = state.withLock { s in
                    if case .cancelled = s.waiters[container]?[id]?.slot {
                        s.waiters[container]?[id] = nil
                        if s.waiters[container]?.isEmpty == true { s.waiters[container] = nil }
                        return true
                    }
                    if s.closed || (s.latest[container] ?? 0) > after { return true }
                    s.waiters[container, default: [:]][id] = (after, .waiting(c))
                    return false
                }
                if resumeNow { return c.resume() }
                // At most a day (polls wait at most a minute; this only keeps the arithmetic in range).
                let (seconds, attoseconds) = min(max(timeout, .zero), .seconds(86_400)).components
                let nanos = Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
                DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(nanos)) { [self] in
                    release(container: container, id: id, markIfAbsent: false)
                }
                closed?.whenComplete { [self] _ in release(container: container, id: id, markIfAbsent: false) }
            }
        } onCancel: {
            release(container: container, id: id, markIfAbsent: true)
        }
    }

    /// Ends the wait `id` if it is still registered (its timer fired, or its task was cancelled).
    /// A cancellation that comes before the wait registered leaves a mark, so the wait ends at once.
    private func release(container: Int64, id: UUID, markIfAbsent: Bool) {
        let c: CheckedContinuation<Void, Never>? = state.withLock { s in
            if let w = s.waiters[container]?[id] {
                s.waiters[container]?[id] = nil
                if s.waiters[container]?.isEmpty == true { s.waiters[container] = nil }
                if case .waiting(let c) = w.slot { return c }
                return nil
            }
            if markIfAbsent { s.waiters[container, default: [:]][id] = (Int64.max, .cancelled) }
            return nil
        }
        c?.resume()
        if c == nil, markIfAbsent {
            // The mark is for a wait about to register; a cancellation that came just after its
            // wait ended (between the resume and the end of the handler) marks a wait that never
            // comes. Marks go after a while either way, so none is left behind.
            DispatchQueue.global().asyncAfter(deadline: .now() + Self.markLifetime) { [self] in
                state.withLock { s in
                    guard case .cancelled? = s.waiters[container]?[id]?.slot else { return }
                    s.waiters[container]?[id] = nil
                    if s.waiters[container]?.isEmpty == true { s.waiters[container] = nil }
                }
            }
        }
    }

    /// How long the mark of a cancellation that came before its wait registered is kept.
    static let markLifetime: DispatchTimeInterval = .seconds(2)

    /// Ends every wait now and every later one at once: the server is stopping, and a long-poll
    /// answered with what it has lets the device's next request find the new instance (or see the
    /// server gone) instead of holding the stop for up to the poll's whole wait.
    public func close() {
        let all: [CheckedContinuation<Void, Never>] = state.withLock { s in
            s.closed = true
            defer { s.waiters = [:] }
            return s.waiters.values.flatMap { $0.values.compactMap { if case .waiting(let c) = $0.slot { c } else { nil } } }
        }
        for c in all { c.resume() }
    }

    /// Ends every wait now (without closing): a revocation, so every poll checks its token again.
    public func wakeAll() {
        let all: [CheckedContinuation<Void, Never>] = state.withLock { s in
            var out: [CheckedContinuation<Void, Never>] = []
            for (container, list) in s.waiters {
                var kept = list
                for (id, w) in list {
                    guard case .waiting(let c) = w.slot else { continue }
                    out.append(c)
                    kept[id] = nil
                }
                s.waiters[container] = kept.isEmpty ? nil : kept
            }
            return out
        }
        for c in all { c.resume() }
    }

    /// Whether `close()` was called (the server is stopping).
    public var isClosed: Bool { state.withLock { $0.closed } }

    /// The containers that long-polls are waiting on (what a catch-up needs to re-read).
    public var waitedContainers: [Int64] {
        state.withLock { s in s.waiters.compactMap { $0.value.values.contains { if case .waiting = $0.slot { true } else { false } } ? $0.key : nil } }
    }

    /// Polls waiting now.
    public var waitingCount: Int {
        state.withLock { s in s.waiters.values.reduce(0) { n, list in n + list.values.filter { if case .waiting = $0.slot { true } else { false } }.count } }
    }

    /// Everything registered: waiting polls and marks of cancellations (which go by themselves
    /// within `markLifetime`).
    public var registeredCount: Int {
        state.withLock { $0.waiters.values.reduce(0) { $0 + $1.count } }
    }
}

/// A source of commits made by other processes on a shared store (PostgreSQL's LISTEN/NOTIFY).
/// `NimbusServerApp.run` feeds it into its notifier while it serves, so long-polls on this
/// instance wake for commits made through any instance.
public protocol CommitFeed: Sendable {
    /// Announces other instances' commits to `notifier` until the task is cancelled.
    func follow(into notifier: CommitNotifier) async

    /// Makes sure commits to `container` made through any instance are announced for at least
    /// as long as the longest long-poll (`ProtocolLimits.maxWaitSeconds`). A poll calls it before
    /// it reads the changes it may then wait after.
    func watch(_ container: ContainerRecord) async throws
}
