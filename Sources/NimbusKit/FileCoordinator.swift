// NimbusKit: coordinated reads and writes, and the process's presenters (docs/presenters.md).
import Dispatch
import Foundation
import PresenterProtocol
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Coordinated access to files, shaped like Foundation's `NSFileCoordinator`. On a Nimbus mount
/// a coordinated read is a shared `flock` and a coordinated write an exclusive one — claims the
/// sync engine respects (no upload mid-write, no remote replacement mid-read) — and a write
/// first asks the other presenters of the file to relinquish it (docs/presenters.md). Every
/// wait is bounded by `timeout`. Outside a mount it is a plain `flock`.
public final class FileCoordinator: Sendable {
    private let presenter: (any FilePresenter)?

    /// `filePresenter`: the presenter on whose behalf this coordinator writes; it is not told
    /// of its own changes (`changed` events of the written path are dropped until 2 s after).
    public init(filePresenter: (any FilePresenter)? = nil) {
        presenter = filePresenter
    }

    // MARK: presenters

    struct Registration {
        weak var presenter: (any FilePresenter)?
        let token: Token
        let connection: MountConnection
    }
    struct Registry {
        var connections: [String: MountConnection] = [:]  // by socket path
        var registrations: [ObjectIdentifier: Registration] = [:]
        var nextToken = 1  // process-wide, so unique on every connection
    }
    static let registry = Mutex(Registry())

    static func connection(root: String, socket: String) -> MountConnection {
        registry.withLock { r in
            if let c = r.connections[socket] { return c }
            let c = MountConnection(root: root, socket: socket)
            r.connections[socket] = c
            return c
        }
    }

    /// The registration of `p` if it is live (not an older object at the same address).
    static func registration(of p: any FilePresenter) -> Registration? {
        registry.withLock { r in r.registrations[ObjectIdentifier(p)].flatMap { $0.presenter === p ? $0 : nil } }
    }

    /// The daemon ended a presentation (the item was deleted).
    static func forget(token: Token, on c: MountConnection) {
        registry.withLock { r in r.registrations = r.registrations.filter { $0.value.token != token || $0.value.connection !== c } }
    }

    /// Presents `p.presentedItemURL` to its mount's daemon (again, if it was presented already).
    /// Throws when the URL is not in a Nimbus mount, or the daemon cannot be reached or refuses.
    public static func addFilePresenter(_ p: any FilePresenter) throws {
        guard let url = p.presentedItemURL else { throw CoordinationError.notInMount("(the presenter has no presentedItemURL)") }
        guard let loc = MountLocation.find(url.path) else { throw CoordinationError.notInMount(url.path) }
        guard let socket = loc.socket else {
            throw CoordinationError.refused("the mount at \(loc.root) has no presenter socket (`presenter-socket: none` in .nimbus/status)")
        }
        removeFilePresenter(p)
        let conn = connection(root: loc.root, socket: socket)
        let token = registry.withLock { r in
            defer { r.nextToken += 1 }
            return Token(r.nextToken)
        }
        try conn.register(token, p, path: loc.containerPath)
        registry.withLock { $0.registrations[ObjectIdentifier(p)] = Registration(presenter: p, token: token, connection: conn) }
    }

    /// Ends the presentation of `p` (nothing if it was not presented).
    public static func removeFilePresenter(_ p: any FilePresenter) {
        let reg = registry.withLock { r -> Registration? in
            guard let reg = r.registrations[ObjectIdentifier(p)], reg.presenter === p else { return nil }
            r.registrations[ObjectIdentifier(p)] = nil
            return reg
        }
        if let reg { reg.connection.unregister(reg.token) }
    }

    /// The presenters registered in this process (and still alive).
    public static var filePresenters: [any FilePresenter] {
        registry.withLock { r in r.registrations.values.compactMap(\.presenter) }
    }

    // MARK: coordinated access

    /// Runs `accessor` while holding a shared claim on the file: waits at most `timeout` for an
    /// exclusive holder to let go, then `CoordinationError.timedOut`. Reads never ask presenters
    /// anything. A missing file throws `CoordinationError.posix` (`ENOENT`).
    public func coordinate<T>(readingItemAt url: URL, timeout: Duration = .seconds(30),
                              byAccessor accessor: (URL) throws -> T) throws -> T {
        let deadline = ContinuousClock.now + timeout
        let fd = open(url.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw CoordinationError.posix(path: url.path, errno: errno) }
        defer { close(fd) }
        try Self.lock(fd, LOCK_SH, path: url.path, deadline: deadline, timeout: timeout)
        defer { flock(fd, LOCK_UN) }
        return try accessor(url)
    }

    /// Asks the file's other presenters to relinquish it (`will-write`), runs `accessor` while
    /// holding an exclusive claim, then lets them reacquire (`did-write`); all waits together take
    /// at most `timeout`. A file that does not exist yet is written without a claim (nothing to
    /// race with). Throws when the mount's daemon cannot be reached or refuses.
    public func coordinate<T>(writingItemAt url: URL, timeout: Duration = .seconds(30),
                              byAccessor accessor: (URL) throws -> T) throws -> T {
        let deadline = ContinuousClock.now + timeout
        var write: (conn: MountConnection, token: Token, path: String)?
        if let loc = MountLocation.find(url.path), let socket = loc.socket {
            let c = Self.connection(root: loc.root, socket: socket)
            let token = presenter.flatMap { Self.registration(of: $0) }.flatMap { $0.connection === c ? $0.token : nil } ?? 0
            try c.willWrite(token: token, path: loc.containerPath, file: url.path, deadline: deadline, timeout: timeout)
            write = (c, token, loc.containerPath)
        }
        defer { if let write { write.conn.didWrite(token: write.token, path: write.path) } }
        var fd = open(url.path, O_RDWR | O_CLOEXEC)
        if fd < 0 && (errno == EACCES || errno == EISDIR) { fd = open(url.path, O_RDONLY | O_CLOEXEC) }
        if fd < 0 {
            if errno == ENOENT { return try accessor(url) }
            throw CoordinationError.posix(path: url.path, errno: errno)
        }
        defer { close(fd) }
        try Self.lock(fd, LOCK_EX, path: url.path, deadline: deadline, timeout: timeout)
        defer { flock(fd, LOCK_UN) }
        return try accessor(url)
    }

    /// `flock` without blocking forever: retries with growing pauses (2 ms doubling to 50 ms)
    /// until `deadline`.
    static func lock(_ fd: Int32, _ op: Int32, path: String, deadline: ContinuousClock.Instant, timeout: Duration) throws {
        var pause: Duration = .milliseconds(2)
        while flock(fd, op | LOCK_NB) != 0 {
            let e = errno
            guard e == EWOULDBLOCK || e == EINTR else { throw CoordinationError.posix(path: path, errno: e) }
            let now = ContinuousClock.now
            if now >= deadline { throw CoordinationError.timedOut(path: path, seconds: timeout.seconds) }
            Thread.sleep(forTimeInterval: min(pause, deadline - now).seconds)
            pause = min(pause * 2, .milliseconds(50))
        }
    }
}
