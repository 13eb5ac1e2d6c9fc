import Foundation
import Glibc
import FuseKit
import Synchronization

/// Which programs may download content by reading a placeholder (docs/mount.md "Indexers,
/// thumbnailers and scanners"). Desktop indexers, thumbnailers, `updatedb` and virus scanners
/// read every file they find; on a mount of placeholders that would download the whole
/// container. A read that needs a download is refused (`EACCES`, no network) when the program
/// that asks is on the deny list, unless the user allowed it.
///
/// The program is known by the request's thread id: its executable's name (`/proc/TID/exe`),
/// its process's name and its thread's name (`comm`, which the kernel cuts to 15 bytes:
/// `tracker-extract-3` reads as `tracker-extract`). A name on a list matches any of them; a name
/// with `*` is a pattern (`*-thumbnailer`); a cut name matches the names it starts.
///
/// The user's lists live in `STATE/programs` (`nimbus policy allow|deny`), one `allow NAME` or
/// `deny NAME` per line; the mount reads the file again when it changes (looked at once a second
/// at most, and only when a read needs a download).
public final class DownloadPolicy: Sendable {
    /// What ships on the deny list: desktop search indexers and their extractors, `locate`
    /// databases, thumbnailers, virus scanners.
    public static let shippedDeny: [String] = [
        "tracker-miner-fs-3", "tracker-extract-3", "localsearch-3", "localsearch-extractor-3",
        "baloo_file", "baloo_file_extractor", "updatedb", "updatedb.plocate", "updatedb.mlocate", "updatedb.findutils",
        "plocate", "mlocate",
        "tumblerd", "gnome-thumbnail-factory", "*-thumbnailer", "clamd", "clamscan",
    ]

    /// The kernel keeps this many bytes of a name in `comm`.
    static let commLength = 15

    /// The user's own lists (`STATE/programs`).
    public struct Lists: Equatable, Sendable {
        public var allow: [String] = []
        public var deny: [String] = []
        public init(allow: [String] = [], deny: [String] = []) { self.allow = allow; self.deny = deny }

        /// Parses the file's text; lines it does not understand are left out (and named in
        /// `problems`), so a bad line never turns the policy off.
        public static func parse(_ text: String) -> (lists: Lists, problems: [String]) {
            var l = Lists()
            var problems: [String] = []
            for raw in text.split(separator: "\n", omittingEmptySubsequences: true) {
                let line = raw.trimmingCharacters(in: .whitespaces)
                if line.isEmpty || line.hasPrefix("#") { continue }
                let parts = line.split(separator: " ", maxSplits: 1).map(String.init)
                guard parts.count == 2, DownloadPolicy.problem(inName: parts[1]) == nil else { problems.append(line); continue }
                switch parts[0] {
                case "allow": l.allow.append(parts[1])
                case "deny": l.deny.append(parts[1])
                default: problems.append(line)
                }
            }
            return (l, problems)
        }

        public var text: String {
            var s = "# Programs that may (allow) or may not (deny) download file content by reading placeholders.\n"
            s += "# Kept by `nimbus policy`; the mount reads this file again when it changes.\n"
            for a in allow { s += "allow \(a)\n" }
            for d in deny { s += "deny \(d)\n" }
            return s
        }
    }

