import Foundation
import Glibc
import NimbusTesting
import Testing

/// What the mount says is what is so (docs/mount.md, docs/sync.md "Status and control"):
/// control files refuse writes with EPERM; a download asked for while the server is gone fails
/// with EIO at once instead of answering 0 and failing later; a link out of the mount is not
/// followed by the CLI.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct StatusTruthTests {
    @Test func controlFilesRefuseWritesAndADownloadOfflineSaysEIO() async throws {
        try await SyncWorld.run("truth") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("head -c 300000 /dev/urandom > \(q(a))/big.bin")
            try await eventually("big.bin on B", "test \"$(stat -c %s \(q(b))/big.bin)\" = 300000")
            for file in ["status", "events", "conflicts", "claims", "requests"] {
                let (s, out) = shStatus("echo x > \(q(b))/.nimbus/\(file)")
                #expect(s != 0 && out.contains("Operation not permitted"), "\(file): \(s) \(out)")
            }
            w.stopServer()
            try await eventually("B knows the server is gone", seconds: 40, "grep -q '^connection: offline' \(q(b))/.nimbus/status")
            let (s, out) = shStatus("setfattr -n user.nimbus.download -v 1 \(q(b))/big.bin")
            #expect(s != 0 && out.contains("Input/output error"), "\(s) \(out)")
            let (cs, cout) = shStatus("\(q(NimbusBinary.path)) download \(q(b))/big.bin")
            #expect(cs != 0 && cout.contains("server cannot be reached"), "\(cs) \(cout)")
        }
    }

    /// A server that takes connections but never answers (SIGSTOP): the long-poll gives up 10 s
    /// after the server should have answered, so the status says offline within its wait + 10 s
    /// (25 + 10 here), and local work goes on meanwhile.
    @Test func aStoppedServerIsShownOfflineWithinTheLongPollAndTenSeconds() async throws {
        try await SyncWorld.run("sigstop") { w in
            let a = try await w.mount("a")
            try sh("printf x > \(q(a))/local.txt")
            try await eventually("online", "grep -q '^connection: online' \(q(a))/.nimbus/status")
            kill(w.server.pid, SIGSTOP)
            defer { kill(w.server.pid, SIGCONT) }
            try await eventually("offline while the server is stopped", seconds: 45, "grep -q '^connection: offline' \(q(a))/.nimbus/status")
            #expect(try sh("cat \(q(a))/local.txt") == "x", "local files work")
            kill(w.server.pid, SIGCONT)
            try await eventually("online again", seconds: 40, "grep -q '^connection: online' \(q(a))/.nimbus/status")
        }
    }

    /// A sparse file beyond what a version may hold (any local user can make one without using
    /// disk) is refused before it is read: its error says why and what to do, and the files
    /// written after it sync at once.
    @Test func aFileTooLargeToSyncIsRefusedAtOnceAndHoldsNothingBack() async throws {
        try await SyncWorld.run("toolarge") { w in
            let a = try await w.mount("a")
            let b = try await w.mount("b")
            let t0 = ContinuousClock.now
            try sh("truncate -s 250G \(q(a))/huge.bin")
            try await eventually("refused", seconds: 20, "getfattr --only-values -n user.nimbus.error \(q(a))/huge.bin | grep -q 'too large to sync'")
            #expect(ContinuousClock.now - t0 < .seconds(15), "refused without chunking 250 GiB")
            let error = try sh("getfattr --only-values -n user.nimbus.error \(q(a))/huge.bin 2>/dev/null")
            #expect(error.contains("50000 chunks") && error.contains("stays on this device"), "\(error)")
            let status = try sh("getfattr --only-values -n user.nimbus.status \(q(a))/huge.bin 2>/dev/null")
            #expect(status == "error", "\(status)")
            try sh("printf after > \(q(a))/after.txt")
            try await eventually("a later file reaches the other device", seconds: 20, "test \"$(cat \(q(b))/after.txt 2>/dev/null)\" = after")
        }
    }

    /// A big file's content is chunked and uploaded apart from the upload queue: a small file
    /// saved right after it reaches the other device before the big one is up, and the big one
    /// arrives whole. (With the content in the queue, the small file waits for all of it.)
    @Test func aBigFileNeverHoldsBackTheOthers() async throws {
        try await SyncWorld.run("big-apart") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            let source = w.base + "/big.src"
            try sh("head -c 402653184 /dev/urandom > \(q(source))")
            try sh("cp \(q(source)) \(q(a))/big.bin && printf small > \(q(a))/small.txt")
            // Which comes first: the small file on B, or the big one uploaded from A.
            var first = ""
            for _ in 0..<3_000 where first.isEmpty {
                // The big one is looked at first: the small one counts only while it is not up.
                if shStatus("getfattr --only-values -n user.nimbus.status \(q(a))/big.bin 2>/dev/null | grep -qx current").0 == 0 { first = "big" }
                else if shStatus("test \"$(cat \(q(b))/small.txt 2>/dev/null)\" = small").0 == 0 { first = "small" }
                else { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(first == "small", "the small file went first, not after the big one: \(first)")
            try await eventually("big.bin on B byte for byte", seconds: 120, "cmp \(q(source)) \(q(b))/big.bin")
            // The server's order says the same whatever the timing: small.txt's commit came
            // before big.bin's (not behind its upload, nor in the same request after it).
            let version = { (name: String) in
                Int(((try? sh("getfattr --only-values -n user.nimbus.version \(q(b))/\(name) 2>/dev/null")) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
            }
            #expect(version("small.txt") > 0 && version("small.txt") < version("big.bin"), "versions: small \(version("small.txt")), big \(version("big.bin"))")
        }
    }

    @Test func cliCommandsDoNotFollowALinkOutOfTheMount() async throws {
        try await SyncWorld.run("links") { w in
            let a = try await w.mount("a")
            let outside = w.base + "/outside"
            try sh("mkdir -p \(q(outside)) && printf secret > \(q(outside))/f && ln -s \(q(outside)) \(q(a))/out && ln -s \(q(outside))/f \(q(a))/outfile")
            for cmd in ["pin", "unpin", "evict", "download"] {
                for target in ["out", "outfile", "out/f"] {
                    let (s, out) = shStatus("\(q(NimbusBinary.path)) \(cmd) \(q(a + "/" + target))")
                    #expect(s != 0 && out.contains("leads out of the Nimbus mount"), "\(cmd) \(target): \(s) \(out)")
                }
            }
            let xattrs = try sh("getfattr -d -m - \(q(outside))/f \(q(outside)) 2>/dev/null; true")
            #expect(!xattrs.contains("nimbus"), "nothing set outside: \(xattrs)")
            // A folder link in one mount to another mount (made by another user, say): every
            // command on a path through it is refused before it acts on the other mount.
            let b = try await w.mount("b")
            try sh("printf other > \(q(b))/c.txt && mkdir -p \(q(a))/pub && ln -s \(q(b)) \(q(a))/pub/dl2")
            try await eventually("b's file uploaded", "getfattr --only-values -n user.nimbus.status \(q(b))/c.txt | grep -q current")
            let through = a + "/pub/dl2/c.txt"
            for args in [["pin", through], ["unpin", through], ["evict", through], ["download", through], ["status", through],
                         ["versions", through], ["resolve", through, "--keep", "current"], ["restore", through, "--version", "1"]] {
                let (s, out) = shStatus(([NimbusBinary.path] + args).map(q).joined(separator: " "))
                #expect(s != 0 && out.contains("leads out of the Nimbus mount"), "\(args): \(s) \(out)")
            }
            let onB = try sh("getfattr --only-values -n user.nimbus.pinned \(q(b))/c.txt 2>/dev/null; true")
            #expect(onB != "1", "nothing pinned on the other mount")
            // A link to a place inside the mount is followed as usual.
            try sh("printf in > \(q(a))/inside.txt && ln -s inside.txt \(q(a))/in")
            try await eventually("uploaded", "getfattr --only-values -n user.nimbus.status \(q(a))/inside.txt | grep -q current")
            let (ps, pout) = shStatus("\(q(NimbusBinary.path)) pin \(q(a))/in")
            #expect(ps == 0, "\(pout)")
        }
    }

    /// `nimbus device add|list|revoke` run inside a mount act as that mount's device, with no
    /// --state or --server typed again (a machine set up with `nimbus mount --server …` can pair a
    /// laptop); `--mount PATH` does the same from anywhere. A folder that only looks like a mount
    /// (a `.nimbus/status` of someone's making) is refused before any token is read or sent.
    @Test func deviceCommandsInsideAMountUseItsDevice() async throws {
        try await SyncWorld.run("device-in-mount") { w in
            let a = try await w.mount("a")
            try sh("mkdir -p \(q(a))/sub")
            let nimbus = q(NimbusBinary.path)
            let added = try sh("cd \(q(a))/sub && \(nimbus) device add laptop 2>&1")
            #expect(added.contains("laptop"), "a pairing code from inside the mount: \(added)")
            let listed = try sh("\(nimbus) device list --mount \(q(a)) 2>&1")
            #expect(listed.contains("\"a\" added"), "the account's devices, this mount's among them: \(listed)")
            // A look-alike: a plain folder with a .nimbus/status naming a state directory.
            let fake = w.base + "/fake"
            try sh("mkdir -p \(q(fake))/.nimbus && printf 'state-dir: \(w.base)/a-state\\n' > \(q(fake))/.nimbus/status")
            let (s, out) = shStatus("cd \(q(fake)) && \(nimbus) device list")
            #expect(s != 0 && out.contains("is not a Nimbus mount"), "a look-alike is refused: \(s) \(out)")
            let (s2, out2) = shStatus("\(nimbus) device list --mount \(q(w.base))")
            #expect(s2 != 0 && out2.contains("not inside a Nimbus mount"), "\(s2) \(out2)")
        }
    }
}
