#if canImport(ContainerFS)
import Foundation
import Glibc

/// How a mount daemon's last save went, for `nimbus unmount` — a separate process that cannot
/// wait for the daemon's exit status. `STATE/daemon.status` holds one line: `running PID` from
/// the start, overwritten in place at the end by `saved PID` or `failed PID MESSAGE`. Its 4 KiB
/// are written at the start, so the last word needs no new space on a full disk.
enum DaemonStatus {
    static let size = 4096

    static func path(_ state: String) -> String { state + "/daemon.status" }

    /// Writes `running PID`; returns the descriptor to `finish` with (-1: could not).
    static func start(state: String) -> Int32 {
        let fd = Glibc.open(path(state), O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return -1 }
        guard put(fd, "running \(getpid())") else { Glibc.close(fd); return -1 }
        return fd
    }

    /// Overwrites the line with the outcome and closes `fd`.
    static func finish(_ fd: Int32, saved failure: String?) {
        guard fd >= 0 else { return }
        let oneLine = failure.map { $0.replacingOccurrences(of: "\n", with: " ") }
        _ = put(fd, oneLine.map { "failed \(getpid()) \($0)" } ?? "saved \(getpid())")
        Glibc.close(fd)
    }

    private static func put(_ fd: Int32, _ line: String) -> Bool {
        var bytes = Array((line + "\n").utf8.prefix(size - 1))
        if bytes.last != 0x0a { bytes.append(0x0a) }
        bytes += [UInt8](repeating: 0x20, count: size - bytes.count)
        let n = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, size, 0) }
        return n == size && fsync(fd) == 0
    }

    enum Outcome: Equatable {
        case running, saved, failed(String), unknown
    }

    /// What the daemon `pid` of `state` wrote last.
    static func read(state: String, pid: pid_t) -> Outcome {
        guard let text = try? String(contentsOfFile: path(state), encoding: .utf8),
              let line = text.split(separator: "\n", maxSplits: 1).first else { return .unknown }
        let words = line.split(separator: " ", maxSplits: 2)
        guard words.count >= 2, words[1] == "\(pid)" else { return .unknown }
        switch words[0] {
        case "running": return .running
        case "saved": return .saved
        case "failed": return .failed(words.count > 2 ? String(words[2]).trimmingCharacters(in: .whitespaces) : "")
        default: return .unknown
        }
    }
}
#endif
