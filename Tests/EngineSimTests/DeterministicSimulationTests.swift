import Foundation
import NimbusTesting
import Testing

/// The deterministic simulation of the shipped engine (SimWorld): seeded plans of creates,
/// writes, renames, moves, deletes, folder changes, pauses, network cuts, lost answers, clean
/// restarts and crashes on three devices; then every device is resumed and, once they settle,
/// the checks: all trees are equal, and each device's last write to an item is live unless a
/// delete based on a version holding it took it (`SimChecks.lostContents`).
///
/// `NIMBUS_SIM_SEEDS=7` (or `1-200`, `3,9`) runs those seeds; otherwise the run takes seeds
/// from 1 on for `NIMBUS_SIM_SECONDS` (default 180) of real time, and at least
/// `NIMBUS_SIM_MIN_SEEDS` of them, whichever ends later (by default 1,000 when
/// `NIMBUS_SIM_SECONDS` is not set; none for the content-apart run). `NIMBUS_SIM_ROUNDS` sets the
/// steps per seed (default 200), `NIMBUS_SIM_MAX_FAILURES` how many failing seeds end the run
/// (default 3). `scripts/mutate` breaks one rule at a time and reports the first seed that
/// catches it.
@Suite(.serialized) struct DeterministicSimulationTests {
    static var rounds: Int { Int(ProcessInfo.processInfo.environment["NIMBUS_SIM_ROUNDS"] ?? "") ?? 200 }

    static var explicitSeeds: [UInt64]? {
        guard let env = ProcessInfo.processInfo.environment["NIMBUS_SIM_SEEDS"] else { return nil }
        return env.split(separator: ",").flatMap { part -> [UInt64] in
            let ends = part.split(separator: "-").compactMap { UInt64($0.trimmingCharacters(in: .whitespaces)) }
            if ends.count == 2, ends[0] <= ends[1] { return Array(ends[0]...ends[1]) }
            return ends.count == 1 ? ends : []
        }
    }

    @Test func seedsConvergeAndKeepEveryLastWrite() async throws {
        let env = ProcessInfo.processInfo.environment
        let seconds = Double(env["NIMBUS_SIM_SECONDS"] ?? "")
        await Self.runSeeds(budget: seconds ?? 180, atLeast: UInt64(env["NIMBUS_SIM_MIN_SEEDS"] ?? "") ?? (seconds == nil ? 1_000 : 0),
                            apart: false)
    }

    /// The same with device a sending every file's content apart from its upload queue, as big
    /// files go (`NIMBUS_SIM_APART_SECONDS`, default 30; replay with `NIMBUS_SIM_APART=1`).
    @Test func seedsWithContentApartConvergeAndKeepEveryLastWrite() async throws {
        let env = ProcessInfo.processInfo.environment
        if Self.explicitSeeds != nil, env["NIMBUS_SIM_APART"] == nil { return }
        await Self.runSeeds(budget: Double(env["NIMBUS_SIM_APART_SECONDS"] ?? "") ?? 30, atLeast: 0, apart: true)
    }

    /// With devices restoring and purging Recently Deleted entries among the other steps
    /// (`NIMBUS_SIM_TRASH_SECONDS`, default 30; replay with `NIMBUS_SIM_TRASH=1`): restores race
    /// edits, deletes, other restores, purges, cuts and crashes; every content must stay on the
    /// server as a current, conflict, earlier or Recently Deleted version unless a device purged it.
    @Test func seedsWithRestoresAndPurgesConvergeAndKeepEveryLastWrite() async throws {
        let env = ProcessInfo.processInfo.environment
        if Self.explicitSeeds != nil, env["NIMBUS_SIM_TRASH"] == nil { return }
        await Self.runSeeds(budget: Double(env["NIMBUS_SIM_TRASH_SECONDS"] ?? "") ?? 30, atLeast: 0, apart: false, trash: true)
    }

    /// With FIFOs, local-only items, made and removed under the names files take
    /// (`NIMBUS_SIM_LOCAL_SECONDS`, default 20; replay with `NIMBUS_SIM_LOCAL=1`): a file arriving
    /// from elsewhere at a FIFO's name takes the name beside it on every device
    /// (`ContainerFS.nameBeside`), and no FIFO ever reaches another device.
    @Test func seedsWithLocalOnlyItemsConvergeAndKeepEveryLastWrite() async throws {
        let env = ProcessInfo.processInfo.environment
        if Self.explicitSeeds != nil, env["NIMBUS_SIM_LOCAL"] == nil { return }
        await Self.runSeeds(budget: Double(env["NIMBUS_SIM_LOCAL_SECONDS"] ?? "") ?? 20, atLeast: 0, apart: false, localOnly: true)
    }