    /// Why `name` cannot be a program name on a list (nil: it can).
    public static func problem(inName name: String) -> String? {
        if name.isEmpty { return "a program name cannot be empty" }
        if name.utf8.count > 255 { return "a program name is at most 255 bytes" }
        if name.contains("/") { return "give the program's name, not a path (no '/')" }
        if name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) || name.contains(" ") {
            return "a program name has no spaces or control characters"
        }
        return nil
    }

    /// The names a caller goes by.
    public struct Program: Sendable, Equatable {
        /// The executable's file name (`/proc/TID/exe`), nil when it cannot be read.
        public var executable: String?
        /// The process's and the thread's `comm`.
        public var process: String?
        public var thread: String?
        public init(executable: String? = nil, process: String? = nil, thread: String? = nil) {
            (self.executable, self.process, self.thread) = (executable, process, thread)
        }
        public var names: [String] { [executable, process, thread].compactMap { $0 }.filter { !$0.isEmpty } }
        /// The name it is reported by: the executable's, else the process's.
        public var shownName: String { executable ?? process ?? thread ?? "?" }
    }

    private struct Decision { var refused: String?; var at: UInt64 }
    private struct State {
        var lists = Lists()
        /// The file as last read: (modification time, size, inode).
        var stamp: (Int, Int, Int, Int)?
        var lookedAt: UInt64 = 0
        /// Recent decisions by thread id (a program that execs another keeps the id: short-lived).
        var decided: [pid_t: Decision] = [:]
        /// Programs refused since the mount started, in order (each reported once).
        var refused: [String] = []
    }

    private let file: URL?
    private let state = Mutex(State())
    private let ownPID = getpid()
    /// How long a decision about a thread id is reused, and how often the file is looked at.
    static let reuseNanoseconds: UInt64 = 2_000_000_000
    static let lookNanoseconds: UInt64 = 1_000_000_000

    /// `file`: the user's lists (`STATE/programs`); nil: the shipped list only.
    public init(file: URL?) {
        self.file = file
        state.withLock { s in reload(&s, now: Self.monotonic()) }
    }

    public static func file(inState directory: URL) -> URL { directory.appendingPathComponent("programs") }

    static func monotonic() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }

    /// Whether a pattern from a list names `candidate`.
    static func matches(_ pattern: String, _ candidate: String) -> Bool {
        if pattern.contains("*") || pattern.contains("?") || pattern.contains("[") {
            return fnmatch(pattern, candidate, 0) == 0
        }
        if pattern == candidate { return true }
        // A `comm` cut to 15 bytes names every program whose name it starts.
        return candidate.utf8.count == commLength && pattern.utf8.starts(with: candidate.utf8)
    }

    /// The name of the program refused, or nil when `program` may download.
    public static func refusal(of program: Program, lists: Lists) -> String? {
        let names = program.names
        if lists.allow.contains(where: { p in names.contains { matches(p, $0) } }) { return nil }
        for p in lists.deny + shippedDeny where names.contains(where: { matches(p, $0) }) {
            // Reported by the name on the list when it has no pattern (the full name, where the
            // caller's own may be cut), else by the executable's.
            return p.contains("*") ? program.shownName : p
        }
        return nil
    }

    /// The program refused a download for the caller `pid` (a thread id), or nil. `first` is
    /// set when this program was not refused before in this mount (report it once).
    public func refusal(pid: pid_t) -> (program: String, first: Bool)? {
        guard pid > 0, pid != ownPID else { return nil }
        let now = Self.monotonic()
        if let d = state.withLock({ s -> Decision? in
            if now &- s.lookedAt > Self.lookNanoseconds { reload(&s, now: now) }
            guard let d = s.decided[pid], now &- d.at < Self.reuseNanoseconds else { return nil }
            return d
        }) {
            return d.refused.map { ($0, false) }
        }
        let program = Self.program(pid)
        return state.withLock { s in
            let refused = Self.refusal(of: program, lists: s.lists)
            if s.decided.count >= 1024 { s.decided.removeAll(keepingCapacity: true) }
            s.decided[pid] = Decision(refused: refused, at: now)
            guard let refused else { return nil }
            if s.refused.contains(refused) { return (refused, false) }
            s.refused.append(refused)
            return (refused, true)
        }
    }

    /// Programs refused since the mount started, in the order first refused.
    public var refusedPrograms: [String] { state.withLock { $0.refused } }

    /// The lists in force now.
    public var lists: Lists { state.withLock { s in reload(&s, now: Self.monotonic()); return s.lists } }

    private func reload(_ s: inout State, now: UInt64) {
        s.lookedAt = now
        guard let file else { return }
        var st = stat()
        guard stat(file.path, &st) == 0 else {
            if s.stamp != nil { s.stamp = nil; s.lists = Lists(); s.decided = [:] }
            return
        }
        let stamp = (Int(st.st_mtim.tv_sec), Int(st.st_mtim.tv_nsec), Int(st.st_size), Int(st.st_ino))
        if let old = s.stamp, old == stamp { return }
        s.stamp = stamp
        guard let data = FileManager.default.contents(atPath: file.path) else { return }
        s.lists = Lists.parse(String(decoding: data, as: UTF8.self)).lists
        s.decided = [:]
    }

    /// The names of thread `tid`'s program, from /proc.
    static func program(_ tid: pid_t) -> Program {
        var p = Program()
        var buf = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/\(tid)/exe", &buf, buf.count - 1)
        if n > 0 {
            var path = String(decoding: buf[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            if path.hasSuffix(" (deleted)") { path.removeLast(" (deleted)".count) }
            p.executable = path.split(separator: "/").last.map(String.init)
        }
        p.thread = firstLine("/proc/\(tid)/comm")
        let tgid = firstLine("/proc/\(tid)/status", key: "Tgid:").flatMap { Int32($0) } ?? tid
        p.process = tgid == tid ? p.thread : firstLine("/proc/\(tgid)/comm")
        // A program names itself: no control characters reach an event line or the status.
        let clean = { (s: String?) in s.map { String(String.UnicodeScalarView($0.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? "?" : $0 })) } }
        (p.executable, p.process, p.thread) = (clean(p.executable), clean(p.process), clean(p.thread))
        return p
    }

    /// The first line of a small /proc file (or the value after `key` on the line starting with it).
    private static func firstLine(_ path: String, key: String? = nil) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buf = [UInt8](repeating: 0, count: key == nil ? 256 : 2048)
        let n = read(fd, &buf, buf.count)
        guard n > 0 else { return nil }
        let text = String(decoding: buf[0..<n], as: UTF8.self)
        guard let key else { return text.split(separator: "\n").first.map(String.init) }
        for line in text.split(separator: "\n") where line.hasPrefix(key) {
            return line.dropFirst(key.count).trimmingCharacters(in: .whitespaces)
        }
        return nil
    }
}

extension ContainerFS {
    /// Whether the program behind the request of thread `pid` may not start a download of
    /// `node`'s content (DownloadPolicy): the first refusal of a program in this mount is an
    /// event, with the command that allows it.
    func refusesDownload(pid: pid_t, node: NodeID) -> Bool {
        guard let policy = options.downloadPolicy, let r = policy.refusal(pid: pid) else { return false }
        if r.first {
            let path = lock.withLock { t.nodes[node].map(pathLocked) } ?? "/"
            events.append(.refused, origin: .local, path: path, detail: "\(r.program) may not download (allow it: nimbus policy allow \(r.program))")
        }
        return true
    }
}
