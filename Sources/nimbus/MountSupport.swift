#if canImport(ContainerFS)
import Foundation
import Glibc
import LocalStore

/// Mount-table plumbing for `nimbus mount` / `nimbus unmount`.
enum MountSupport {
    /// Whether `path` is a mountpoint of a nimbus FUSE filesystem (from /proc/self/mountinfo).
    static func isNimbusMount(_ path: String) -> Bool {
        guard let text = ProcFile.text("/proc/self/mountinfo") else { return false }
        for line in text.split(separator: "\n") {
            let f = line.split(separator: " ")
            guard f.count > 4, let dash = f.firstIndex(of: "-"), dash + 1 < f.count else { continue }
            if unescape(String(f[4])) == path && f[dash + 1].hasPrefix("fuse.nimbus") { return true }
        }
        return false
    }

    /// mountinfo escapes space, tab, newline and backslash as octal.
    static func unescape(_ s: String) -> String {
        s.replacingOccurrences(of: "\\040", with: " ").replacingOccurrences(of: "\\011", with: "\t")
            .replacingOccurrences(of: "\\012", with: "\n").replacingOccurrences(of: "\\134", with: "\\")
    }

    /// Clears a mount whose daemon died (every access fails with ENOTCONN); refuses a live one.
    static func clearDeadMount(_ mp: String) throws {
        guard isNimbusMount(mp) else { return }
        // statfs always asks the daemon (stat may be answered from the kernel's attribute cache).
        var sf = statvfs()
        if statvfs(mp, &sf) == 0 { throw CLIFailure(.usage, "\(mp) is already mounted (nimbus unmount \(mp) first)") }
        let e = errno
        guard e == ENOTCONN || e == ECONNABORTED else { return }
        FileHandle.standardError.write(Data("nimbus: \(mp): clearing a mount left by a daemon that died\n".utf8))
        _ = run("/usr/bin/env", ["fusermount3", "-uz", mp])
    }

    /// Starts `nimbus mount --foreground` as a background daemon and waits until the mount answers.
    static func startDaemon(mountpoint mp: String, state: String, cacheTimeout: Double, timeout: Double, remote: RemoteConfig?) throws {
        try StateFiles.directory(state)
        let logPath = state + "/mount.log"
        // Appended to, never truncated: the log of a daemon that died is what explains it.
        // 0600: it names the items synced.
        StateFiles.file(logPath)
        guard let log = FileHandle(forWritingAtPath: logPath) else { throw CLIFailure(.storage, "cannot write \(logPath)") }
        log.seekToEndOfFile()
        let logStart = log.offsetInFile
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        p.arguments = ["mount", mp, "--state", state, "--foreground", "--daemonize-child", "--cache-timeout", "\(cacheTimeout)"]
            + (remote?.arguments ?? [])
        if let remote, remote.tokenFile == nil {
            var env = ProcessInfo.processInfo.environment
            env["NIMBUS_TOKEN"] = remote.token
            p.environment = env
        }
        p.standardInput = FileHandle.nullDevice
        p.standardOutput = log
        p.standardError = log
        try p.run()
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if isNimbusMount(mp) {
                var sf = statvfs()
                if statvfs(mp, &sf) == 0 { return }
            }
            if !p.isRunning {
                let text = (try? String(contentsOfFile: logPath, encoding: .utf8)).map { String($0.utf8.dropFirst(Int(logStart))) ?? "" } ?? ""
                // The daemon's own exit code says what kind of failure it was (docs/errors.md).
                let status = ExitStatus(rawValue: p.terminationStatus) ?? .storage
                throw CLIFailure(status, "the mount daemon exited (status \(p.terminationStatus)): \(text.trimmingCharacters(in: .whitespacesAndNewlines))")
            }
            usleep(20_000)
        }
        kill(p.processIdentifier, SIGTERM)
        throw CLIFailure(.storage, "the mount did not become ready within \(Int(timeout)) s (see \(logPath))")
    }

    static func unmount(_ mp: String, lazy: Bool) throws {
        guard isNimbusMount(mp) else { throw CLIFailure(.usage, "\(mp) is not a nimbus mount") }
        let daemons = daemonPIDs(mountpoint: mp)
        let (status, output) = run("/usr/bin/env", ["fusermount3", lazy ? "-uz" : "-u", mp])
        if status != 0 {
            throw CLIFailure(.usage, "cannot unmount \(mp): \(output.trimmingCharacters(in: .whitespacesAndNewlines)) (use --lazy to detach a busy mount)")
        }
        // Wait for the daemon to commit its state and exit, so an immediate remount finds it
        // (bounded: its sync engine stops within 10 s and a failing save is given up after 5 s).
        let deadline = Date().addingTimeInterval(lazy ? 2 : 30)
        while Date() < deadline, daemons.contains(where: { kill($0.pid, 0) == 0 && !isZombie($0.pid) }) { usleep(20_000) }
        if lazy { return }
        // A state that could not be saved is an error of the unmount (docs/errors.md).
        for d in daemons {
            guard let state = d.state else { continue }
            let running = kill(d.pid, 0) == 0 && !isZombie(d.pid)
            switch DaemonStatus.read(state: state, pid: d.pid) {
            case .failed(let why):
                throw CLIFailure(.storage, "unmounted \(mp), but \(why); free space there and mount again")
            case .running where running:
                throw CLIFailure(.storage, "unmounted \(mp), but its daemon (pid \(d.pid)) is still saving the local state; see \(state)/mount.log")
            case .running:
                throw CLIFailure(.storage, "unmounted \(mp), but its daemon (pid \(d.pid)) ended without saving the local state; see \(state)/mount.log")
            case .saved, .unknown:
                break
            }
        }
    }

    /// Daemons serving `mp` (processes running `nimbus mount MP … --foreground`), with their
    /// `--state` directory.
    static func daemonPIDs(mountpoint mp: String) -> [(pid: pid_t, state: String?)] {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") else { return [] }
        var out: [(pid: pid_t, state: String?)] = []
        for e in entries {
            guard let pid = pid_t(e), pid != getpid(),
                  let data = ProcFile.bytes("/proc/\(e)/cmdline") else { continue }
            let args = data.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
            guard args.contains("mount"), args.contains("--foreground"), args.contains(mp) else { continue }
            let state = args.firstIndex(of: "--state").flatMap { $0 + 1 < args.count ? args[$0 + 1] : nil }
            out.append((pid, state))
        }
        return out
    }

    static func isZombie(_ pid: pid_t) -> Bool {
        guard let s = ProcFile.text("/proc/\(pid)/stat"),
              let close = s.lastIndex(of: ")") else { return true }
        return s[s.index(close, offsetBy: 2)...].hasPrefix("Z")
    }

    @discardableResult
    static func run(_ tool: String, _ args: [String]) -> (Int32, String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: tool)
        p.arguments = args
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = pipe
        do { try p.run() } catch { return (127, "\(error)") }
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}
#endif
