import ContainerFS
import Crypto
import Foundation
import FuseKit
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusTesting
import Synchronization

/// The deterministic simulation (docs/sync.md "Simulation"): three devices, each the shipped
/// LocalStore + ContainerFS + SyncEngine in a state directory of its own, called as the kernel
/// would (no mount), against the real `CommitEngine` in process (`SimServer`), each over a
/// `SimLink` that delays, cuts and loses answers. Every task runs on one `SimExecutor`, every
/// timer on one `SimClock`, item ids come from a counter, and the store's queue reaches the disk
/// when the seed says: the same seed gives the same run, byte for byte (`traceHash`).
final class SimWorld: @unchecked Sendable {
    // @unchecked: the run happens on the driver thread only.
    let seed: UInt64
    let executor = SimExecutor()
    let clock = SimClock()
    let server: SimServer
    let mountClock: MountClock
    let base: URL
    let container = "docs"
    var rng: SplitMix64
    private(set) var devices: [SimDevice] = []
    /// Each device's cache limit (nil: none), by name: small ones make the engines evict.
    private(set) var cacheLimits: [String: Int64?] = [:]
    /// How late each device's filesystem notices reach its engine, at most, in ms (nil: at once).
    private(set) var noticeDelays: [String: Int?] = [:]
    /// What happened, one line per step and per check: hashed for the replay test.
    private(set) var trace: [String] = []
    /// The engines' log lines (with simulated times), for the report of a failing seed; not
    /// hashed (some carry real durations).
    private let logs = Mutex<[String]>([])

    /// `NIMBUS_SIM_LOG=1`: a failing seed's report holds every log line, not the last ones
    /// (with `NIMBUS_SYNC_TRACE=1`, every decision).
    static let keepAllLogs = ProcessInfo.processInfo.environment["NIMBUS_SIM_LOG"] != nil
    /// `NIMBUS_SIM_WATCH=ID`: after every step, each device's view of that item goes to the log.
    static let watch = ProcessInfo.processInfo.environment["NIMBUS_SIM_WATCH"].flatMap(ItemID.init)

    func log(_ device: String, _ line: String) {
        let at = clock.time
        logs.withLock {
            if $0.count >= 400, !Self.keepAllLogs { $0.removeFirst(200) }
            $0.append("\(at) \(device): \(line)")
        }
    }

    struct Report: Sendable {
        var failure: String?
        var traceHash = ""
        var figures = ""
        var steps = 0
    }

    init(seed: UInt64, base: URL) {
        self.seed = seed
        self.base = base
        rng = SplitMix64(seed: seed ^ 0x5EED_0F_5EED)
        server = SimServer(clock: clock)
        let clock = self.clock
        let ids = Mutex<UInt64>(0)
        mountClock = MountClock(
            wall: { 1_800_000_000_000_000_000 + clock.nanoseconds },
            monotonic: { UInt64(clock.nanoseconds) + 1_000_000_000_000 },
            newItemID: { ItemID(SimIDs.uuid(ids.withLock { $0 += 1; return $0 }, kind: 0x17)) })
    }

    /// Runs `plan` on a thread of its own that drives the executor and the clock; returns once
    /// the run ended (or failed).
    static func run(_ plan: SimPlan) async -> Report {
        await withCheckedContinuation { (c: CheckedContinuation<Report, Never>) in
            let t = Thread { c.resume(returning: drive(plan)) }
            t.stackSize = 8 << 20
            t.start()
        }
    }

