import Dispatch
import NimbusCore
import Synchronization

/// The shell around `LockTable` for one mount: one mutex, a clock, a timer for deadlines, and
/// the completions of waiting requests — called exactly once each, never with the mutex held.
///
/// Used from libfuse threads (program locks: fcntl, flock) and from the sync engine (claims).
/// Nothing here blocks: a request that must wait returns at once and completes later.
public final class Coordinator: Sendable {
    public typealias Completion = @Sendable (Result<Void, LockDenial>) -> Void

    struct State {
        var table = LockTable<ItemID>()
        var completions: [UInt64: Completion] = [:]
        /// Requests cancelled before they were made (an interrupt that raced its request).
        var cancelledEarly: Set<UInt64> = []
        var nextRequest: UInt64 = 1
        var nextClaimOwner: UInt64 = 1
        /// Called after locks are released (the sync engine retries what waited for them).
        var onRelease: (@Sendable (ItemID) -> Void)?
    }

    private let state = Mutex(State())
    private let timers = DispatchQueue(label: "nimbus.coordination-deadlines")

    public init() {}

    /// Monotonic nanoseconds (the core's clock).
    static func now() -> Int64 { Int64(DispatchTime.now().uptimeNanoseconds) }

    /// A new request number, for a caller that must register for interrupts before asking.
    public func newRequest() -> UInt64 {
        state.withLock { s in defer { s.nextRequest += 1 }; return s.nextRequest }
    }

    /// Called with every item whose locks were released (not under any lock).
    public func setReleaseHandler(_ h: @escaping @Sendable (ItemID) -> Void) { state.withLock { $0.onRelease = h } }

    /// Asks for a lock; `completion` runs exactly once: at once (granted, or denied without
    /// waiting) or when the wait ends (granted, deadlock refused, deadline, cancelled).
    public func lock(_ request: UInt64, item: ItemID, owner: LockOwner, range: ByteRange, mode: LockMode,
                     wait: Bool, timeout: Duration? = nil, completion: @escaping Completion) {
        let deadline = timeout.map { Self.now() + Int64($0.components.seconds) * 1_000_000_000 + $0.components.attoseconds / 1_000_000_000 }
        let actions: [LockAction] = state.withLock { s in
            if s.cancelledEarly.remove(request) != nil { return [.deny(request: request, .cancelled)] }
            s.completions[request] = completion
            return s.table.lock(request, item: item, owner: owner, range: range, mode: mode, wait: wait, deadline: deadline)
        }
        if actions.isEmpty, let timeout { scheduleExpiry(after: timeout) }
        finish(actions, own: (request, completion))
    }

    /// Releases `owner`'s locks on `range` of `item`.
    public func unlock(item: ItemID, owner: LockOwner, range: ByteRange = .whole) {
        let actions = state.withLock { $0.table.unlock(item: item, owner: owner, range: range) }
        finish(actions)
        released(item)
    }

    /// Releases everything `owner` holds on `item` (or everywhere) and cancels its waits.
    public func releaseAll(owner: LockOwner, item: ItemID? = nil) {
        let (actions, had) = state.withLock { s in
            let had = item.map { i in s.table.locks(on: i).contains { $0.owner == owner } } ?? true
            return (s.table.releaseAll(owner: owner, item: item), had)
        }
        finish(actions)
        if let item, had { released(item) }
    }

    /// Withdraws a waiting request (an interrupted system call); a request not made yet is
    /// refused when it comes.
    public func cancel(_ request: UInt64) {
        let actions: [LockAction] = state.withLock { s in
            if s.completions[request] == nil {
                s.cancelledEarly.insert(request)
                return []
            }
            return s.table.cancel(request)
        }
        finish(actions)
    }

    /// The first lock in the way of `owner` taking `range` in `mode` (F_GETLK).
    public func conflict(item: ItemID, owner: LockOwner, range: ByteRange, mode: LockMode) -> HeldLock? {
        state.withLock { $0.table.conflict(item: item, owner: owner, range: range, mode: mode) }
    }

    /// The strongest lock programs hold on `item` (nil: none).
    public func programLock(on item: ItemID) -> LockMode? {
        state.withLock { $0.table.programLock(on: item) }
    }

    /// A claim of the daemon on a whole item, waited for at most `timeout`. The returned claim
    /// must be released (`Claim.release`).
    public func claim(_ item: ItemID, _ mode: LockMode, label: String, timeout: Duration) async -> Result<Claim, LockDenial> {
        let (request, owner) = state.withLock { s in
            defer { s.nextRequest += 1; s.nextClaimOwner += 1 }
            return (s.nextRequest, LockOwner(.claim(s.nextClaimOwner), label: label))
        }
        let result: Result<Void, LockDenial> = await withCheckedContinuation { c in
            lock(request, item: item, owner: owner, range: .whole, mode: mode, wait: true, timeout: timeout) { c.resume(returning: $0) }
        }
        return result.map { Claim(coordinator: self, item: item, owner: owner) }
    }

