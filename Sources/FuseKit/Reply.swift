import CFuse3
import Glibc

/// What `lookup`, `create`, `mkdir`… answer: a node id, its attributes and how long the kernel
/// may cache the name (`entryTimeout`) and the attributes (`attrTimeout`). A `node` of
/// `NodeID.absent` is a negative entry: the kernel caches "no such name" for `entryTimeout`.
public struct FuseEntry: Sendable {
    public var node: NodeID
    public var generation: UInt64 = 0
    public var attr: stat
    public var attrTimeout: Double
    public var entryTimeout: Double
    public init(node: NodeID, attr: stat, attrTimeout: Double, entryTimeout: Double) {
        self.node = node; self.attr = attr; self.attrTimeout = attrTimeout; self.entryTimeout = entryTimeout
    }
    var c: fuse_entry_param {
        var e = fuse_entry_param()
        e.ino = node.rawValue
        e.generation = generation
        e.attr = attr
        e.attr_timeout = attrTimeout
        e.entry_timeout = entryTimeout
        return e
    }
}

/// What `open`/`create`/`opendir` hand back to the kernel.
public struct FuseOpen: Sendable {
    public var handle: HandleID
    /// Keep the page cache across opens (content did not change behind the kernel's back).
    public var keepCache: Bool
    /// Bypass the page cache (control files whose size is not known up front).
    public var directIO: Bool
    public var nonSeekable: Bool = false
    /// A folder's listing may be kept in the kernel's cache (`FOPEN_CACHE_DIR`): later listings
    /// are served from it until the folder changes (a change through the kernel resets it; one
    /// behind its back must invalidate the folder's node, which drops the cached listing).
    public var cacheListing: Bool = false
    public init(handle: HandleID, keepCache: Bool = true, directIO: Bool = false, cacheListing: Bool = false) {
        self.handle = handle; self.keepCache = keepCache; self.directIO = directIO; self.cacheListing = cacheListing
    }
    func fill(_ fi: UnsafeMutablePointer<fuse_file_info>) {
        fi.pointee.fh = handle.rawValue
        fi.pointee.keep_cache = keepCache ? 1 : 0
        fi.pointee.direct_io = directIO ? 1 : 0
        fi.pointee.nonseekable = nonSeekable ? 1 : 0
        fi.pointee.cache_readdir = cacheListing ? 1 : 0
    }
}

/// The answer to one kernel request. It must be answered exactly once: every answering method
/// is `consuming`, and a reply that is dropped unanswered answers `EIO` in `deinit` (and says so
/// on stderr) so the calling process never hangs. It may be moved to any thread and answered
/// later (deferred replies); never answer while holding a filesystem lock.
public struct FuseReply: ~Copyable, @unchecked Sendable {
    // @unchecked: fuse_req_t is a C pointer; libfuse allows replying from any thread, and
    // ~Copyable guarantees a single owner, hence a single reply.
    // libfuse's fuse_file_info lives on the dispatching thread's stack, so a deferred reply
    // must not keep it: open/create build their own copy when they answer.
    let req: fuse_req_t

    init(_ req: fuse_req_t) {
        self.req = req
    }

    deinit {
        let msg = "nimbus: FUSE reply dropped without an answer; answering EIO\n"
        _ = msg.withCString { Glibc.write(2, $0, strlen($0)) }
        fuse_reply_err(req, Glibc.EIO)
    }

    /// The caller of the request (uid/gid/pid/umask from `fuse_req_ctx`).
    public var context: FuseContext {
        let c = fuse_req_ctx(req)!.pointee
        return FuseContext(uid: c.uid, gid: c.gid, pid: c.pid, umask: c.umask)
    }

    /// The caller's supplementary groups (`fuse_req_getgroups`, read from /proc: empty when the
    /// caller is gone or the kernel does not tell).
    public var groups: [gid_t] {
        var list = [gid_t](repeating: 0, count: 64)
        var n = fuse_req_getgroups(req, Int32(list.count), &list)
        if n > Int32(list.count) {
            list = [gid_t](repeating: 0, count: Int(n))
            n = fuse_req_getgroups(req, Int32(list.count), &list)
        }
        return n > 0 ? Array(list.prefix(Int(min(n, Int32(list.count))))) : []
    }

