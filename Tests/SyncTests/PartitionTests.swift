import Foundation
import Glibc
import NimbusTesting
import Testing

/// Real networks (docs/sync.md "Offline"): the server in a network namespace of its own, device A
/// here and device B in another namespace, each on its own link shaped to 100 Mbit/s. B's link is
/// cut (packets vanish: nothing answers, nothing refuses): B says it is offline, no program call
/// on B waits past its bound, work goes on locally; mended, both devices converge.
@Suite(.serialized, .enabled(if: SyncEnv.usable && NetLab.problem == nil, "needs FUSE and network namespaces (root)"))
struct PartitionTests {
    /// The server in its namespace, A here and B in a namespace of its own, both mounted; B's
    /// link with the given delay (each way) and loss. Everything is removed after `body`.
    func withTwoDevices(delayMs: Int = 0, lossPercent: Double = 0, readTimeout: Int = 3,
                        _ body: (_ lab: NetLab, _ linkB: NetLab.Link, _ a: String, _ b: String) async throws -> Void) async throws {
        let lab = try NetLab()
        defer { lab.close() }
        let base = try sh("mktemp -d /tmp/nimbus-netns-XXXXXX").trimmingCharacters(in: .whitespacesAndNewlines)
        let bin = q(NimbusBinary.path)
        let nsB = try lab.namespace("nimbus-\(lab.tag)-b")
        let linkA = try lab.connect(), linkB = try lab.connect(deviceNamespace: nsB, delayMs: delayMs, lossPercent: lossPercent)
        try lab.shape(linkA, mbit: 100)
        try lab.shape(linkB, mbit: 100)
        let port = 7070
        let server = try Background("exec \(NetLab.prefix(lab.serverNamespace))\(bin) serve --data \(q(base + "/server")) --listen 0.0.0.0:\(port) --log-level warning")
        let (a, b) = (base + "/a", base + "/b")
        defer {
            for mp in [a, b] { _ = shStatus("\(bin) unmount \(q(mp)) 2>/dev/null || fusermount3 -uz \(q(mp)) 2>/dev/null") }
            server.stop()
            if ProcessInfo.processInfo.environment["NIMBUS_KEEP_TEST_DIRS"] == nil { _ = shStatus("rm -rf \(q(base))") }
        }
        try await eventually("the server in its namespace", seconds: 30, "\(NetLab.prefix(lab.serverNamespace))curl -fsS --max-time 2 http://127.0.0.1:\(port)/healthz")
        for (device, mp, link) in [("a", a, linkA), ("b", b, linkB)] {
            let token = try sh("\(bin) admin add-device --data \(q(base + "/server")) --account alice --device \(device)")
            try token.write(toFile: base + "/\(device).token", atomically: true, encoding: .utf8)
            // Plain http across a network needs --insecure (a lab link; real ones use https).
            try sh("mkdir -p \(q(mp)) && \(NetLab.prefix(link.namespace))\(bin) mount \(q(mp)) --state \(q(mp + "-state")) --server http://\(link.serverAddress):\(port) --container docs --token-file \(q(base + "/\(device).token")) --insecure --read-timeout \(readTimeout)")
        }
        try await body(lab, linkB, a, b)
    }