    /// With `.nimbusignore` files written and removed in every folder (`NIMBUS_SIM_IGNORE_SECONDS`,
    /// default 20; replay with `NIMBUS_SIM_IGNORE=1`): what they match stays on its device (a pull
    /// never replaces its changes), and once the rules go at the end everything goes up and the
    /// devices agree, with every last write kept.
    @Test func seedsWithIgnoreRulesConvergeAndKeepEveryLastWrite() async throws {
        let env = ProcessInfo.processInfo.environment
        if Self.explicitSeeds != nil, env["NIMBUS_SIM_IGNORE"] == nil { return }
        await Self.runSeeds(budget: Double(env["NIMBUS_SIM_IGNORE_SECONDS"] ?? "") ?? 20, atLeast: 0, apart: false, ignore: true)
    }

    /// With hard links (`NIMBUS_SIM_LINKS_SECONDS`, default 20; replay with `NIMBUS_SIM_LINKS=1`):
    /// files given more names here, each an item of its own elsewhere, where devices write,
    /// rename and delete them; a name changed elsewhere leaves its inode here, and the devices
    /// agree with every last write kept.
    @Test func seedsWithHardLinksConvergeAndKeepEveryLastWrite() async throws {
        let env = ProcessInfo.processInfo.environment
        if Self.explicitSeeds != nil, env["NIMBUS_SIM_LINKS"] == nil { return }
        await Self.runSeeds(budget: Double(env["NIMBUS_SIM_LINKS_SECONDS"] ?? "") ?? 20, atLeast: 0, apart: false, links: true)
    }

    /// Seeds of the run with hard links that found a loss or a stall: 1, a commit's answer that
    /// put a linked name elsewhere (a name taken on the server) was ignored; 22, a rename onto
    /// another name of the same file with RENAME_NOREPLACE went through; 69 and 103, linking (or
    /// reading) a placeholder right after an editor's save took over its identity downloaded the
    /// old bytes over the new ones; 74 and 176, a name whose link to the content file a crash
    /// lost could never be read or uploaded again; 51, the notice of a rename of a name removed
    /// since marked the next name's place as heard of, so the server's place for it was never shown.
    @Test(arguments: [UInt64(1), 22, 51, 69, 74, 103, 176])
    func linkSeedsThatFoundBugs(_ seed: UInt64) async throws {
        let r = await SimWorld.run(Self.plan(seed, apart: false, links: true))
        #expect(r.failure == nil, "simulation seed \(seed) (hard links): \(r.failure ?? "")")
    }

    static func plan(_ seed: UInt64, apart: Bool, trash: Bool = false, localOnly: Bool = false, ignore: Bool = false, links: Bool = false) -> SimPlan {
        // Purges too, unless NIMBUS_SIM_PURGES=0.
        var p = SimPlan(seed: seed, rounds: rounds, trash: trash, purges: trash && ProcessInfo.processInfo.environment["NIMBUS_SIM_PURGES"] != "0",
                        localOnly: localOnly, ignore: ignore, links: links)
        p.contentApart = apart
        return p
    }