    /// A claim taken only if nothing conflicting is held now (no waiting); nil otherwise.
    public func tryClaim(_ item: ItemID, _ mode: LockMode, label: String) -> Claim? {
        let (request, owner) = state.withLock { s in
            defer { s.nextRequest += 1; s.nextClaimOwner += 1 }
            return (s.nextRequest, LockOwner(.claim(s.nextClaimOwner), label: label))
        }
        let granted = Mutex(false)
        lock(request, item: item, owner: owner, range: .whole, mode: mode, wait: false) { r in
            if case .success = r { granted.withLock { $0 = true } }
        }
        return granted.withLock { $0 } ? Claim(coordinator: self, item: item, owner: owner) : nil
    }

    /// Every held and waiting lock, one line each (`.nimbus/claims`); `path` names the item, nil
    /// leaves its lines out.
    public func dump(path: (ItemID) -> String?) -> [String] {
        let (held, waiting) = state.withLock { s in
            (s.table.allLocks, s.table.waiting)
        }
        var lines: [String] = []
        for (item, locks) in held.sorted(by: { $0.key.description < $1.key.description }) {
            guard let p = path(item) else { continue }
            for l in locks {
                lines.append("held     \(l.mode.description.padding(9)) \(kind(l.owner)) \(l.owner.label) on \(p) bytes \(l.range)")
            }
        }
        let now = Self.now()
        for w in waiting {
            guard let p = path(w.item) else { continue }
            let left = w.deadline.map { " (gives up in \(max(0, ($0 - now) / 1_000_000)) ms)" } ?? ""
            lines.append("waiting  \(w.mode.description.padding(9)) \(kind(w.owner)) \(w.owner.label) on \(p) bytes \(w.range)\(left)")
        }
        return lines
    }

    private func kind(_ o: LockOwner) -> String {
        switch o.kind {
        case .posix: "fcntl"
        case .flock: "flock"
        case .claim: "claim"
        }
    }

    // MARK: Internals

    private func scheduleExpiry(after timeout: Duration) {
        let ns = Int(timeout.components.seconds) * 1_000_000_000 + Int(timeout.components.attoseconds / 1_000_000_000)
        timers.asyncAfter(deadline: .now() + .nanoseconds(ns + 1_000_000)) { [weak self] in
            guard let self else { return }
            let actions = self.state.withLock { $0.table.expire(now: Self.now()) }
            self.finish(actions)
        }
    }

    private func released(_ item: ItemID) {
        if let h = state.withLock({ $0.onRelease }) { h(item) }
    }

    /// Runs the completions of `actions` (outside the mutex). `own` is a request whose
    /// completion may already have been taken out of the table by its own answer.
    private func finish(_ actions: [LockAction], own: (UInt64, Completion)? = nil) {
        guard !actions.isEmpty else { return }
        let calls: [(Completion, Result<Void, LockDenial>)] = state.withLock { s in
            actions.compactMap { a in
                let (request, result): (UInt64, Result<Void, LockDenial>) = switch a {
                case .grant(let r): (r, .success(()))
                case .deny(let r, let d): (r, .failure(d))
                }
                if let c = s.completions.removeValue(forKey: request) { return (c, result) }
                if let own, own.0 == request, case .deny(_, .cancelled) = a { return (own.1, result) }
                return nil
            }
        }
        for (c, r) in calls { c(r) }
    }
}

/// A claim held by the daemon; `release()` ends it (once).
public struct Claim: Sendable {
    let coordinator: Coordinator
    public let item: ItemID
    public let owner: LockOwner
    public func release() { coordinator.unlock(item: item, owner: owner) }
}

extension LockDenial: Error, CustomStringConvertible {
    public var description: String {
        switch self {
        case .wouldBlock(let b): "held by \(b.map(\.label).joined(separator: ", "))"
        case .deadlock(let c): "would deadlock: \(c.map(\.label).joined(separator: " waits for "))"
        case .timedOut(let b): "still held by \(b.map(\.label).joined(separator: ", ")) when the wait ended"
        case .cancelled: "cancelled"
        }
    }
}

extension String {
    fileprivate func padding(_ n: Int) -> String { count >= n ? self : self + String(repeating: " ", count: n - count) }
}
