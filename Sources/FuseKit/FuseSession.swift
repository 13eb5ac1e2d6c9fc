import CFuse3
import CFuseIO
import Dispatch
import Glibc

/// Mount options the daemon asks for; see mount.fuse3(8).
public struct FuseMountOptions: Sendable {
    public var fsName = "nimbus"
    public var subtype = "nimbus"
    /// Let other users (and root) use the mount; needs root or `user_allow_other` in /etc/fuse.conf.
    public var allowOther = false
    /// The kernel checks permissions from the mode bits we report (POSIX semantics for free).
    public var defaultPermissions = true
    /// Remove the mount when the daemon dies (kill -9): needs fusermount3 to stay around.
    public var autoUnmount = false
    public var extra: [String] = []
    /// The filesystem clears set-user-ID and set-group-ID bits itself on write, truncate and
    /// chown (FUSE_HANDLE_KILLPRIV_V2), so the kernel need not ask for `security.capability`
    /// before every write.
    public var handlesKillPriv = false
    public init() {}

    var optionString: String {
        var o = ["fsname=\(fsName)", "subtype=\(subtype)"]
        if allowOther { o.append("allow_other") }
        if defaultPermissions { o.append("default_permissions") }
        if autoUnmount { o.append("auto_unmount") }
        return (o + extra).joined(separator: ",")
    }
}

public struct FuseError: Error, CustomStringConvertible {
    public let description: String
}

/// One mounted low-level session. `run()` blocks in libfuse's multi-threaded loop (its own
/// pthreads) until the filesystem is unmounted (`fusermount3 -u`) or `exit()` is called; then it
/// unmounts and destroys the session.
///
/// Thread-safety: `session` is set once in `init` and cleared only by `run()` after the loop has
/// returned and every worker thread has stopped; notifications must not be sent after that
/// (`alive` guards it).
public final class FuseSession: @unchecked Sendable {
    // @unchecked: the C session pointer is used from worker threads per libfuse's rules above.
    public let filesystem: any FuseFilesystem
    public let mountpoint: String
    /// What the kernel asked of this session so far, by kind.
    public let requests = FuseRequestCounts()
    private var session: OpaquePointer?
    private var loopThread: pthread_t?
    private let aliveLock = NSLockLite()
    private var alive = false

    public init(filesystem: any FuseFilesystem, mountpoint: String, options: FuseMountOptions) throws {
        self.filesystem = filesystem
        self.mountpoint = mountpoint
        var ops = makeOperations()
        let argv = ["nimbus", "-o", options.optionString]
        var cargs = argv.map { strdup($0) }
        defer { cargs.forEach { free($0) } }
        var args = fuse_args(argc: Int32(cargs.count), argv: nil, allocated: 0)
        let se: OpaquePointer? = cargs.withUnsafeMutableBufferPointer { buf in
            args.argv = buf.baseAddress
            return cfuse_session_new(&args, &ops, Unmanaged.passUnretained(self).toOpaque())
        }
        guard let se else { throw FuseError(description: "fuse_session_new failed (options: \(options.optionString))") }
        if fuse_session_mount(se, mountpoint) != 0 {
            fuse_session_destroy(se)
            throw FuseError(description: "cannot mount on \(mountpoint) (is /dev/fuse usable, and the mountpoint an empty directory?)")
        }
        let io = cfuse_session_install_io(se, options.handlesKillPriv ? 1 : 0)
        if io != 0 {
            fuse_session_unmount(se)
            fuse_session_destroy(se)
            throw FuseError(description: "cannot set up the request channel on \(mountpoint) (error \(-io))")
        }
        session = se
        alive = true
    }

    /// Serves requests until unmounted or `exit()`; returns libfuse's loop result.
    /// Call on a dedicated thread (never a Swift-concurrency thread: it blocks).
    public func run(maxIdleThreads: UInt32 = 16, maxThreads: UInt32 = 64) -> Int32 {
        guard let se = session else { return -EINVAL }
        loopThread = pthread_self()
        cfuse_prepare_wakeup_signal()
        // Keep `self` alive while libfuse holds the unretained userdata pointer.
        let rc = withExtendedLifetime(self) { cfuse_session_loop_mt(se, maxIdleThreads, maxThreads) }
        aliveLock.withLock { alive = false }
        fuse_session_unmount(se)
        fuse_session_destroy(se)
        session = nil
        return rc
    }

    /// Makes `run()` return: sets libfuse's exit flag and wakes the loop thread
    /// (libfuse's own signal handlers are unreliable on a background thread).
    public func exit() {
        aliveLock.withLock {
            guard alive, let se = session else { return }
            fuse_session_exit(se)
            if let t = loopThread { pthread_kill(t, SIGUSR2) }
        }
    }

    /// Routes SIGINT, SIGTERM and SIGHUP to `exit()`. Dispatch sources on a global queue; must
    /// not be called from main-actor code paths that capture isolated state.
    public nonisolated func exitOnSignals() -> [any DispatchSourceSignal] {
        [SIGINT, SIGTERM, SIGHUP].map { sig in
            signal(sig, SIG_IGN)
            let src = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            src.setEventHandler { [weak self] in self?.exit() }
            src.resume()
            return src
        }
    }

    // MARK: kernel cache notifications. Never call them while holding a lock that a request
    // handler for the same node may need: the kernel may wait on that request.

    /// Drops cached attributes and (for `length` 0 = all) cached pages of `node`.
    @discardableResult
    public func invalidateNode(_ node: NodeID, offset: Int64 = 0, length: Int64 = 0) -> Int32 {
        withSession { fuse_lowlevel_notify_inval_inode($0, node.rawValue, off_t(offset), off_t(length)) }
    }
    /// Fills the kernel's pages of `node` over `offset..<offset+length` with those bytes of `fd`
    /// (the file's content): pages a write covered only in part are then whole in the kernel, and
    /// a read of them asks nothing. Waits for those pages' locks: never while a request that
    /// holds them waits for the caller.
    @discardableResult
    public func storePages(_ node: NodeID, fd: Int32, offset: Int64, length: Int) -> Int32 {
        withSession { cfuse_notify_store_fd($0, node.rawValue, fd, off_t(offset), length) }
    }
    /// Drops the cached name `name` in folder `parent` (remote create, rename, delete).
    @discardableResult
    public func invalidateEntry(parent: NodeID, name: String) -> Int32 {
        withSession { se in name.withCString { fuse_lowlevel_notify_inval_entry(se, parent.rawValue, $0, strlen($0)) } }
    }
    /// Tells the kernel that `name` in `parent` (node `child`) is gone (also closes inotify watches).
    @discardableResult
    public func notifyDelete(parent: NodeID, child: NodeID, name: String) -> Int32 {
        withSession { se in name.withCString { fuse_lowlevel_notify_delete(se, parent.rawValue, child.rawValue, $0, strlen($0)) } }
    }

    private func withSession(_ body: (OpaquePointer) -> Int32) -> Int32 {
        aliveLock.withLock { alive ? session.map(body) ?? -ENOTCONN : -ENOTCONN }
    }
}

/// A tiny pthread mutex (FuseKit does not import Foundation or Synchronization).
final class NSLockLite: @unchecked Sendable {
    // @unchecked: the pthread mutex is the synchronization.
    private var m = pthread_mutex_t()
    init() { pthread_mutex_init(&m, nil) }
    deinit { pthread_mutex_destroy(&m) }
    func withLock<T>(_ body: () throws -> T) rethrows -> T {
        pthread_mutex_lock(&m)
        defer { pthread_mutex_unlock(&m) }
        return try body()
    }
}