    /// The driver: runs every ready job; when none is, moves the clock to the next deadline.
    private static func drive(_ plan: SimPlan) -> Report {
        // In memory when the machine has a tmpfs: the run writes SQLite and cache files all along.
        let shm = URL(fileURLWithPath: "/dev/shm")
        let tmp = FileManager.default.isWritableFile(atPath: shm.path) ? shm : FileManager.default.temporaryDirectory
        let base = tmp.appendingPathComponent("nimbus-detsim-\(plan.seed)-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: base) }
        let world = SimWorld(seed: plan.seed, base: base)
        let result = Mutex<Report?>(nil)
        Task(executorPreference: world.executor) {
            let r = await world.play(plan)
            result.withLock { $0 = r }
        }
        // Simulated time never needs more than this; a run past it is stuck.
        let limit = Duration.seconds(3600)
        while true {
            world.executor.runUntilIdle()
            if let r = result.withLock({ $0 }) {
                var r = r
                if world.executor.foreign > 0 {
                    r.failure = (r.failure ?? "") + "\n\(world.executor.foreign) job(s) came from outside the simulation's thread: the run cannot replay"
                }
                return r
            }
            if world.clock.time > limit || !world.clock.advance() {
                // Nobody can move: stop what can be stopped and say where it hung.
                return Report(failure: "stuck at \(world.clock.time) of simulated time (\(world.clock.time > limit ? "time limit" : "no task can run")); last steps:\n"
                              + world.trace.suffix(40).joined(separator: "\n"))
            }
        }
    }

    // MARK: the run

    private func play(_ plan: SimPlan) async -> Report {
        var report = Report()
        var ledger = SimLedger()
        do {
            for i in 0..<plan.devices {
                let name = String(UnicodeScalar(UInt8(97 + i)))
                cacheLimits[name] = [nil, 64, 400][rng.below(3)]
                noticeDelays[name] = [nil, 3, 20][rng.below(3)]
                let link = SimLink(server: server, device: server.device(i, name), container: container, seed: seed &+ UInt64(i) &* 7919)
                // Some devices' servers answer 503 now and then, some lose commit answers.
                link.unavailable = rng.below(2) == 0 ? 0 : 25
                link.dropAnswers = rng.below(2) == 0 ? 0 : 12
                devices.append(try SimDevice(index: i, dir: base.appendingPathComponent(name), network: .link(link, self),
                                             token: "", container: container, contentApartBytes: plan.contentApart && i == 0 ? 16 : nil))
            }
            for d in devices { d.start() }
            for f in SimPlan.initialFolders {
                let e = try devices[0].fs.mkdir(parent: NodeID.root, name: f, mode: 0o755, caller: .process)
                devices[0].fs.forget(node: e.node, count: 1)
            }
            if let why = await settle(within: .seconds(60)) { throw SimFailure("the first folders did not reach every device: \(why)") }
            var done = 0
            for step in plan.steps {
                let outcome = await SimChecks.execute(step, on: devices[step.device], ledger: &ledger)
                if outcome.hasPrefix("ok") { done += 1 }
                trace.append("\(clock.time) \(step): \(outcome)")
                if let w = Self.watch { for d in devices { log(d.name, "watch: " + d.describe(w)) } }
                await closeWriters(ledger: &ledger, all: false)
                try await faults(after: step.round, ledger: &ledger)
                // The store's writer: each queue reaches the disk now or later, as the seed says.
                for d in devices where rng.below(3) == 0 { d.store.writePending() }
                await clock.sleep(for: .milliseconds(step.pause > 0 ? step.pause * 10 : 1 + rng.below(5)))
            }
            await closeWriters(ledger: &ledger, all: true)
            try await faults(after: nil, ledger: &ledger)
            for d in devices {
                d.restore()
                d.engine.setPaused(false)
            }
            if plan.ignores {
                // While the rules hold, every push that is not parked ends: nothing an ignored
                // item keeps here may hold back another (a folder's delete waiting for a parked
                // item below it never would).
                if let busy = await drained(within: .seconds(120)) { throw SimFailure("uploads did not end while the rules held: \(busy)") }
                await removeRules(ledger: &ledger)
            }
            let opsDone = clock.time
            if let why = await settle(within: .seconds(600)) { throw SimFailure("the devices did not agree: \(why)") }
            let lost = await SimChecks.lostContents(ledger, versionsOf: { [server] in server.versions($0) },
                                                    inTrash: { [server] in server.t.trash[$0] != nil && server.t.items[$0]?.state.deleted == true })
            if !lost.isEmpty { throw SimFailure("lost \(lost.count) of \(ledger.last.count) contents:\n" + lost.joined(separator: "\n")) }
            // Restores put items back where they were: one device's rename is no longer the
            // last word on their place.
            if !plan.restores {
                let misplaced = SimChecks.misplaced(ledger, on: devices[0], all: devices)
                if !misplaced.isEmpty { throw SimFailure("lost \(misplaced.count) of \(ledger.placed.count) renames:\n" + misplaced.joined(separator: "\n")) }
            }
            // A name a device gave an item is the server's to change only when another device's
            // item holds it: never because the device's own item had not left it yet. (Not with
            // restores: the server puts restored items, and edits that bring deleted ones back,
            // where it chooses.)
            if !plan.restores, !server.ownNameTaken.isEmpty {
                throw SimFailure("\(server.ownNameTaken.count) items put beside the same device's own item:\n" + server.ownNameTaken.joined(separator: "\n"))
            }
            let lostXattrs = SimChecks.lostXattrs(ledger, on: devices[0])
            if !lostXattrs.isEmpty { throw SimFailure("lost \(lostXattrs.count) of \(ledger.xattrs.count) attribute changes:\n" + lostXattrs.joined(separator: "\n")) }
            let tree = await devices[0].tree() ?? [:]
            trace.append("tree: " + SimChecks.show(tree))
            report.steps = plan.steps.count
            report.figures = "\(done) of \(plan.steps.count) steps done, \(ledger.writes) writes, \(ledger.last.count) contents checked, "
                + "\(server.commits) commits, tree of \(tree.count) entries; \(opsDone) of steps, settled \(clock.time - opsDone) later"
        } catch {
            report.failure = "\(error)\nsteps:\n" + trace.suffix(300).joined(separator: "\n")
                + "\nlast engine log lines:\n" + logs.withLock { $0.suffix(Self.keepAllLogs ? Int.max : 150) }.joined(separator: "\n")
        }
        for d in devices {
            await d.stop()
            d.dispose()
        }
        // The server's journal is every decision every engine made, in order.
        for c in server.t.journal {
            trace.append("\(c.seq) \(c.kind) \(server.deviceNames[c.device] ?? "?") \(c.item.id) v\(c.item.version) \(c.item.state)")
        }
        report.traceHash = SHA256.hash(data: Array(trace.joined(separator: "\n").utf8)).map { String(format: "%02x", $0) }.joined()
        return report
    }

    /// The programs' open files: each is closed now or later, as the seed draws (`all`: every
    /// one).
    private func closeWriters(ledger: inout SimLedger, all: Bool) async {
        for d in devices {
            trace += await SimChecks.closeWriters(on: d, ledger: &ledger) { all || rng.below(3) == 0 }
                .map { "\(clock.time) \($0)" }
        }
    }

    // MARK: faults

    enum Fault: String {
        /// The server refuses the device's token until it is mounted again (with a valid one).
        case unauthorized
        /// Chunk uploads are refused for the account's quota.
        case overQuota
        /// The device's disk is full: its local state cannot be saved.
        case diskFull
    }
    private var windows: [(fault: Fault, device: Int, until: Int)] = []

    /// Opens and closes fault windows at the ports, as the seed draws them; `round` nil closes
    /// every window (the settling phase).
    private func faults(after round: Int?, ledger: inout SimLedger) async throws {
        if let round, rng.below(30) == 0 {
            let fault = [Fault.unauthorized, .overQuota, .diskFull][rng.below(3)]
            let w = (fault: fault, device: rng.below(devices.count), until: round + 2 + rng.below(25))
            if !windows.contains(where: { $0.fault == w.fault && $0.device == w.device }) {
                windows.append(w)
                trace.append("\(clock.time) fault \(fault) on \(devices[w.device].name) until round \(w.until)")
            }
        }
        let (ending, open) = (windows.filter { round == nil || $0.until <= round! }, windows.filter { round != nil && $0.until > round! })
        windows = open
        for w in ending {
            trace.append("\(clock.time) fault \(w.fault) on \(devices[w.device].name) ends")
            let d = devices[w.device]
            switch w.fault {
            case .unauthorized:
                link(d).unauthorized = false
                // Changes stay queued until the device is mounted again with a valid token.
                if try await d.restart(crash: false) { ledger.crashed(device: d.index) }
            case .overQuota: link(d).overQuota = false
            case .diskFull: d.store.simulateFullDisk(false)
            }
        }
        for w in windows {
            let d = devices[w.device]
            switch w.fault {
            case .unauthorized: link(d).unauthorized = true
            case .overQuota: link(d).overQuota = true
            case .diskFull: d.store.simulateFullDisk(true)
            }
        }
    }

    private func link(_ d: SimDevice) -> SimLink {
        guard case .link(let l, _) = d.network else { preconditionFailure("a simulated device without a link") }
        return l
    }

    /// Lets the engines run until no device has an upload queued or on its way (parked ones
    /// aside); nil, or the devices still busy.
    private func drained(within limit: Duration) async -> String? {
        let deadline = clock.time + limit
        var busy = ""
        while clock.time < deadline {
            busy = devices.filter { $0.status("upload-queue") != "0" }.map { "\($0.name): \($0.status("upload-queue") ?? "?") queued" }.joined(separator: ", ")
            if busy.isEmpty { return nil }
            await clock.sleep(for: .milliseconds(100))
        }
        return busy
    }

    /// The `.nimbusignore` files go, on every device that has one, until none is left for two
    /// looks in a row (an edit elsewhere brings a deleted one back): what they kept on a device
    /// goes up, and the devices must then agree like any.
    private func removeRules(ledger: inout SimLedger) async {
        var quiet = 0
        for _ in 0..<60 where quiet < 2 {
            await clock.sleep(for: .seconds(2))
            var removed = false
            for d in devices {
                for e in d.entries() where e.rec.kind == .file && ItemName.same(e.rec.name, IgnoreMatch.fileName) {
                    do {
                        try SimChecks.remove(e, on: d, ledger: &ledger)
                        removed = true
                        trace.append("\(clock.time) \(d.name) rm \(e.path): the rules go")
                    } catch {
                        trace.append("\(clock.time) \(d.name) rm \(e.path): \(error)")
                    }
                }
            }
            quiet = removed ? 0 : quiet + 1
        }
    }

    /// Lets the engines run (simulated time) until the devices agree; nil, or the last difference.
    func settle(within limit: Duration) async -> String? {
        let deadline = clock.time + limit
        var check = SimChecks.Settling()
        while clock.time < deadline {
            if let w = Self.watch { for d in devices { log(d.name, "watch: " + d.describe(w)) } }
            if await check.settled(devices, serverCursor: server.t.cursor) { return nil }
            await clock.sleep(for: .milliseconds(100))
        }
        return check.why
    }
}
