// The claim state machine (docs/coordination.md): who holds and who waits for which part of
// which item. Pure: no clock (times come in as arguments), no I/O, no threads. Every operation
// returns the actions the shell must carry out (answer a waiting request: granted or denied).
//
// Three kinds of owner share one table, so programs that never opted in are coordinated with the
// sync engine:
// - POSIX record locks (fcntl/lockf), owned by the kernel's lock owner (one per process file
//   table), over byte ranges;
// - flock locks, owned by one open file description, over the whole file;
// - claims of the daemon (sync engine work, `nimbus coordinate`), over the whole file.
// POSIX and flock locks ignore each other, as on Linux; a claim conflicts with both. Shared +
// shared never conflict; anything + exclusive does, when the owners differ and the ranges overlap.
//
// Waiting is not FIFO-fair (as Linux's lock code): a waiter is granted as soon as nothing it
// conflicts with is held; waiters never block each other. Whoever waits must bound the wait
// (claims carry a deadline; a program's blocking lock ends when it is granted, denied for a
// deadlock, or interrupted). A wait that would close a cycle of owners waiting on each other is
// refused at once with `deadlock` (EDEADLK), for every kind of owner: nothing here can deadlock.

/// Who holds or waits for a lock. Identity is `kind`; `label` only describes it.
public struct LockOwner: Hashable, Sendable, CustomStringConvertible {
    public enum Kind: Hashable, Sendable {
        /// A process's POSIX record locks: the kernel's lock owner id.
        case posix(UInt64)
        /// The flock lock of one open file description: the kernel's owner id of that open.
        case flock(UInt64)
        /// A claim of the daemon (sync engine work, `nimbus coordinate`).
        case claim(UInt64)
    }

    public var kind: Kind
    /// What a person reads in `nimbus debug claims`: "pid 4242 (sqlite3)", "sync: upload".
    public var label: String
    /// The process, for F_GETLK's `l_pid` (0 for the daemon's claims).
    public var pid: Int32
    /// Whether this owner's locks hold the daemon's claims back (the sync engine's uploads and
    /// remote versions). False for a program lock taken by a user who may not write the file:
    /// its locks coordinate it with other programs, but another local user with read access
    /// must not be able to stop the owner's file from syncing.
    public var holdsSync: Bool

    public init(_ kind: Kind, label: String, pid: Int32 = 0, holdsSync: Bool = true) {
        self.kind = kind
        self.label = label
        self.pid = pid
        self.holdsSync = holdsSync
    }

    public static func == (a: Self, b: Self) -> Bool { a.kind == b.kind }
    public func hash(into h: inout Hasher) { h.combine(kind) }
    public var description: String { label }

    /// Whether locks of these two owners can conflict at all.
    func interacts(with o: LockOwner) -> Bool {
        switch (kind, o.kind) {
        case (.claim, .claim), (.posix, .posix), (.flock, .flock): true
        case (.claim, _): o.holdsSync
        case (_, .claim): holdsSync
        default: false
        }
    }
}

public enum LockMode: Sendable, Equatable, CustomStringConvertible {
    case shared, exclusive
    public var description: String { self == .shared ? "shared" : "exclusive" }
}

/// Bytes `start..<end` of an item; `end == .max` means "to the end of the file, however long".
public struct ByteRange: Sendable, Equatable, CustomStringConvertible {
    public var start: UInt64
    public var end: UInt64

    public init(_ start: UInt64, _ end: UInt64) {
        precondition(start < end, "empty byte range")
        self.start = start
        self.end = end
    }

    public static let whole = ByteRange(0, .max)

    /// From a `struct flock`'s start and length (length 0 = to the end of the file).
    public init(start: UInt64, length: UInt64) {
        self.init(start, length == 0 || length > UInt64.max - start ? .max : start + length)
    }

    func overlaps(_ o: ByteRange) -> Bool { start < o.end && o.start < end }
    /// Overlapping or touching: merged when owner and mode match.
    func touches(_ o: ByteRange) -> Bool { start <= o.end && o.start <= end }

    public var description: String { end == .max ? "\(start)-EOF" : "\(start)-\(end - 1)" }
}

/// A lock in force.
public struct HeldLock: Sendable, Equatable {
    public var owner: LockOwner
    public var range: ByteRange
    public var mode: LockMode
}

/// Why a request was refused.
public enum LockDenial: Sendable, Equatable {
    /// Not waiting, and held by these owners (EAGAIN).
    case wouldBlock(blockers: [LockOwner])
    /// Waiting would close this cycle of owners each waiting for the next (EDEADLK).
    case deadlock(cycle: [LockOwner])
    /// The deadline passed while these owners still held conflicting locks.
    case timedOut(blockers: [LockOwner])
    /// Cancelled by the requester (an interrupted system call, a closed file).
    case cancelled
}

