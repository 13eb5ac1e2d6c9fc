import Coordination
import Foundation
import Testing

// The claim state machine as transition tables (each step: the operation and exactly the actions
// it must return) and as seeded random interleavings checked against a byte-by-byte model.

let p1 = LockOwner(.posix(1), label: "pid 1"), p2 = LockOwner(.posix(2), label: "pid 2"), p3 = LockOwner(.posix(3), label: "pid 3")
let f1 = LockOwner(.flock(11), label: "flock 1"), f2 = LockOwner(.flock(12), label: "flock 2")
let readOnlyFlock = LockOwner(.flock(13), label: "flock 3 (cannot write)", holdsSync: false)
let readOnlyPosix = LockOwner(.posix(4), label: "pid 4 (cannot write)", holdsSync: false)
let engine = LockOwner(.claim(21), label: "sync: apply"), upload = LockOwner(.claim(22), label: "sync: upload")

enum Op {
    case lock(UInt64, LockOwner, ByteRange, LockMode, wait: Bool, deadline: Int64? = nil)
    case unlock(LockOwner, ByteRange)
    case releaseAll(LockOwner)
    case cancel(UInt64)
    case expire(Int64)
}

struct Step {
    var op: Op
    var expect: [LockAction]
    init(_ op: Op, _ expect: [LockAction] = []) { self.op = op; self.expect = expect }
}

func run(_ t: inout LockTable<Int>, _ op: Op) -> [LockAction] {
    switch op {
    case let .lock(r, o, range, mode, wait, deadline): t.lock(r, item: 1, owner: o, range: range, mode: mode, wait: wait, deadline: deadline)
    case let .unlock(o, range): t.unlock(item: 1, owner: o, range: range)
    case let .releaseAll(o): t.releaseAll(owner: o)
    case let .cancel(r): t.cancel(r)
    case let .expire(now): t.expire(now: now)
    }
}

let whole = ByteRange.whole
func r(_ a: UInt64, _ b: UInt64) -> ByteRange { ByteRange(a, b) }
func grant(_ r: UInt64) -> LockAction { .grant(request: r) }