    static func runSeeds(budget: Double, atLeast minimum: UInt64, apart: Bool, trash: Bool = false, localOnly: Bool = false,
                         ignore: Bool = false, links: Bool = false) async {
        let env = ProcessInfo.processInfo.environment
        let maxFailures = Int(env["NIMBUS_SIM_MAX_FAILURES"] ?? "") ?? 3
        let started = ContinuousClock.now
        let explicit = Self.explicitSeeds
        // One world per core at a time: each runs on a thread of its own.
        let lanes = max(1, ProcessInfo.processInfo.activeProcessorCount)
        var next: UInt64 = 1
        var index = 0
        var ran = 0
        var failures = 0
        func nextSeed() -> UInt64? {
            if let explicit {
                guard index < explicit.count, failures < maxFailures else { return nil }
                index += 1
                return explicit[index - 1]
            }
            guard next <= minimum || ContinuousClock.now - started < .seconds(budget), failures < maxFailures else { return nil }
            next += 1
            return next - 1
        }
        await withTaskGroup(of: (UInt64, SimWorld.Report).self) { group in
            for _ in 0..<lanes {
                guard let s = nextSeed() else { break }
                group.addTask { (s, await SimWorld.run(plan(s, apart: apart, trash: trash, localOnly: localOnly, ignore: ignore, links: links))) }
            }
            while let (seed, report) = await group.next() {
                ran += 1
                if let failure = report.failure {
                    failures += 1
                    Issue.record("simulation seed \(seed) (replay: SWIFT_DETERMINISTIC_HASHING=1 NIMBUS_SIM_SEEDS=\(seed)\(apart ? " NIMBUS_SIM_APART=1" : "")\(trash ? " NIMBUS_SIM_TRASH=1" : "")\(localOnly ? " NIMBUS_SIM_LOCAL=1" : "")\(ignore ? " NIMBUS_SIM_IGNORE=1" : "")\(links ? " NIMBUS_SIM_LINKS=1" : "") NIMBUS_SIM_ROUNDS=\(Self.rounds) swift test --filter DeterministicSimulationTests): \(failure)")
                } else if let explicit, explicit.count <= 20 {
                    print("simulation seed \(seed): \(report.figures)")
                }
                if let s = nextSeed() {
                    group.addTask { (s, await SimWorld.run(plan(s, apart: apart, trash: trash, localOnly: localOnly, ignore: ignore, links: links))) }
                }
            }
        }
        let took = ContinuousClock.now - started
        let secs = Double(took.components.seconds) + Double(took.components.attoseconds) / 1e18
        print("simulation\(apart ? " (content apart)" : "")\(trash ? " (restores and purges)" : "")\(localOnly ? " (local-only items)" : "")\(ignore ? " (.nimbusignore)" : "")\(links ? " (hard links)" : ""): \(ran) seeds × \(Self.rounds) steps in \(EngineSim.seconds(took)) (\(String(format: "%.1f", Double(ran) / max(secs, 0.001))) seeds/s, \(lanes) at once), \(failures) failed")
    }

    /// The same seed twice gives the same trace: every decision, every journal entry, in order.
    @Test(arguments: [UInt64(3), 11, 29])
    func aSeedReplaysByteForByte(_ seed: UInt64) async throws {
        let a = await SimWorld.run(SimPlan(seed: seed, rounds: 120))
        let b = await SimWorld.run(SimPlan(seed: seed, rounds: 120))
        #expect(a.failure == nil, "\(a.failure ?? "")")
        #expect(a.traceHash == b.traceHash, "seed \(seed) did not replay")
    }

    /// Seeds that found a loss or a stall, kept as regression tests of the rule that fixed it
    /// (docs/sync.md "Mutations"). Replayed with the test run's `SWIFT_DETERMINISTIC_HASHING=1`
    /// (scripts/test); without it Set orders differ and a seed may take another path. 48 with
    /// content apart: a file opened with `O_TRUNC` and kept open while a remote state of it was
    /// shown, its push paced, then a clean stop: its edit had no queue entry on disk. 16, 29: a
    /// change whose queue entry is made when the engine hears of it (not behind the change) is
    /// lost to a commit in between. 503, 634: a device whose full disk lost its own rename sent
    /// the item again with no base and moved it back everywhere; 396: the same after the server
    /// had given its create the name beside a taken one (`CommitEngine.ancestor`).
    @Test(arguments: [(UInt64(82), false), (462, false), (737, false), (791, false), (1107, false), (2116, false), (82, true), (48, true), (16, false),
                      (29, false), (396, false), (503, false), (634, false)])
    func seedsThatFoundBugs(_ seed: UInt64, _ apart: Bool) async throws {
        let r = await SimWorld.run(Self.plan(seed, apart: apart))
        #expect(r.failure == nil, "simulation seed \(seed)\(apart ? " (content apart)" : ""): \(r.failure ?? "")")
    }

    /// Seeds of the run with FIFOs and attributes (`localOnly`) that found a loss: 5, 9, attributes
    /// set elsewhere merged into a commit's answer and never shown (`SettleFacts.sameXattrs`);
    /// 207, a commit with no `extra` that dropped the attributes others had set (`ExtraMerge`);
    /// 394, an edit that brought a deleted item back without them; 346, 736, the move beside a
    /// FIFO undoing a rename made elsewhere (`CommitRequest.placeIfUnmoved`); 997, a rename's
    /// place mark delivered before its notice (`ContainerFS.notifyMoves`); 1192, an attribute
    /// set, its commit's answer lost, then removed: the next push found the state its base's and
    /// sent nothing (`UploadState.unanswered`), and the server's merge against the old base
    /// kept it (`CommitEngine` decides on the device's own last state); 1356, the same with
    /// another device's edit committed between the two.
    @Test(arguments: [UInt64(5), 9, 207, 346, 394, 736, 997, 1192, 1356])
    func localSeedsThatFoundBugs(_ seed: UInt64) async throws {
        let r = await SimWorld.run(Self.plan(seed, apart: false, localOnly: true))
        #expect(r.failure == nil, "simulation seed \(seed) (FIFOs and attributes): \(r.failure ?? "")")
    }

