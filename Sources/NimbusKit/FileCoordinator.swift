import Dispatch
import Foundation
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
    /// of its own changes.
    public init(filePresenter: (any FilePresenter)? = nil) {
        presenter = filePresenter
    }

    // MARK: presenters

    struct Registration {
        weak var presenter: (any FilePresenter)?
        let token: Int
        let connection: MountConnection
    }
    struct Registry {
        var connections: [String: MountConnection] = [:]  // by socket path
        var registrations: [ObjectIdentifier: Registration] = [:]
        var nextToken = 1
    }
    static let registry = Mutex(Registry())

    static func connection(for location: MountLocation) -> MountConnection {
        registry.withLock { r in
            if let c = r.connections[location.socket] { return c }
            let c = MountConnection(location)
            r.connections[location.socket] = c
            return c
        }
    }

    /// Presents `p.presentedItemURL` to its mount's daemon. Throws when the URL is not in a
    /// Nimbus mount or the daemon cannot be reached or refuses.
    public static func addFilePresenter(_ p: any FilePresenter) throws {
        guard let url = p.presentedItemURL else { throw CoordinationError.notInMount("(no presentedItemURL)") }
        guard let loc = MountLocation.find(url.path) else { throw CoordinationError.notInMount(url.path) }
        let conn = connection(for: loc)
        let token = registry.withLock { r in
            defer { r.nextToken += 1 }
            return r.nextToken
        }
        try conn.register(token, p, path: loc.containerPath)
        registry.withLock { $0.registrations[ObjectIdentifier(p)] = Registration(presenter: p, token: token, connection: conn) }
    }

    public static func removeFilePresenter(_ p: any FilePresenter) {
        guard let reg = registry.withLock({ $0.registrations.removeValue(forKey: ObjectIdentifier(p)) }) else { return }
        reg.connection.unregister(reg.token)
        PresenterQueues.forget(p)
    }

    public static var filePresenters: [any FilePresenter] {
        registry.withLock { r in r.registrations.values.compactMap(\.presenter) }
    }

    // MARK: coordinated access

    /// Runs `accessor` while holding a shared claim on the file (waits at most `timeout` for an
    /// exclusive holder to let go). Reads never ask presenters anything.
    public func coordinate<T>(readingItemAt url: URL, timeout: Duration = .seconds(30),
                              byAccessor accessor: (URL) throws -> T) throws -> T {
        let fd = open(url.path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw CoordinationError.posix(path: url.path, errno: errno) }
        defer { close(fd) }
        try Self.lock(fd, LOCK_SH, path: url.path, timeout: timeout)
        return try accessor(url)
    }

    /// Asks the file's other presenters to relinquish it (bounded), runs `accessor` while
    /// holding an exclusive claim, then lets them reacquire. A file that does not exist yet is
    /// written without a claim (nothing to race with).
    public func coordinate<T>(writingItemAt url: URL, timeout: Duration = .seconds(30),
                              byAccessor accessor: (URL) throws -> T) throws -> T {
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        let loc = MountLocation.find(url.path)
        var conn: MountConnection?
        var token = 0
        if let loc {
            let c = Self.connection(for: loc)
            try c.ensureConnected()
            conn = c
            if let presenter, let reg = Self.registry.withLock({ $0.registrations[ObjectIdentifier(presenter)] }), reg.connection === c {
                token = reg.token
                c.update(token) { $0.writing += 1 }
            }
            let r = try c.request(["op": "will-write", "token": token, "path": loc.containerPath],
                                  key: "will-write:\(loc.containerPath)", timeout: seconds)
            if r["ok"] as? Bool != true { throw CoordinationError.refused(r["error"] as? String ?? "will-write failed") }
        }
        defer {
            if let conn, let loc {
                _ = try? conn.request(["op": "did-write", "token": token, "path": loc.containerPath],
                                      key: "did-write:\(loc.containerPath)", timeout: 5)
                if token != 0 {
                    // Our own change events come after the write: drop those of the next 2 s.
                    conn.update(token) { $0.writing -= 1; $0.quietUntil = Date().addingTimeInterval(2) }
                }
            }
        }
        var fd = open(url.path, O_RDWR | O_CLOEXEC)
        if fd < 0 && (errno == EACCES || errno == EISDIR) { fd = open(url.path, O_RDONLY | O_CLOEXEC) }
        if fd < 0 {
            if errno == ENOENT { return try accessor(url) }
            throw CoordinationError.posix(path: url.path, errno: errno)
        }
        defer { close(fd) }
        try Self.lock(fd, LOCK_EX, path: url.path, timeout: timeout)
        return try accessor(url)
    }

    /// `flock` without blocking forever: retries with growing pauses until `timeout`.
    static func lock(_ fd: Int32, _ op: Int32, path: String, timeout: Duration) throws {
        let deadline = ContinuousClock.now + timeout
        var pause: Duration = .milliseconds(2)
        while flock(fd, op | LOCK_NB) != 0 {
            guard errno == EWOULDBLOCK || errno == EINTR else { throw CoordinationError.posix(path: path, errno: errno) }
            if ContinuousClock.now >= deadline {
                throw CoordinationError.timedOut(path: path, seconds: Double(timeout.components.seconds))
            }
            let ns = pause.components.attoseconds / 1_000_000_000 + pause.components.seconds * 1_000_000_000
            usleep(useconds_t(ns / 1000))
            pause = min(pause * 2, .milliseconds(50))
        }
    }
}