struct LockTableTableTests {
    static let tables: [(String, [Step])] = [
        ("shared locks of two processes coexist; exclusive waits for both", [
            Step(.lock(1, p1, whole, .shared, wait: true), [grant(1)]),
            Step(.lock(2, p2, whole, .shared, wait: true), [grant(2)]),
            Step(.lock(3, p3, whole, .exclusive, wait: true)),
            Step(.unlock(p1, whole)),
            Step(.unlock(p2, whole), [grant(3)]),
        ]),
        ("non-blocking request on a held range: wouldBlock naming the holder", [
            Step(.lock(1, p1, r(0, 10), .exclusive, wait: false), [grant(1)]),
            Step(.lock(2, p2, r(5, 6), .shared, wait: false), [.deny(request: 2, .wouldBlock(blockers: [p1]))]),
            Step(.lock(3, p2, r(10, 20), .exclusive, wait: false), [grant(3)]),
        ]),
        ("a lock by a user who cannot write the file coordinates programs but never holds a claim back", [
            Step(.lock(1, readOnlyFlock, whole, .exclusive, wait: false), [grant(1)]),
            Step(.lock(2, upload, whole, .shared, wait: false), [grant(2)]),
            Step(.lock(3, engine, whole, .exclusive, wait: true, deadline: 100)),
            Step(.releaseAll(upload), [grant(3)]),
            Step(.lock(4, f2, whole, .shared, wait: false), [.deny(request: 4, .wouldBlock(blockers: [readOnlyFlock, engine]))]),
            Step(.releaseAll(engine)),
            Step(.lock(5, f2, whole, .shared, wait: false), [.deny(request: 5, .wouldBlock(blockers: [readOnlyFlock]))]),
            Step(.lock(6, readOnlyPosix, whole, .exclusive, wait: false), [grant(6)]),
            Step(.lock(7, p1, r(0, 1), .shared, wait: false), [.deny(request: 7, .wouldBlock(blockers: [readOnlyPosix]))]),
            Step(.lock(8, engine, whole, .exclusive, wait: false), [grant(8)]),
        ]),
        ("POSIX and flock locks ignore each other (Linux); a claim conflicts with both", [
            Step(.lock(1, p1, whole, .exclusive, wait: false), [grant(1)]),
            Step(.lock(2, f1, whole, .exclusive, wait: false), [grant(2)]),
            Step(.lock(3, engine, whole, .shared, wait: true, deadline: 100)),
            Step(.unlock(p1, whole)),
            Step(.unlock(f1, whole), [grant(3)]),
            Step(.lock(4, p2, r(0, 1), .exclusive, wait: false), [.deny(request: 4, .wouldBlock(blockers: [engine]))]),
            Step(.lock(5, p2, r(0, 1), .shared, wait: false), [grant(5)]),
        ]),
        ("a claim waits at most until its deadline, and says who was in the way", [
            Step(.lock(1, f1, whole, .exclusive, wait: false), [grant(1)]),
            Step(.lock(2, engine, whole, .exclusive, wait: true, deadline: 50)),
            Step(.expire(49)),
            Step(.expire(50), [.deny(request: 2, .timedOut(blockers: [f1]))]),
            Step(.unlock(f1, whole)),
        ]),
        ("the classic two-process deadlock is refused with the cycle", [
            Step(.lock(1, p1, r(0, 1), .exclusive, wait: true), [grant(1)]),
            Step(.lock(2, p2, r(1, 2), .exclusive, wait: true), [grant(2)]),
            Step(.lock(3, p1, r(1, 2), .exclusive, wait: true)),
            Step(.lock(4, p2, r(0, 1), .exclusive, wait: true), [.deny(request: 4, .deadlock(cycle: [p2, p1, p2]))]),
            Step(.unlock(p2, r(1, 2)), [grant(3)]),
        ]),
        ("two shared holders both upgrading: the second is refused, the first goes through", [
            Step(.lock(1, p1, whole, .shared, wait: true), [grant(1)]),
            Step(.lock(2, p2, whole, .shared, wait: true), [grant(2)]),
            Step(.lock(3, p1, whole, .exclusive, wait: true)),
            Step(.lock(4, p2, whole, .exclusive, wait: true), [.deny(request: 4, .deadlock(cycle: [p2, p1, p2]))]),
            Step(.unlock(p2, whole), [grant(3)]),
        ]),
        ("a flock conversion drops the old lock first, as Linux does", [
            Step(.lock(1, f1, whole, .shared, wait: true), [grant(1)]),
            Step(.lock(2, f2, whole, .shared, wait: true), [grant(2)]),
            Step(.lock(3, f2, whole, .exclusive, wait: true)),
            // f1 upgrading would deadlock with f2 waiting on it, but dropping first lets f2 in.
            Step(.lock(4, f1, whole, .exclusive, wait: true), [grant(3)]),
            Step(.unlock(f2, whole), [grant(4)]),
        ]),
        ("unlocking the middle of a POSIX lock splits it", [
            Step(.lock(1, p1, r(0, 30), .exclusive, wait: false), [grant(1)]),
            Step(.unlock(p1, r(10, 20))),
            Step(.lock(2, p2, r(12, 18), .exclusive, wait: false), [grant(2)]),
            Step(.lock(3, p2, r(25, 26), .shared, wait: false), [.deny(request: 3, .wouldBlock(blockers: [p1]))]),
            Step(.lock(4, p2, r(5, 6), .shared, wait: false), [.deny(request: 4, .wouldBlock(blockers: [p1]))]),
        ]),
        ("converting part of an exclusive lock to shared lets a waiting reader in", [
            Step(.lock(1, p1, r(0, 10), .exclusive, wait: false), [grant(1)]),
            Step(.lock(2, p2, r(0, 5), .shared, wait: true)),
            Step(.lock(3, p1, r(0, 10), .shared, wait: false), [grant(3), grant(2)]),
        ]),
        ("closing a file releases its locks and cancels its waits", [
            Step(.lock(1, p1, whole, .exclusive, wait: false), [grant(1)]),
            Step(.lock(2, p2, whole, .exclusive, wait: true)),
            Step(.lock(3, p3, r(0, 1), .shared, wait: true)),
            Step(.releaseAll(p2), [.deny(request: 2, .cancelled)]),
            Step(.releaseAll(p1), [grant(3)]),
        ]),
        ("an interrupted wait is withdrawn; cancelling twice does nothing", [
            Step(.lock(1, engine, whole, .exclusive, wait: false), [grant(1)]),
            Step(.lock(2, p1, whole, .shared, wait: true)),
            Step(.cancel(2), [.deny(request: 2, .cancelled)]),
            Step(.cancel(2)),
            Step(.unlock(engine, whole)),
        ]),
        ("an upload claim (shared) waits for a program's exclusive lock (mid-save)", [
            Step(.lock(1, p1, r(0, 4096), .exclusive, wait: false), [grant(1)]),
            Step(.lock(2, upload, whole, .shared, wait: true, deadline: 10)),
            Step(.lock(3, p2, r(8192, 8193), .shared, wait: false), [grant(3)]),
            Step(.unlock(p1, whole), [grant(2)]),
        ]),
    ]

