import Foundation
import NimbusTesting
import Glibc
import Testing

/// Real mounts for tests: runs the built `nimbus` binary as a subprocess (FUSE-NOTES: a test
/// process must not serve its own mount from the Swift task pool), one mountpoint per test,
/// always unmounted — lazily if busy — even when the test fails.
enum MountEnv {
    static var problem: String? { FuseEnvironment.problem }
    static var usable: Bool { FuseEnvironment.usable }

    /// The `nimbus` executable built beside this test bundle.
    static let binary: String = {
        if let env = ProcessInfo.processInfo.environment["NIMBUS_BINARY"] { return env }
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        var dir = exe.deletingLastPathComponent()
        for _ in 0..<4 {
            let candidate = dir.appendingPathComponent("nimbus").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            dir = dir.deletingLastPathComponent()
        }
        return exe.deletingLastPathComponent().appendingPathComponent("nimbus").path
    }()
}

struct CommandFailed: Error, CustomStringConvertible {
    let description: String
}

/// Runs `/bin/sh -c script` and returns stdout+stderr; throws with the output on a non-zero exit.
@discardableResult
func sh(_ script: String, cwd: String? = nil, allowFailure: Bool = false) throws -> String {
    let (status, out) = shStatus(script, cwd: cwd)
    if status != 0 && !allowFailure {
        throw CommandFailed(description: "exit \(status): \(script)\n\(out)")
    }
    return out
}

func shStatus(_ script: String, cwd: String? = nil) -> (Int32, String) {
    shellStatus(script, cwd: cwd)
}

/// Shell-quotes a path.
func q(_ s: String) -> String { "'" + s.replacingOccurrences(of: "'", with: "'\\''") + "'" }

/// A temporary container mounted at `mp` with its state in `state`.
final class Mounted: @unchecked Sendable {
    // @unchecked: used by one test at a time.
    let base: String
    let mp: String
    let state: String

    init(_ label: String) throws {
        base = try sh("mktemp -d /tmp/nimbus-mt-\(label)-XXXXXX").trimmingCharacters(in: .whitespacesAndNewlines)
        mp = base + "/mnt"
        state = base + "/state"
        try FileManager.default.createDirectory(atPath: mp, withIntermediateDirectories: true)
        try mount()
    }

    func mount() throws {
        try sh("\(q(MountEnv.binary)) mount \(q(mp)) --state \(q(state))")
    }

    func unmount() throws {
        try sh("\(q(MountEnv.binary)) unmount \(q(mp))")
    }

    /// The daemon's pid (for kill -9 tests).
    func daemonPID() throws -> pid_t {
        let out = try sh("pgrep -f -- \(q("--foreground")) | while read p; do tr '\\0' ' ' < /proc/$p/cmdline | grep -qF -- \(q(mp + " ")) && echo $p; done; true")
        guard let pid = pid_t(out.split(separator: "\n").first.map(String.init) ?? "") else {
            throw CommandFailed(description: "no daemon found for \(mp)")
        }
        return pid
    }

    /// Unmounts whatever is there (lazily if needed) and removes the temporary tree.
    func cleanup() {
        _ = shStatus("\(q(MountEnv.binary)) unmount \(q(mp)) 2>/dev/null || fusermount3 -uz \(q(mp)) 2>/dev/null")
        if shStatus("grep -qF \(q(" " + mp + " ")) /proc/self/mountinfo").0 == 0 {
            _ = shStatus("fusermount3 -uz \(q(mp))")
        }
        _ = shStatus("rm -rf \(q(base))")
    }
}

/// Mounts a fresh container, runs `body`, and always unmounts.
func withMount(_ label: String, _ body: (Mounted) throws -> Void) throws {
    let m = try Mounted(label)
    defer { m.cleanup() }
    try body(m)
}
