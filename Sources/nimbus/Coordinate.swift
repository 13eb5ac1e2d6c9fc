#if canImport(CFuse3)
import ArgumentParser
import Foundation
import Glibc

/// `nimbus coordinate --read|--write PATH -- CMD [ARGS…]`: runs a command under a claim on a
/// file of a mount, for scripts (docs/coordination.md). The claim is a `flock` through the mount —
/// which the daemon turns into a claim the sync engine respects: under `--write` nothing is
/// uploaded and no remote version replaces the file until the command ends; under `--read` no
/// remote version replaces it. Other programs' locks behave as usual against it.
struct Coordinate: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a command while holding a read or write claim on a file in a mount.")

    @Flag(help: "A shared claim: no remote version replaces the file while CMD runs.")
    var read = false

    @Flag(help: "An exclusive claim: also no upload of the file while CMD runs (CMD is saving it).")
    var write = false

    @Option(help: "Seconds to wait for the claim before giving up (exit 5).")
    var timeout: Double = 30

    @Argument(help: "A file in a Nimbus mount.")
    var path: String

    @Argument(parsing: .postTerminator, help: "The command and its arguments (after --).")
    var command: [String] = []

    func validate() throws {
        if read == write { throw ValidationError("give exactly one of --read or --write") }
        if command.isEmpty { throw ValidationError("give the command after --: nimbus coordinate --write FILE -- CMD ARGS…") }
        if !(0...3600).contains(timeout) { throw ValidationError("--timeout: give 0 to 3600 seconds") }
    }

    func run() throws {
        let root = try MountSurface.root(of: path)
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw CLIFailure(.usage, "\(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        let deadline = Date().addingTimeInterval(timeout)
        while flock(fd, (write ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR else {
                throw CLIFailure(.usage, "\(path): cannot lock: \(String(cString: strerror(errno)))")
            }
            if Date() >= deadline {
                let holders = (try? String(contentsOfFile: root + "/.nimbus/claims", encoding: .utf8)) ?? ""
                let name = URL(fileURLWithPath: path).lastPathComponent
                let mine = holders.split(separator: "\n").filter { $0.contains(name) }.joined(separator: "\n  ")
                throw CLIFailure(.inconsistent, "\(path) stayed claimed for \(Int(timeout)) s\(mine.isEmpty ? "" : ":\n  " + mine)")
            }
            usleep(20_000)
        }
        let status = try Spawn.run(command)
        throw ExitCode(status)
    }
}

/// Runs a command with the default signal mask and dispositions (a Foundation `Process` child
/// inherits a blocked SIGCHLD, which hangs shell scripts that `wait`), waits for it and returns
/// its exit status (128 + signal when killed).
enum Spawn {
    static func run(_ argv: [String]) throws -> Int32 {
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attr, &none)
        var dflt = sigset_t()
        sigemptyset(&dflt)
        for s in [SIGCHLD, SIGPIPE, SIGINT, SIGTERM, SIGHUP] { sigaddset(&dflt, s) }
        posix_spawnattr_setsigdefault(&attr, &dflt)
        posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var cargs: [UnsafeMutablePointer<CChar>?] = argv.map { strdup($0) } + [nil]
        defer { for p in cargs { free(p) } }
        var pid: pid_t = 0
        let rc = posix_spawnp(&pid, argv[0], nil, &attr, &cargs, environ)
        guard rc == 0 else { throw CLIFailure(.usage, "cannot run \(argv[0]): \(String(cString: strerror(rc)))") }
        var st: Int32 = 0
        while waitpid(pid, &st, 0) < 0 && errno == EINTR {}
        if st & 0x7f == 0 { return (st >> 8) & 0xff }
        return 128 + (st & 0x7f)
    }
}

/// `nimbus watch [PATH]`: follows `.nimbus/events` (the same lines `tail -f` shows), only the
/// events under PATH when given.
struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print changes, moves, deletes, new versions, conflicts, downloads and uploads as they happen.")

    @Argument(help: "A mount, or a file or folder in one (default: the current folder).")
    var path: String?

    @Flag(help: "Start with the events the mount still keeps, not only new ones.")
    var history = false

    @Option(help: "Exit after this many lines.")
    var count: Int?

    func run() throws {
        let target = URL(fileURLWithPath: path ?? FileManager.default.currentDirectoryPath).standardizedFileURL.path
        let root = try MountSurface.root(of: target)
        // The folder's place in the mount, from the real paths (the target may be named
        // through a link to a folder inside the mount).
        let (realTarget, realRoot) = (MountSurface.realPath(target) ?? target, MountSurface.realPath(root) ?? root)
        let prefix = realTarget == realRoot ? "/" : String(realTarget.dropFirst(realRoot.count))
        let fd = open(root + "/.nimbus/events", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw CLIFailure(.storage, "cannot open \(root)/.nimbus/events: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var st = stat()
        fstat(fd, &st)
        var offset: Int64 = history ? 0 : Int64(st.st_size)
        var pending: [UInt8] = []
        var printed = 0
        var buf = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let n = pread(fd, &buf, buf.count, off_t(offset))
            if n < 0 { throw CLIFailure(.storage, "reading the events failed: \(String(cString: strerror(errno))) (is the mount alive?)") }
            if n == 0 { usleep(100_000); continue }
            offset += Int64(n)
            pending += buf[0..<n]
            while let nl = pending.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: pending[..<nl], as: UTF8.self)
                pending.removeSubrange(...nl)
                if prefix == "/" || Self.mentions(line, prefix) {
                    FileHandle.standardOutput.write(Data((line + "\n").utf8))  // unbuffered: one line as it happens
                    printed += 1
                    if let count, printed >= count { return }
                }
            }
        }
    }

    /// Whether an event line's path (or its move target) is `prefix` or below it.
    static func mentions(_ line: String, _ prefix: String) -> Bool {
        let fields = line.split(separator: " ", maxSplits: 4, omittingEmptySubsequences: false)
        guard fields.count == 5 else { return false }
        let rest = String(fields[4])
        let paths = rest.components(separatedBy: " -> ")
        return paths.contains { p in p == prefix || p.hasPrefix(prefix + "/") || p.hasPrefix(prefix + " ") }
    }
}

struct Debug: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Look inside a running mount.", subcommands: [DebugClaims.self])
}

/// `nimbus debug claims [MOUNTPOINT]`: every held and waiting lock and claim, with its owner.
struct DebugClaims: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "claims",
        abstract: "Print every held and waiting claim (program locks and sync engine claims) with its owner.")

    @Argument(help: "The mountpoint (or a path inside it; default: the current folder).")
    var path: String?

    func run() throws {
        let root = try MountSurface.root(of: path ?? FileManager.default.currentDirectoryPath)
        guard let text = try? String(contentsOfFile: root + "/.nimbus/claims", encoding: .utf8) else {
            throw CLIFailure(.storage, "cannot read \(root)/.nimbus/claims (is the mount alive?)")
        }
        print(text, terminator: "")
    }
}
#endif