    @Test(arguments: tables.indices) func transitionTable(_ i: Int) {
        let (name, steps) = Self.tables[i]
        var t = LockTable<Int>()
        for (n, step) in steps.enumerated() {
            let got = run(&t, step.op)
            #expect(got == step.expect, "\(name), step \(n): \(step.op) returned \(got), expected \(step.expect)")
        }
    }

    @Test func getlkNamesTheFirstConflict() {
        var t = LockTable<Int>()
        _ = t.lock(1, item: 1, owner: p1, range: r(100, 200), mode: .shared, wait: false)
        #expect(t.conflict(item: 1, owner: p2, range: r(0, 150), mode: .exclusive)?.owner == p1)
        #expect(t.conflict(item: 1, owner: p2, range: r(0, 150), mode: .shared) == nil)
        #expect(t.conflict(item: 1, owner: p1, range: r(0, 150), mode: .exclusive) == nil)
        #expect(t.conflict(item: 2, owner: p2, range: whole, mode: .exclusive) == nil)
        #expect(t.programLock(on: 1) == .shared)
        _ = t.lock(2, item: 1, owner: f1, range: whole, mode: .exclusive, wait: false)
        #expect(t.programLock(on: 1) == .exclusive)
        // A lock of a user who cannot write the file is no program lock for the sync engine.
        _ = t.lock(3, item: 2, owner: readOnlyFlock, range: whole, mode: .exclusive, wait: false)
        #expect(t.programLock(on: 2) == nil)
    }

    @Test func flockLengthsFollowStructFlock() {
        #expect(ByteRange(start: 10, length: 0) == ByteRange(10, .max))
        #expect(ByteRange(start: 10, length: 5) == ByteRange(10, 15))
        #expect(ByteRange(start: .max - 1, length: 10) == ByteRange(.max - 1, .max))
    }
}

/// Random interleavings of every operation by processes, flock holders and claims, checked after
/// each step against a model kept byte by byte (bytes 0..<8; byte 8 stands for "8 to EOF"):
/// granted locks never conflict, the table's locks equal the model's, every waiter is really
/// blocked, a deadlock refusal names a real cycle and a wait is allowed only when there is none.
/// NIMBUS_SEED=N replays one seed.
struct LockTableRandomTests {
    static let owners = [p1, p2, p3, f1, f2, engine, upload]
    static let bytes = 9

    struct Model {
        var hold: [[LockOwner: LockMode]] = Array(repeating: [:], count: LockTableRandomTests.bytes)
        var waiting: [UInt64: (LockOwner, ByteRange, LockMode)] = [:]

        static func interacts(_ a: LockOwner, _ b: LockOwner) -> Bool {
            switch (a.kind, b.kind) {
            case (.claim, _), (_, .claim), (.posix, .posix), (.flock, .flock): true
            default: false
            }
        }

        static func byteRange(_ r: ByteRange) -> Range<Int> {
            Int(r.start)..<(r.end == .max ? LockTableRandomTests.bytes : Int(r.end))
        }

        func blockers(_ o: LockOwner, _ r: ByteRange, _ m: LockMode) -> Set<LockOwner> {
            var out: Set<LockOwner> = []
            for b in Self.byteRange(r) {
                for (h, hm) in hold[b] where h != o && Self.interacts(h, o) && (hm == .exclusive || m == .exclusive) { out.insert(h) }
            }
            return out
        }

