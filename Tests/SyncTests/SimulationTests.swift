import Foundation
import Glibc
import NimbusTesting
import Testing

/// Seeded random operations on three real mounts — creates, writes, renames, moves, deletes,
/// devices going offline and back, daemons killed with -9 and remounted — then: all devices
/// hold the same tree, and the last content each device wrote to each item is on the server as
/// a current, conflict or earlier version of that item
/// (scripts/sim.py; docs/sync.md "Simulation"). A failure prints the seed;
/// `NIMBUS_SIM_SEEDS=17 swift test --filter SimulationTests` replays it, `scripts/soak` runs many.
///
/// The default run takes seeds 1–3 (~20 s). Timing varies between runs (real mounts, real
/// threads), so a seed replays its operations, not its interleaving; every divergence or lost
/// content fails the test, with its replay line.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct SimulationTests {
    static var seeds: [Int] {
        if let env = ProcessInfo.processInfo.environment["NIMBUS_SIM_SEEDS"] {
            return env.split(separator: ",").compactMap { Int($0) }
        }
        return [1, 2, 3]
    }

    /// A divergence or a lost content.
    static func report(_ message: String) {
        Issue.record(Comment(rawValue: message))
    }
    static var rounds: Int { Int(ProcessInfo.processInfo.environment["NIMBUS_SIM_ROUNDS"] ?? "") ?? 40 }

    static var driver: String {
        var dir = URL(fileURLWithPath: #filePath)
        while dir.path != "/" {
            dir = dir.deletingLastPathComponent()
            if FileManager.default.fileExists(atPath: dir.path + "/scripts/sim.py") { return dir.path + "/scripts/sim.py" }
        }
        return "scripts/sim.py"
    }

    static func listing(_ mp: String) -> String {
        "cd \(q(mp)) && find . -mindepth 1 | LC_ALL=C sort | while read -r p; do if [ -f \"$p\" ]; then echo \"$p $(cat \"$p\")\"; else echo \"$p/\"; fi; done"
    }

    @Test(arguments: SimulationTests.seeds) func randomOperationsOnThreeDevicesConvergeAndLoseNothing(_ seed: Int) async throws {
        try await SyncWorld.run("sim-\(seed)") { w in
            let devices = ["a", "b", "c"]
            var mps: [String] = []
            for d in devices { mps.append(try await w.mount(d)) }
            try sh("mkdir \(q(mps[0]))/d1 \(q(mps[0]))/d2")
            for mp in mps.dropFirst() { try await eventually("folders on \(mp)", "test -d \(q(mp))/d1 && test -d \(q(mp))/d2") }
            let state = w.base + "/sim.json"
            // The test's own choices (which daemon to kill) from the seed (the stream it always had).
            var rng = SplitMix64(seed: UInt64(seed) &+ 0x9E37_79B9_7F4A_7C15)
            let mpArgs = mps.map(q).joined(separator: " ")
            for phase in 0..<3 {
                let out = try sh("python3 \(q(Self.driver)) \(q(state)) \(seed * 1000 + phase) \(Self.rounds) \(q(NimbusBinary.path)) \(mpArgs)")
                if !out.isEmpty { print("sim seed \(seed) phase \(phase):\n\(out)", terminator: "") }
                // A daemon killed with -9 and mounted again (its queue and pause survive).
                let victim = Int.random(in: 0..<devices.count, using: &rng)
                if ProcessInfo.processInfo.environment["NIMBUS_SIM_NO_CRASH"] == nil {
                    try w.crash(mps[victim])
                    try w.remount(devices[victim])
                }
            }
            for mp in mps { try sh("\(q(NimbusBinary.path)) resume \(q(mp)) >/dev/null") }
            try sh("python3 \(q(Self.driver)) \(q(state)) --finish")

            // Every device ends with the same tree.
            let same = "test \"$(\(Self.listing(mps[0])))\" = \"$(\(Self.listing(mps[1])))\" && test \"$(\(Self.listing(mps[0])))\" = \"$(\(Self.listing(mps[2])))\""
                + mps.map { " && grep -q '^upload-queue: 0' \(q($0))/.nimbus/status" }.joined()
            let deadline = Date().addingTimeInterval(90)
            var agreed = false
            while Date() < deadline {
                if shStatus(same).0 == 0 { agreed = true; break }
                try await Task.sleep(for: .milliseconds(100))
            }
            if !agreed {
                if let keep = ProcessInfo.processInfo.environment["NIMBUS_SIM_KEEP"].map({ "\($0)/\(seed)" }) {
                    try? sh("mkdir -p \(q(keep)) && cp \(q(state)) \(q(keep))/ && for d in a b c; do cp \(q(w.base))/$d/.nimbus/events \(q(keep))/$d.events; cp \(q(w.base))/$d-state/mount.log \(q(keep))/$d.log; cat \(q(w.base))/$d/.nimbus/status > \(q(keep))/$d.status; done")
                }
                let trees: [String] = mps.map { mp in "\(mp):\n" + ((try? sh(Self.listing(mp))) ?? "?") }
                Self.report("seed \(seed) (replay: NIMBUS_SIM_SEEDS=\(seed)): the devices did not agree within 90 s:\n\(trees.joined())")
                return
            }

            // Nothing a device wrote last before a sync point is lost.
            let obj = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: state))) as? [String: Any]
            let must = (obj?["must"] as? [[String]]) ?? []
            let token = try String(contentsOfFile: w.base + "/a.token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            var versionsOf: [String: [[String: Any]]] = [:]
            var lost: [String] = []
            for pair in must where pair.count == 2 {
                let (item, content) = (pair[0], pair[1])
                if versionsOf[item] == nil {
                    let json = try sh("curl -s --max-time 10 -H 'Authorization: Bearer \(token)' \(w.server.url)/v1/containers/docs/items/\(item)/versions")
                    versionsOf[item] = (try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any])?["versions"] as? [[String: Any]] ?? []
                }
                let hash = try sh("printf %s \(q(content)) | sha256sum | cut -d' ' -f1").trimmingCharacters(in: .whitespacesAndNewlines)
                let found = versionsOf[item]!.contains { v in
                    let chunks = (v["state"] as? [String: Any])?["chunks"] as? [[String: Any]] ?? []
                    return chunks.contains { ($0["hash"] as? String).map { $0.hasSuffix(hash) } == true }
                }
                if !found {
                    let vs = versionsOf[item]!.map { v in "v\(v["version"] ?? "?") \(v["role"] ?? "?") \(v["deviceName"] ?? "?") \((v["state"] as? [String: Any])?["name"] ?? "?") deleted=\((v["state"] as? [String: Any])?["deleted"] ?? "?")" }
                    lost.append("\(item): \(content.trimmingCharacters(in: .newlines)) — versions: \(vs)")
                }
            }
            if !lost.isEmpty, let keep = ProcessInfo.processInfo.environment["NIMBUS_SIM_KEEP"].map({ "\($0)/\(seed)" }) {
                // For a post-mortem: each device's events and log, and the driver's state.
                try? sh("mkdir -p \(q(keep)) && cp \(q(state)) \(q(keep))/ && for d in a b c; do cp \(q(w.base))/$d/.nimbus/events \(q(keep))/$d.events; cp \(q(w.base))/$d-state/mount.log \(q(keep))/$d.log; done")
            }
            if !lost.isEmpty { Self.report("seed \(seed) (replay: NIMBUS_SIM_SEEDS=\(seed)) lost \(lost.count) of \(must.count): \(lost)") }
            print("sim figures: seed \(seed): \(obj?["ops"] ?? 0) operations on 3 devices, \(must.count) contents checked, tree of \(try sh(Self.listing(mps[0])).split(separator: "\n").count) entries")
        }
    }
}
