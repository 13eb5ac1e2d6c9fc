import Foundation
import Glibc
import NimbusTesting
import Testing

// Two (or more) real mounts of one container on one `nimbus serve`, every process the built
// binary (FUSE-NOTES: never read a mount served from this process's task pool). `cleanup()`
// unmounts everything — lazily if busy — and stops the server, also when a test fails.

typealias SyncEnv = FuseEnvironment

struct ShellFailed: Error, CustomStringConvertible { let description: String }

/// Runs `/bin/sh -c script`; returns (status, stdout+stderr).
func shStatus(_ script: String) -> (Int32, String) {
    shellStatus(script)
}

@discardableResult
func sh(_ script: String) throws -> String {
    let (status, out) = shStatus(script)
    if status != 0 { throw ShellFailed(description: "exit \(status): \(script)\n\(out)") }
    return out
}

func q(_ s: String) -> String { "'" + s.replacingOccurrences(of: "'", with: "'\\''") + "'" }

final class SyncWorld: @unchecked Sendable {
    // @unchecked: used by one test at a time.
    let base: String
    private(set) var server: ServerProcess
    private var mountpoints: [String] = []

    init(_ label: String) async throws {
        base = try sh("mktemp -d /tmp/nimbus-sync-\(label)-XXXXXX").trimmingCharacters(in: .whitespacesAndNewlines)
        server = ServerProcess(dataDir: base + "/server")
        try await server.start()
    }

    /// Starts the server again on the same data and port (it was stopped).
    func restartServer() async throws {
        server.stop()
        let port = String(server.url.split(separator: ":").last ?? "0")
        server = ServerProcess(dataDir: base + "/server", extraArgs: ["--listen", "127.0.0.1:\(port)"])
        try await server.start()
    }

    /// Mounts `device` again with its existing state and token.
    func remount(_ device: String) throws {
        let mp = base + "/\(device)"
        try sh("\(q(NimbusBinary.path)) mount \(q(mp)) --state \(q(base + "/\(device)-state")) --server \(server.url) --container docs --token-file \(q(base + "/\(device).token"))")
    }

    /// kill -9 of the daemon serving `mp`, then clears the dead mount.
    func crash(_ mp: String) throws {
        try sh("k=0; for p in $(pgrep -f -- --daemonize-child); do [ $p = $$ ] && continue; tr '\\0' ' ' < /proc/$p/cmdline | grep -qF -- \(q(mp + " ")) && kill -9 $p && k=1; done; [ $k = 1 ] || { echo no daemon for \(q(mp)); exit 1; }; sleep 0.3; fusermount3 -uz \(q(mp))")
    }

    /// Mounts the container `docs` as a new device named `device`; returns the mountpoint.
    func mount(_ device: String) async throws -> String {
        let r = try await NimbusBinary.run(["admin", "add-device", "--data", base + "/server", "--account", "alice", "--device", device])
        guard r.status == 0 else { throw ShellFailed(description: "add-device failed: \(r.stderr)") }
        let tokenFile = base + "/\(device).token"
        try r.stdout.write(toFile: tokenFile, atomically: true, encoding: .utf8)
        let mp = base + "/\(device)"
        try FileManager.default.createDirectory(atPath: mp, withIntermediateDirectories: true)
        mountpoints.append(mp)
        try sh("\(q(NimbusBinary.path)) mount \(q(mp)) --state \(q(base + "/\(device)-state")) --server \(server.url) --container docs --token-file \(q(tokenFile))")
        return mp
    }

    /// The server's `nimbus_chunk_bytes_out_total` (downloads).
    func chunkBytesOut() throws -> Int64 { try metric("nimbus_chunk_bytes_out_total") }
    /// The server's `nimbus_chunk_bytes_in_total` (uploads).
    func chunkBytesIn() throws -> Int64 { try metric("nimbus_chunk_bytes_in_total") }

    func metric(_ name: String) throws -> Int64 {
        let text = try sh("curl -s --max-time 5 \(server.url)/metrics")
        for line in text.split(separator: "\n") where line.hasPrefix(name) {
            if let v = line.split(separator: " ").last.flatMap({ Double($0) }) { return Int64(v) }
        }
        return 0
    }

    func cleanup() {
        for mp in mountpoints {
            _ = shStatus("\(q(NimbusBinary.path)) unmount \(q(mp)) 2>/dev/null || fusermount3 -uz \(q(mp)) 2>/dev/null")
            if shStatus("grep -qF \(q(" " + mp + " ")) /proc/self/mountinfo").0 == 0 { _ = shStatus("fusermount3 -uz \(q(mp))") }
        }
        server.stop()
        if ProcessInfo.processInfo.environment["NIMBUS_KEEP_TEST_DIRS"] == nil { _ = shStatus("rm -rf \(q(base))") }
    }
}

/// Polls `check` (a shell script) until it exits 0, at most `seconds`; fails with its output.
func eventually(_ what: String, seconds: Double = 15, _ check: String) async throws {
    let deadline = Date().addingTimeInterval(seconds)
    var last = ""
    while Date() < deadline {
        let (status, out) = shStatus(check)
        if status == 0 { return }
        last = out
        try await Task.sleep(for: .milliseconds(100))
    }
    Issue.record("\(what): not true within \(seconds) s (\(check)): \(last)")
    throw ShellFailed(description: what)
}