    @Test func aPartitionedDeviceStaysUsableWithinItsBoundsAndConvergesAfter() async throws {
        try await withTwoDevices { lab, linkB, a, b in
            try sh("printf before > \(q(a))/f.txt && head -c 3000000 /dev/urandom > \(q(a))/big.bin && mkdir \(q(a))/d")
            try await eventually("A's files listed on B", seconds: 30, "test \"$(cat \(q(b))/f.txt)\" = before && test -d \(q(b))/d && test \"$(stat -c %s \(q(b))/big.bin)\" = 3000000")

            // Cut B off. Everything B does locally answers at once; reads of what is not here fail
            // with EIO within the read timeout; B says it is offline.
            try lab.partition(linkB, true)
            let t0 = ContinuousClock.now
            try sh("printf 'offline edit' > \(q(b))/f.txt && printf new > \(q(b))/offline.txt && mkdir \(q(b))/d/sub && mv \(q(b))/offline.txt \(q(b))/d/sub/")
            try sh("ls -la \(q(b)) \(q(b))/d/sub > /dev/null && stat \(q(b))/big.bin > /dev/null && cat \(q(b))/.nimbus/status > /dev/null")
            #expect(ContinuousClock.now - t0 < .seconds(2), "local work on a partitioned device answers at once")
            let r0 = ContinuousClock.now
            let read = shStatus("cat \(q(b))/big.bin > /dev/null")
            let took = ContinuousClock.now - r0
            #expect(read.0 != 0 && read.1.contains("Input/output error"), "a placeholder's bytes are not here: \(read)")
            #expect(took < .seconds(8), "the read failed within its bound (3 s read timeout): \(took)")
            try sh("printf 'a while b is away' > \(q(a))/from-a.txt")
            try await eventually("B says it is offline", seconds: 45, "grep -q '^connection: offline' \(q(b))/.nimbus/status")
            let offline = ContinuousClock.now - t0
            #expect(!FileManager.default.fileExists(atPath: a + "/d/sub/offline.txt"), "nothing crossed the partition")

            // Mended: both ways, everything arrives.
            try lab.partition(linkB, false)
            let mended = ContinuousClock.now
            try await eventually("B's offline work on A", seconds: 60, "test \"$(cat \(q(a))/f.txt)\" = 'offline edit' && test \"$(cat \(q(a))/d/sub/offline.txt)\" = new")
            try await eventually("A's work on B", seconds: 60, "test \"$(cat \(q(b))/from-a.txt)\" = 'a while b is away'")
            try await eventually("B online again", seconds: 30, "grep -q '^connection: online' \(q(b))/.nimbus/status")
            print("partition figures: EIO for a placeholder after \(took), offline shown after \(offline), converged \(ContinuousClock.now - mended) after the link came back")
            try sh("cmp \(q(a))/big.bin \(q(b))/big.bin")
            let treeA = try sh("cd \(q(a)) && find . -path ./.nimbus -prune -o -print | sort")
            let treeB = try sh("cd \(q(b)) && find . -path ./.nimbus -prune -o -print | sort")
            #expect(treeA == treeB, "A:\n\(treeA)\nB:\n\(treeB)")
        }
    }

    /// B 50 ms (round trip) away with 1 % of packets lost each way (scripts/netem-relay.py):
    /// edits go both ways, a placeholder hydrates byte for byte, and the figures are printed.
    @Test func overA50msLinkWithOnePercentLossEverythingArrives() async throws {
        try await withTwoDevices(delayMs: 25, lossPercent: 1, readTimeout: 30) { _, _, a, b in
            var lat: [Duration] = []
            for i in 0..<10 {
                let t0 = ContinuousClock.now
                // A new file each time (one file rewritten this often is paced: docs/sync.md).
                try sh("printf 'file \(i)' > \(q(a))/p\(i).txt")
                try await eventually("file \(i) on B", seconds: 30, "test \"$(cat \(q(b))/p\(i).txt)\" = 'file \(i)'")
                lat.append(ContinuousClock.now - t0)
            }
            try sh("head -c 8000000 /dev/urandom > \(q(a))/big.bin && printf 'from b' > \(q(b))/from-b.txt")
            try await eventually("big.bin listed on B", seconds: 60, "test \"$(stat -c %s \(q(b))/big.bin)\" = 8000000")
            try await eventually("B's file on A", seconds: 30, "test \"$(cat \(q(a))/from-b.txt)\" = 'from b'")
            let r0 = ContinuousClock.now
            try sh("cmp \(q(a))/big.bin \(q(b))/big.bin")
            let hydrate = ContinuousClock.now - r0
            lat.sort()
            print("netem figures (50 ms RTT, 1 % loss, 100 Mbit/s): propagation median \(lat[lat.count / 2]), max \(lat.last!); 8 MB placeholder read on B in \(hydrate)")
        }
    }
}