    /// Asks for `FuseFilesystem.interrupted(token:)` if the caller is interrupted while this
    /// request waits (it may be called at once, on this thread, if it already was).
    public func watchInterrupt(token: UInt64) {
        cfuse_watch_interrupt(req, token)
    }

    /// F_GETLK's answer.
    public consuming func lock(_ l: FuseLock) {
        let r = req; discard self
        var f = flock()
        f.l_type = l.type
        f.l_whence = Int16(SEEK_SET)
        f.l_start = off_t(clamping: l.start)
        f.l_len = off_t(clamping: l.length)
        f.l_pid = l.pid
        fuse_reply_lock(r, &f)
    }

    public consuming func error(_ e: Errno) {
        let r = req; discard self
        fuse_reply_err(r, e.rawValue)
    }
    /// Success without data (unlink, rmdir, rename, flush, release, fsync, setxattr…).
    public consuming func ok() {
        let r = req; discard self
        fuse_reply_err(r, 0)
    }
    public consuming func entry(_ e: FuseEntry) {
        let r = req; discard self
        var c = e.c
        fuse_reply_entry(r, &c)
    }
    public consuming func create(_ e: FuseEntry, _ open: FuseOpen) {
        let r = req; discard self
        var c = e.c
        var fi = fuse_file_info()
        open.fill(&fi)
        fuse_reply_create(r, &c, &fi)
    }
    public consuming func attr(_ st: stat, timeout: Double) {
        let r = req; discard self
        var s = st
        fuse_reply_attr(r, &s, timeout)
    }
    public consuming func open(_ o: FuseOpen) {
        let r = req; discard self
        var fi = fuse_file_info()
        o.fill(&fi)
        fuse_reply_open(r, &fi)
    }
    public consuming func write(count: Int) {
        let r = req; discard self
        fuse_reply_write(r, count)
    }
    /// Replies with bytes copied from memory.
    public consuming func buffer(_ p: UnsafeRawBufferPointer) {
        let r = req; discard self
        fuse_reply_buf(r, p.baseAddress?.assumingMemoryBound(to: CChar.self), p.count)
    }
    public consuming func bytes(_ a: [UInt8]) {
        let r = req; discard self
        _ = a.withUnsafeBytes { fuse_reply_buf(r, $0.baseAddress?.assumingMemoryBound(to: CChar.self), $0.count) }
    }
    /// Replies with `size` bytes of `fd` at `offset` without copying through Swift (splice).
    public consuming func data(fd: Int32, offset: Int64, size: Int) {
        let r = req; discard self
        let rc = cfuse_reply_fd(r, fd, off_t(offset), size)
        if rc != 0 { fuse_reply_err(r, -rc > 0 ? -rc : Glibc.EIO) }
    }
    public consuming func readlink(_ target: [UInt8]) {
        let r = req; discard self
        var t = target
        t.append(0)
        _ = t.withUnsafeBufferPointer { p in
            p.withMemoryRebound(to: CChar.self) { fuse_reply_readlink(r, $0.baseAddress) }
        }
    }
    public consuming func statfs(_ s: statvfs) {
        let r = req; discard self
        var st = s
        fuse_reply_statfs(r, &st)
    }
    /// The size of an xattr value or list (when the caller passed size 0).
    public consuming func xattrSize(_ n: Int) {
        let r = req; discard self
        fuse_reply_xattr(r, n)
    }
}

/// Who made a request.
public struct FuseContext: Sendable {
    public var uid: uid_t
    public var gid: gid_t
    public var pid: pid_t
    public var umask: mode_t
    public init(uid: uid_t, gid: gid_t, pid: pid_t, umask: mode_t) {
        self.uid = uid; self.gid = gid; self.pid = pid; self.umask = umask
    }
    /// The daemon itself (tests that drive the filesystem without a kernel).
    public static var process: FuseContext { FuseContext(uid: getuid(), gid: getgid(), pid: getpid(), umask: 0o022) }
}

/// Turns `length` bytes at `offset` of `fd` into holes, keeping the size (true on success).
public func punchHole(_ fd: Int32, offset: Int64, length: Int64) -> Bool {
    cfuse_punch_hole(fd, offset, length) == 0
}
