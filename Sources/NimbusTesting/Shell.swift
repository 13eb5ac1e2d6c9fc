import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Runs `/bin/sh -c script` (stdin from /dev/null) and returns its exit status and its stdout and
/// stderr together. Used by the tests that drive real mounts with real tools.
///
/// Spawned with posix_spawn and an empty signal mask and default dispositions: Foundation's
/// `Process` hands the child the spawning thread's mask, where the Swift runtime blocks nearly
/// every signal, and a shell with SIGCHLD blocked hangs forever in `wait` (seen: `cmd & wait`).
public func shellStatus(_ script: String, cwd: String? = nil) -> (Int32, String) {
    var pipeFDs: [Int32] = [0, 0]
    guard pipe(&pipeFDs) == 0 else { return (127, "pipe: \(String(cString: strerror(errno)))") }
    for fd in pipeFDs { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 1)
    posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 2)
    var attr = posix_spawnattr_t()
    posix_spawnattr_init(&attr)
    defer { posix_spawnattr_destroy(&attr) }
    var empty = sigset_t(), all = sigset_t()
    sigemptyset(&empty)
    sigfillset(&all)
    posix_spawnattr_setsigmask(&attr, &empty)
    posix_spawnattr_setsigdefault(&attr, &all)
    posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    let command = cwd.map { "cd '\($0.replacingOccurrences(of: "'", with: "'\\''"))' && " + script } ?? script
    var pid: pid_t = 0
    let argv: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/sh"), strdup("-c"), strdup(command), nil]
    defer { for a in argv { free(a) } }
    let rc = posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, environ)
    close(pipeFDs[1])
    guard rc == 0 else {
        close(pipeFDs[0])
        return (127, "posix_spawn /bin/sh: \(String(cString: strerror(rc)))")
    }
    var out: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = read(pipeFDs[0], &buffer, buffer.count)
        if n > 0 { out += buffer[0..<n]; continue }
        if n < 0 && errno == EINTR { continue }
        break
    }
    close(pipeFDs[0])
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    // WIFEXITED / WEXITSTATUS / WTERMSIG spelled out (the C macros are not imported).
    let code = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
    return (code, String(decoding: out, as: UTF8.self))
}

/// Collects what a child writes to a pipe, on a thread of its own until EOF. Not a
/// `readabilityHandler`: its dispatch source keeps firing at EOF, and a handle freed while it is
/// registered crashed libdispatch's event loop in the test process (seen in a full run).
public final class OutputReader: @unchecked Sendable {
    // @unchecked: `data` is guarded by `lock`.
    private let lock = NSLock()
    private var data = Data()

    /// Reads `fd` (which it owns and closes at EOF).
    public init(fd: Int32) {
        let t = Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let n = read(fd, &buffer, buffer.count)
                if n > 0 {
                    lock.lock(); data.append(contentsOf: buffer[0..<n]); lock.unlock()
                    continue
                }
                if n < 0 && errno == EINTR { continue }
                break
            }
            close(fd)
        }
        t.start()
    }

    /// Reads a duplicate of `handle`'s descriptor.
    public convenience init(_ handle: FileHandle) {
        self.init(fd: dup(handle.fileDescriptor))
    }

    public var text: String { lock.lock(); defer { lock.unlock() }; return String(decoding: data, as: UTF8.self) }
}

/// A shell command running in the background, in a process group of its own; `stop()` kills
/// the group if it still runs. Spawned like `shellStatus` (clean signal mask).
public final class Background: @unchecked Sendable {
    // @unchecked: `exited` is guarded by `lock`; used by one test at a time.
    public let pid: pid_t
    private let reader: OutputReader
    private let lock = NSLock()
    private var exited = false

    public init(_ script: String) throws {
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw ShellError("pipe: \(String(cString: strerror(errno)))") }
        for fd in pipeFDs { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 1)
        posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 2)
        var attr = posix_spawnattr_t()
        posix_spawnattr_init(&attr)
        defer { posix_spawnattr_destroy(&attr) }
        var empty = sigset_t(), all = sigset_t()
        sigemptyset(&empty)
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attr, &empty)
        posix_spawnattr_setsigdefault(&attr, &all)
        posix_spawnattr_setpgroup(&attr, 0)
        posix_spawnattr_setflags(&attr, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))
        var child: pid_t = 0
        let argv: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/sh"), strdup("-c"), strdup(script), nil]
        defer { for a in argv { free(a) } }
        let rc = posix_spawn(&child, "/bin/sh", &actions, &attr, argv, environ)
        close(pipeFDs[1])
        guard rc == 0 else {
            close(pipeFDs[0])
            throw ShellError("posix_spawn /bin/sh: \(String(cString: strerror(rc)))")
        }
        pid = child
        reader = OutputReader(fd: pipeFDs[0])
    }

    public var output: String { reader.text }

    public var isRunning: Bool {
        lock.lock(); defer { lock.unlock() }
        if exited { return false }
        var status: Int32 = 0
        if waitpid(pid, &status, WNOHANG) == pid { exited = true }
        return !exited
    }

    /// Waits for the end (at most 20 s, then kills it).
    public func wait() {
        let deadline = Date().addingTimeInterval(20)
        while isRunning && Date() < deadline { usleep(10_000) }
        stop()
    }

    /// Kills the command and everything it started; waits for the shell.
    public func stop() {
        lock.lock(); defer { lock.unlock() }
        if exited { return }
        kill(-pid, SIGKILL)
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        exited = true
    }

    deinit { stop() }
}

public struct ShellError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}