        mutating func apply(_ o: LockOwner, _ r: ByteRange, _ m: LockMode) {
            for b in Self.byteRange(r) { hold[b][o] = m }
        }

        mutating func remove(_ o: LockOwner, _ r: ByteRange) {
            for b in Self.byteRange(r) { hold[b][o] = nil }
        }

        /// Whether `o` waiting for `blockers` closes a cycle.
        func hasCycle(_ o: LockOwner, _ first: Set<LockOwner>) -> Bool {
            var seen: Set<LockOwner> = []
            var stack = Array(first)
            while let x = stack.popLast() {
                if x == o { return true }
                guard seen.insert(x).inserted else { continue }
                for (_, (wo, wr, wm)) in waiting where wo == x { stack += blockers(wo, wr, wm) }
            }
            return false
        }
    }

    struct SplitMix {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
    }

    static var seeds: [UInt64] {
        if let s = ProcessInfo.processInfo.environment["NIMBUS_SEED"].flatMap(UInt64.init) { return [s] }
        return Array(1...200)
    }

    @Test func randomInterleavingsMatchTheModel() {
        for seed in Self.seeds { check(seed: seed) }
    }

    func check(seed: UInt64) {
        var rng = SplitMix(state: seed)
        var t = LockTable<Int>()
        var m = Model()
        var nextRequest: UInt64 = 1
        var now: Int64 = 0
        var trace: [String] = []

        func fail(_ why: String) {
            let recent = trace.suffix(12).joined(separator: "\n")
            Issue.record("seed \(seed) (replay: NIMBUS_SEED=\(seed)): \(why)\n\(recent)")
        }

        /// Applies the actions of one step to the model, checking each is allowed.
        func absorb(_ actions: [LockAction], expectingDenialOf own: UInt64? = nil) -> Bool {
            for a in actions {
                switch a {
                case .grant(let r):
                    guard let (o, range, mode) = m.waiting.removeValue(forKey: r) else { fail("granted \(r), which was not waiting"); return false }
                    let b = m.blockers(o, range, mode)
                    if !b.isEmpty { fail("granted \(r) to \(o) while \(b) held conflicting locks"); return false }
                    m.apply(o, range, mode)
                case .deny(let r, _):
                    if m.waiting.removeValue(forKey: r) == nil && r != own { fail("denied \(r), which was not waiting"); return false }
                }
            }
            return true
        }

        for _ in 0..<300 {
            now += Int64(rng.below(5))
            let o = Self.owners[rng.below(Self.owners.count)]
            let isWaiting = m.waiting.values.contains { $0.0 == o }
            let choice = rng.below(10)
            var actions: [LockAction]
            switch choice {
            case 0..<5 where !isWaiting:
                let range: ByteRange
                if case .posix = o.kind {
                    let a = rng.below(Self.bytes - 1)
                    let b = a + 1 + rng.below(Self.bytes - a)
                    range = ByteRange(UInt64(a), b == Self.bytes ? .max : UInt64(b))
                } else { range = .whole }
                let mode: LockMode = rng.below(2) == 0 ? .shared : .exclusive
                let wait = rng.below(3) != 0
                let deadline: Int64? = { if case .claim = o.kind { return now + Int64(1 + rng.below(20)) } else { return nil } }()
                let r = nextRequest
                nextRequest += 1
                trace.append("t=\(now) lock \(r) \(o) \(range) \(mode) wait=\(wait)")
                // A flock conversion drops the old lock first: mirror it in the model.
                if case .flock = o.kind, m.hold[0][o].map({ $0 != mode }) == true { m.remove(o, .whole) }
                let before = m.blockers(o, range, mode)
                actions = t.lock(r, item: 1, owner: o, range: range, mode: mode, wait: wait, deadline: deadline)
                trace.append("  -> \(actions)")
                // Actions in order: grants from a flock conversion's drop, then this request's
                // answer, then grants its conversion to shared allowed.
                var answered = false
                for a in actions {
                    let mine: Bool = switch a { case .grant(let x): x == r; case .deny(let x, _): x == r }
                    guard mine else {
                        guard absorb([a]) else { return }
                        continue
                    }
                    answered = true
                    let blockers = m.blockers(o, range, mode)
                    switch a {
                    case .grant:
                        if !blockers.isEmpty { fail("granted \(r) though \(blockers) hold conflicting locks"); return }
                        m.apply(o, range, mode)
                    case .deny(_, .wouldBlock(let b)):
                        if wait || blockers.isEmpty || Set(b) != blockers { fail("wouldBlock \(b) for \(r); model blockers \(blockers), wait=\(wait)"); return }
                    case .deny(_, .deadlock(let cycle)):
                        if !wait || !m.hasCycle(o, blockers) || cycle.first != o || cycle.last != o { fail("deadlock \(cycle) for \(r) without a cycle in the model"); return }
                    case .deny(_, let d):
                        fail("unexpected denial \(d) of a new request"); return
                    }
                }
                if !answered {
                    let blockers = m.blockers(o, range, mode)
                    if !wait || blockers.isEmpty || m.hasCycle(o, blockers) { fail("\(r) waits: wait=\(wait) blockers=\(blockers) (before \(before))"); return }
                    m.waiting[r] = (o, range, mode)
                }
            case 5, 6:
                let range: ByteRange
                if case .posix = o.kind {
                    let a = rng.below(Self.bytes - 1)
                    range = ByteRange(UInt64(a), UInt64(a + 1 + rng.below(Self.bytes - 1 - a)))
                } else { range = .whole }
                trace.append("t=\(now) unlock \(o) \(range)")
                m.remove(o, range)
                actions = t.unlock(item: 1, owner: o, range: range)
                trace.append("  -> \(actions)")
                guard absorb(actions) else { return }
            case 7:
                trace.append("t=\(now) releaseAll \(o)")
                m.remove(o, .whole)
                actions = t.releaseAll(owner: o)
                trace.append("  -> \(actions)")
                let cancelled = m.waiting.filter { $0.value.0 == o }.map(\.key)
                for c in cancelled where !actions.contains(.deny(request: c, .cancelled)) { fail("releaseAll did not cancel \(c)"); return }
                guard absorb(actions) else { return }
            case 8:
                guard let victim = m.waiting.keys.sorted().first else { continue }
                trace.append("t=\(now) cancel \(victim)")
                actions = t.cancel(victim)
                trace.append("  -> \(actions)")
                if actions != [.deny(request: victim, .cancelled)] { fail("cancel \(victim) returned \(actions)"); return }
                m.waiting[victim] = nil
            default:
                trace.append("t=\(now) expire")
                actions = t.expire(now: now)
                trace.append("  -> \(actions)")
                guard absorb(actions) else { return }
            }

            // Invariants after every step.
            for b in 0..<Self.bytes {
                let hs = Array(m.hold[b])
                for i in hs.indices { for j in hs.indices where i < j {
                    if Model.interacts(hs[i].key, hs[j].key) && (hs[i].value == .exclusive || hs[j].value == .exclusive) {
                        fail("byte \(b): \(hs[i]) and \(hs[j]) conflict"); return
                    }
                } }
            }
            var fromTable = Array(repeating: [LockOwner: LockMode](), count: Self.bytes)
            for h in t.locks(on: 1) { for b in Model.byteRange(h.range) { fromTable[b][h.owner] = h.mode } }
            if fromTable != m.hold { fail("table \(t.locks(on: 1)) differs from the model \(m.hold)"); return }
            for (r, w) in m.waiting where m.blockers(w.0, w.1, w.2).isEmpty { fail("\(r) still waits though nothing blocks it"); return }
            if Set(t.waiting.map(\.request)) != Set(m.waiting.keys) { fail("waiters \(t.waiting.map(\.request)) vs model \(m.waiting.keys.sorted())"); return }
        }
        // Everyone lets go: nothing is held, nobody waits.
        for o in Self.owners {
            m.remove(o, .whole)
            guard absorb(t.releaseAll(owner: o)) else { return }
        }
        if !t.locks(on: 1).isEmpty || !t.waiting.isEmpty { fail("left over after releasing everything: \(t.locks(on: 1)) \(t.waiting)") }
    }
}