    /// Seeds of the default run in which an item was put beside this device's own item, still at
    /// its name on the server (`CommitPlan.nameFirst`, `SimServer.ownNameTaken`): 151, a file
    /// created at the name another had just left; 75, a new file whose content notice came
    /// before the notice of the save that freed its name; 77, the leaving item's delete backing
    /// off after a network failure; 68, 219, a folder made again after `rm -r`, sent (or sent
    /// ahead of a file inside it) while the old folder's delete waited; 604, a move whose answer
    /// was lost (the server's state held for the push says where the item is). And seeds that
    /// stalled early versions of the rule: 459, two items swapping names (a cycle: one goes);
    /// 302, an item another device put at the name (a state skipped here), waited for as if its
    /// notice were on its way; 489, a name two items were at as the device last heard (an older
    /// state of one, a newer of the other), counted free when the first left
    /// (`ItemTable.holder(of:)`); 704, the item at the name pushed first had moved into a folder
    /// the server did not have yet, sent after it in the same request (`CommitPlan.pushOrder`);
    /// 1221, a file created and deleted here at once, its create's answer lost: a new file at
    /// its name went first (`UploadState.sentPlace`).
    @Test(arguments: [UInt64(68), 75, 77, 151, 219, 604, 459, 302, 489, 704, 1221])
    func nameSeedsThatFoundBugs(_ seed: UInt64) async throws {
        let r = await SimWorld.run(Self.plan(seed, apart: false))
        #expect(r.failure == nil, "simulation seed \(seed): \(r.failure ?? "")")
    }

    /// Seeds of the run with `.nimbusignore` files that found a loss or a stall: 239, 544, 615,
    /// a rules file the server never had removed here left what it had parked parked for good
    /// (`MountedTree.rulesGeneration`); 33, an item pushed first to free a name whose own name
    /// was still another leaving item's (`CommitPlan.nameFirst` follows the chain); 74, a create
    /// sent again after its answer was lost, answered with another device's edit while its name
    /// here was taken: the answer was kept as its base over the old bytes, and the file kept the
    /// old size over the new content (`Base.keptWhenNotShown`).
    @Test(arguments: [UInt64(239), 544, 615, 33, 74])
    func ignoreSeedsThatFoundBugs(_ seed: UInt64) async throws {
        let r = await SimWorld.run(Self.plan(seed, apart: false, ignore: true))
        #expect(r.failure == nil, "simulation seed \(seed) (.nimbusignore): \(r.failure ?? "")")
    }

    /// Seeds of the run with purges (NIMBUS_SIM_PURGES=1) that found a stuck queue or a device
    /// that kept what the others had not: 5 and 8, a delete of an item purged meanwhile retried
    /// for ever (`DeleteAnswer.gone`); 47, a change inside a folder purged meanwhile refused for
    /// ever (the server's `CommitEngine.place`); 59, 61, 67, a folder kept here over a delete,
    /// then purged elsewhere, kept for good (`PurgedItem.deleted`); 245, a relist that found an
    /// item purged deleted it here although this device's commit had brought it back meanwhile
    /// (`PurgedItem.deleted`'s `asked`); 940, 1154, 1460, a file a folder delete took from the
    /// tree after the server had moved it out, shown again as downloaded and read as zeros
    /// (`ApplyFacts.absent`); 1716, a relist that lost its ask about a purged folder to a 503
    /// after a crash, keeping the folder for good (`MissingItemAsk`); 3117, a save renamed over
    /// an uploaded file evicted before the engine heard of it, uploaded as zeros
    /// (`ContainerFS.evictContent`, `noticesPending`).
    @Test(arguments: [UInt64(5), 8, 47, 59, 61, 67, 245, 940, 1154, 1460, 1716, 3117])
    func purgeSeedsThatFoundBugs(_ seed: UInt64) async throws {
        let r = await SimWorld.run(SimPlan(seed: seed, rounds: Self.rounds, trash: true, purges: true))
        #expect(r.failure == nil, "simulation seed \(seed) (restores and purges): \(r.failure ?? "")")
    }
}