/// What the shell must do after an operation.
public enum LockAction: Sendable, Equatable {
    case grant(request: UInt64)
    case deny(request: UInt64, LockDenial)
}

public struct LockTable<Key: Hashable & Sendable>: Sendable {
    /// A request waiting for conflicting locks to go.
    public struct Waiter: Sendable, Equatable {
        public var request: UInt64
        public var item: Key
        public var owner: LockOwner
        public var range: ByteRange
        public var mode: LockMode
        /// Monotonic nanoseconds after which it is denied; nil = until granted or cancelled.
        public var deadline: Int64?
    }

    private var held: [Key: [HeldLock]] = [:]
    /// In arrival order.
    private var waiters: [Waiter] = []

    public init() {}

    // MARK: Queries

    /// The locks in force on `item`.
    public func locks(on item: Key) -> [HeldLock] { held[item] ?? [] }

    /// Every lock in force, by item.
    public var allLocks: [Key: [HeldLock]] { held }

    /// Requests waiting, in arrival order.
    public var waiting: [Waiter] { waiters }

    /// The first lock that would stop `owner` from taking `range` in `mode` (F_GETLK).
    public func conflict(item: Key, owner: LockOwner, range: ByteRange, mode: LockMode) -> HeldLock? {
        (held[item] ?? []).first { conflicts($0, owner, range, mode) }
    }

    /// The strongest lock that programs (POSIX or flock owners, not claims) hold on `item`,
    /// counting only owners whose locks hold sync back (`LockOwner.holdsSync`).
    public func programLock(on item: Key) -> LockMode? {
        var strongest: LockMode?
        for h in held[item] ?? [] where h.owner.holdsSync {
            if case .claim = h.owner.kind { continue }
            if h.mode == .exclusive { return .exclusive }
            strongest = .shared
        }
        return strongest
    }

    /// The earliest deadline among waiters (when the shell should call `expire`).
    public var nextDeadline: Int64? { waiters.compactMap(\.deadline).min() }

    // MARK: Operations

    /// Asks for `range` of `item` in `mode`. Granted at once when nothing conflicting is held
    /// (an owner's own locks never conflict: a POSIX owner's overlapping locks are converted to
    /// the new mode). Otherwise: `wait == false` → denied `wouldBlock`; a wait that closes a
    /// cycle → denied `deadlock`; else it waits (no action now) until a release grants it, its
    /// deadline passes (`expire`) or it is cancelled. A flock conversion (shared ⇄ exclusive) drops
    /// the old lock first, as Linux does.
    public mutating func lock(_ request: UInt64, item: Key, owner: LockOwner, range: ByteRange, mode: LockMode,
                              wait: Bool, deadline: Int64? = nil) -> [LockAction] {
        var actions: [LockAction] = []
        if case .flock = owner.kind, (held[item] ?? []).contains(where: { $0.owner == owner && $0.mode != mode }) {
            remove(owner: owner, item: item, range: .whole)
            actions += regrant()
        }
        let blockers = self.blockers(item, owner, range, mode)
        if blockers.isEmpty {
            apply(item: item, owner: owner, range: range, mode: mode)
            // A conversion to shared may let waiters in.
            return actions + [.grant(request: request)] + regrant()
        }
        if !wait { return actions + [.deny(request: request, .wouldBlock(blockers: blockers))] }
        if let cycle = cycle(from: owner, blockers: blockers) {
            return actions + [.deny(request: request, .deadlock(cycle: cycle))]
        }
        waiters.append(Waiter(request: request, item: item, owner: owner, range: range, mode: mode, deadline: deadline))
        return actions
    }

    /// Releases what `owner` holds of `range` (F_UNLCK, LOCK_UN, the end of a claim) and grants
    /// the waiters that no longer conflict.
    public mutating func unlock(item: Key, owner: LockOwner, range: ByteRange = .whole) -> [LockAction] {
        remove(owner: owner, item: item, range: range)
        return regrant()
    }

    /// Releases everything `owner` holds (on `item`, or everywhere) and cancels its waits: a
    /// closed file, an exited process, an ended claim holder.
    public mutating func releaseAll(owner: LockOwner, item: Key? = nil) -> [LockAction] {
        var actions: [LockAction] = []
        waiters.removeAll { w in
            guard w.owner == owner && (item == nil || w.item == item!) else { return false }
            actions.append(.deny(request: w.request, .cancelled))
            return true
        }
        for key in item.map({ [$0] }) ?? Array(held.keys) { remove(owner: owner, item: key, range: .whole) }
        return actions + regrant()
    }

