import Foundation
import Glibc
import NimbusTesting
import Testing

/// `.nimbus/versions/` without holding anything it does not need (docs/sync.md "Conflicts and
/// versions"): a version is streamed from the server as it is read, and whatever waits on the
/// server is a deferred reply — a server that stops answering holds no FUSE thread.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct VersionStreamTests {
    /// The daemon serving `mp` (its pid).
    /// The loop's status is its last command's (a pid that did not match, or the `pgrep`
    /// subshell's, gone by then): only the pids it prints count.
    static func daemon(of mp: String) throws -> Int32 {
        let pids = try sh("for p in $(pgrep -f -- --daemonize-child); do [ $p = $$ ] && continue; tr '\\0' ' ' < /proc/$p/cmdline | grep -qF -- \(q(mp + " ")) && echo $p; done; true")
        return try #require(pids.split(separator: "\n").compactMap { Int32($0) }.first, "no daemon for \(mp): \(pids)")
    }

    /// Peak resident memory of a process, bytes.
    static func peakRSS(_ pid: Int32) throws -> Int64 {
        let line = try sh("grep VmHWM /proc/\(pid)/status")
        return try #require(Int64(line.split(separator: " ").dropFirst().first { !$0.isEmpty }?.trimmingCharacters(in: .whitespaces) ?? "")) * 1024
    }

    /// An earlier version of 96 MiB reads back byte for byte, and the daemon's peak memory grows
    /// by far less than the version's size while `cat` reads it.
    @Test func aLargeVersionStreamsInBoundedMemory() async throws {
        try await SyncWorld.run("version-stream") { w in
            let a = try await w.mount("a")
            try sh("head -c 100663296 /dev/urandom > \(q(w.base))/v1.bin && cp \(q(w.base))/v1.bin \(q(a))/big.bin")
            try await eventually("v1 uploaded", seconds: 60, "getfattr --only-values -n user.nimbus.status \(q(a))/big.bin | grep -q current")
            try sh("printf 'now small' > \(q(a))/big.bin")
            try await eventually("v2 uploaded", seconds: 30,
                                 "test \"$(getfattr --only-values -n user.nimbus.version \(q(a))/big.bin)\" != \"\" && getfattr --only-values -n user.nimbus.status \(q(a))/big.bin | grep -q current "
                                 + "&& ls \(q(a))/.nimbus/versions/big.bin/ | grep -q .")
            let dir = a + "/.nimbus/versions/big.bin"
            let entries = try sh("ls \(q(dir))").split(separator: "\n").map(String.init)
            let v1 = try #require(entries.first, "\(entries)")
            #expect(try sh("stat -c %s \(q(dir + "/" + v1))") == "100663296\n")
            let pid = try Self.daemon(of: a)
            let before = try Self.peakRSS(pid)
            let want = try sh("sha256sum < \(q(w.base))/v1.bin")
            #expect(try sh("sha256sum < \(q(dir + "/" + v1))") == want, "the earlier version reads back whole")
            let grown = try Self.peakRSS(pid) - before
            #expect(grown < 48 << 20, "peak memory grew by \(grown) bytes reading a 96 MiB version")
            // Reads at any offset, not only in order.
            let tail = try sh("tail -c 1000 \(q(dir + "/" + v1)) | sha256sum")
            #expect(tail == (try sh("tail -c 1000 \(q(w.base))/v1.bin | sha256sum")))
        }
    }

    /// A server that takes connections and never answers (SIGSTOP): more programs than the
    /// daemon has FUSE threads open a version and wait, while the mount goes on answering
    /// everything else; each of them gets EIO within the read timeout.
    @Test func programsWaitingOnAStoppedServerHoldNoFuseThread() async throws {
        try await SyncWorld.run("version-deferred") { w in
            let a = try await w.mount("a")
            try sh("printf v1 > \(q(a))/f.txt")
            try await eventually("v1 uploaded", "getfattr --only-values -n user.nimbus.status \(q(a))/f.txt | grep -q current")
            try sh("printf v2 > \(q(a))/f.txt")
            try await eventually("v2 uploaded", "ls \(q(a))/.nimbus/versions/f.txt/ | grep -q 'f v'")
            let entry = try sh("ls \(q(a))/.nimbus/versions/f.txt/").split(separator: "\n").map(String.init).first ?? ""
            let path = a + "/.nimbus/versions/f.txt/" + entry
            let log = w.base + "/waiters.log"
            kill(w.server.pid, SIGSTOP)
            defer { kill(w.server.pid, SIGCONT) }
            // 80 programs (the daemon runs at most 64 FUSE threads) open the version at once.
            try sh("for i in $(seq 80); do ( cat \(q(path)) >/dev/null 2>&1; echo $? >> \(q(log)) ) </dev/null >/dev/null 2>&1 & done; sleep 1")
            #expect(try sh("cat \(q(a))/.nimbus/status").contains("connection:"))
            #expect(try sh("cat \(q(a))/f.txt") == "v2")
            let ended = try sh("cat \(q(log)) 2>/dev/null | wc -l").trimmingCharacters(in: .whitespacesAndNewlines)
            let doneBefore = Int(ended) ?? -1
            #expect(doneBefore == 0, "the mount answered while all 80 programs still waited on the server (\(doneBefore) had ended)")
            try await eventually("every waiting program answered", seconds: 30, "test $(wc -l < \(q(log))) -eq 80")
            let codes = try sh("sort -u \(q(log))")
            #expect(codes == "1\n", "each cat failed (EIO), none hung or read garbage: \(codes)")
        }
    }
}