    /// Withdraws a waiting request (an interrupted system call). Nothing if it is not waiting.
    public mutating func cancel(_ request: UInt64) -> [LockAction] {
        guard let i = waiters.firstIndex(where: { $0.request == request }) else { return [] }
        waiters.remove(at: i)
        return [.deny(request: request, .cancelled)]
    }

    /// Denies the waiters whose deadline is at or before `now`.
    public mutating func expire(now: Int64) -> [LockAction] {
        let expired = waiters.filter { w in w.deadline.map { $0 <= now } ?? false }
        guard !expired.isEmpty else { return [] }
        let actions = expired.map { w in LockAction.deny(request: w.request, .timedOut(blockers: blockers(w.item, w.owner, w.range, w.mode))) }
        waiters.removeAll { w in w.deadline.map { $0 <= now } ?? false }
        return actions
    }

    // MARK: Internals

    private func conflicts(_ h: HeldLock, _ owner: LockOwner, _ range: ByteRange, _ mode: LockMode) -> Bool {
        h.owner != owner && h.owner.interacts(with: owner) && h.range.overlaps(range)
            && (h.mode == .exclusive || mode == .exclusive)
    }

    /// Owners of the locks in the way, each once, in table order.
    private func blockers(_ item: Key, _ owner: LockOwner, _ range: ByteRange, _ mode: LockMode) -> [LockOwner] {
        var out: [LockOwner] = []
        for h in held[item] ?? [] where conflicts(h, owner, range, mode) && !out.contains(h.owner) { out.append(h.owner) }
        return out
    }

    /// A path of owners from one of `blockers` back to `owner` through waiters, if any: `owner`
    /// would wait for a blocker that (transitively) waits for `owner`.
    private func cycle(from owner: LockOwner, blockers: [LockOwner]) -> [LockOwner]? {
        var visited: Set<LockOwner> = []
        func search(_ o: LockOwner, _ path: [LockOwner]) -> [LockOwner]? {
            if o == owner { return path }
            guard visited.insert(o).inserted else { return nil }
            for w in waiters where w.owner == o {
                for next in self.blockers(w.item, w.owner, w.range, w.mode) {
                    if let found = search(next, path + [next]) { return found }
                }
            }
            return nil
        }
        for b in blockers {
            if let path = search(b, [owner, b]) { return path }
        }
        return nil
    }

    /// Grants waiters (in arrival order) that nothing conflicting holds any more. A grant can
    /// also weaken a lock (a POSIX owner converting its exclusive piece to shared), so after each
    /// grant the scan starts again.
    private mutating func regrant() -> [LockAction] {
        var actions: [LockAction] = []
        var granted = true
        while granted {
            granted = false
            if let i = waiters.firstIndex(where: { blockers($0.item, $0.owner, $0.range, $0.mode).isEmpty }) {
                let w = waiters.remove(at: i)
                apply(item: w.item, owner: w.owner, range: w.range, mode: w.mode)
                actions.append(.grant(request: w.request))
                granted = true
            }
        }
        return actions
    }

    /// Puts `owner`'s lock in force: its own pieces in `range` are replaced, and touching pieces
    /// of the same mode merged (POSIX semantics; claims and flock are whole-file).
    private mutating func apply(item: Key, owner: LockOwner, range: ByteRange, mode: LockMode) {
        remove(owner: owner, item: item, range: range)
        var list = held[item] ?? []
        var merged = range
        list.removeAll { h in
            guard h.owner == owner && h.mode == mode && h.range.touches(merged) else { return false }
            merged = ByteRange(min(merged.start, h.range.start), max(merged.end, h.range.end))
            return true
        }
        list.append(HeldLock(owner: owner, range: merged, mode: mode))
        held[item] = list
    }

    /// Removes `owner`'s locks on `range`, splitting pieces that stick out.
    private mutating func remove(owner: LockOwner, item: Key, range: ByteRange) {
        guard var list = held[item] else { return }
        var rest: [HeldLock] = []
        list.removeAll { h in
            guard h.owner == owner && h.range.overlaps(range) else { return false }
            if h.range.start < range.start { rest.append(HeldLock(owner: owner, range: ByteRange(h.range.start, range.start), mode: h.mode)) }
            if h.range.end > range.end { rest.append(HeldLock(owner: owner, range: ByteRange(range.end, h.range.end), mode: h.mode)) }
            return true
        }
        list += rest
        held[item] = list.isEmpty ? nil : list
    }
}
