import CFuse3
import Glibc

/// Attributes to change in `setattr`; `nil` fields stay as they are.
public struct FuseSetAttr: Sendable {
    public enum Time: Sendable, Equatable { case now, at(timespec) }
    public var mode: mode_t?
    public var uid: uid_t?
    public var gid: gid_t?
    public var size: Int64?
    public var atime: Time?
    public var mtime: Time?
    public var ctime: timespec?
    /// The kernel asks the filesystem to clear the set-user-ID bit, and the set-group-ID bit of
    /// a group-executable file (a truncate by a caller without CAP_FSETID, under
    /// FUSE_HANDLE_KILLPRIV_V2).
    public var killSetID = false
    public init() {}
}

extension timespec: @retroactive Equatable {
    public static func == (a: timespec, b: timespec) -> Bool { a.tv_sec == b.tv_sec && a.tv_nsec == b.tv_nsec }
}

/// The rename flags of renameat2(2).
public struct RenameFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    public static let noReplace = RenameFlags(rawValue: 1)
    public static let exchange = RenameFlags(rawValue: 2)
    public static let whiteout = RenameFlags(rawValue: 4)
}

/// A byte-range lock as fcntl(2) describes it (`struct flock`): `type` is F_RDLCK, F_WRLCK or
/// F_UNLCK; `length` 0 means "to the end of the file".
public struct FuseLock: Sendable, Equatable {
    public var type: Int16
    public var start: UInt64
    public var length: UInt64
    public var pid: Int32
    public init(type: Int16, start: UInt64, length: UInt64, pid: Int32) {
        self.type = type; self.start = start; self.length = length; self.pid = pid
    }
}

/// One kernel directory listing chunk: fills libfuse's dirent format into a buffer of the size
/// the kernel asked for. `add` returns false when the entry does not fit (stop there; the kernel
/// will ask again from that entry's offset).
public struct DirectoryBuffer: ~Copyable {
    let req: fuse_req_t
    let plus: Bool
    let capacity: Int
    let base: UnsafeMutablePointer<CChar>
    public private(set) var used = 0

    init(req: fuse_req_t, capacity: Int, plus: Bool) {
        self.req = req
        self.capacity = capacity
        self.plus = plus
        base = .allocate(capacity: max(capacity, 1))
    }
    deinit { base.deallocate() }

    /// Bytes left for entries.
    public var room: Int { capacity - used }

    /// The bytes an entry named `nameBytes` long takes in a listing (the kernel's `fuse_dirent`
    /// or, with `plus`, `fuse_direntplus`: a fixed header, the name, padding to 8 bytes).
    public static func entrySize(nameBytes: Int, plus: Bool) -> Int {
        let header = plus ? 24 + 128 : 24  // FUSE_NAME_OFFSET (+ struct fuse_entry_out)
        return (header + nameBytes + 7) & ~7
    }

    /// - Parameters: `nextOffset` is the offset of the entry *after* this one.
    public mutating func add(name: String, entry: FuseEntry, nextOffset: Int64) -> Bool {
        let room = capacity - used
        let n: Int = name.withCString { cname in
            if plus {
                var e = entry.c
                return fuse_add_direntry_plus(req, base + used, room, cname, &e, off_t(nextOffset))
            } else {
                var st = entry.attr
                return fuse_add_direntry(req, base + used, room, cname, &st, off_t(nextOffset))
            }
        }
        if n > room { return false }
        assert(n == Self.entrySize(nameBytes: name.utf8.count, plus: plus), "FUSE dirent size changed")
        used += n
        return true
    }

    var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: used) }
}

/// A filesystem served through the low-level API. Every method receives the reply it must
/// answer exactly once, possibly later and from another thread. Requests arrive on libfuse's
/// worker threads (plain pthreads), concurrently. Defaults answer `ENOSYS`.
public protocol FuseFilesystem: AnyObject, Sendable {
    func initialize(capabilities: UInt32)
    func destroy()
    func lookup(parent: NodeID, name: String, reply: consuming FuseReply)
    func forget(node: NodeID, count: UInt64)
    func getattr(node: NodeID, handle: HandleID?, reply: consuming FuseReply)
    func setattr(node: NodeID, _ changes: FuseSetAttr, handle: HandleID?, reply: consuming FuseReply)
    func readlink(node: NodeID, reply: consuming FuseReply)
    func mknod(parent: NodeID, name: String, mode: mode_t, rdev: dev_t, reply: consuming FuseReply)
    func mkdir(parent: NodeID, name: String, mode: mode_t, reply: consuming FuseReply)
    func unlink(parent: NodeID, name: String, reply: consuming FuseReply)
    func rmdir(parent: NodeID, name: String, reply: consuming FuseReply)
    func symlink(target: [UInt8], parent: NodeID, name: String, reply: consuming FuseReply)
    func rename(parent: NodeID, name: String, newParent: NodeID, newName: String, flags: RenameFlags, reply: consuming FuseReply)
    func link(node: NodeID, newParent: NodeID, newName: String, reply: consuming FuseReply)
    func open(node: NodeID, flags: Int32, reply: consuming FuseReply)
    func create(parent: NodeID, name: String, mode: mode_t, flags: Int32, reply: consuming FuseReply)
    func read(node: NodeID, handle: HandleID, offset: Int64, size: Int, reply: consuming FuseReply)
    func write(node: NodeID, handle: HandleID, offset: Int64, data: UnsafeRawBufferPointer, reply: consuming FuseReply)
    func flush(node: NodeID, handle: HandleID, reply: consuming FuseReply)
    func release(node: NodeID, handle: HandleID, reply: consuming FuseReply)
    func fsync(node: NodeID, handle: HandleID, dataOnly: Bool, reply: consuming FuseReply)
    func fallocate(node: NodeID, handle: HandleID, mode: Int32, offset: Int64, length: Int64, reply: consuming FuseReply)
    func opendir(node: NodeID, reply: consuming FuseReply)
    func readdir(node: NodeID, handle: HandleID, offset: Int64, into buffer: inout DirectoryBuffer, plus: Bool) -> Errno?
    func releasedir(node: NodeID, handle: HandleID, reply: consuming FuseReply)
    func fsyncdir(node: NodeID, handle: HandleID, reply: consuming FuseReply)
    func statfs(node: NodeID, reply: consuming FuseReply)
    func setxattr(node: NodeID, name: String, value: UnsafeRawBufferPointer, flags: Int32, reply: consuming FuseReply)
    /// `size` 0 asks for the value's size (`reply.xattrSize`); otherwise answer the bytes or `ERANGE`.
    func getxattr(node: NodeID, name: String, size: Int, reply: consuming FuseReply)
    func listxattr(node: NodeID, size: Int, reply: consuming FuseReply)
    func removexattr(node: NodeID, name: String, reply: consuming FuseReply)

    /// Whether the kernel should send fcntl and flock locks here (else it keeps them itself).
    var handlesLocks: Bool { get }
    /// F_GETLK: answer `reply.lock` with the first conflicting lock, or the request with F_UNLCK.
    func getlk(node: NodeID, handle: HandleID, owner: UInt64, lock: FuseLock, reply: consuming FuseReply)
    /// F_SETLK / F_SETLKW (`wait`): answer ok, EAGAIN, EDEADLK or EINTR (see `FuseReply.watchInterrupt`).
    func setlk(node: NodeID, handle: HandleID, owner: UInt64, lock: FuseLock, wait: Bool, reply: consuming FuseReply)
    /// flock(2): `operation` is LOCK_SH, LOCK_EX or LOCK_UN, with LOCK_NB when not waiting.
    func flock(node: NodeID, handle: HandleID, owner: UInt64, operation: Int32, reply: consuming FuseReply)
    /// The locks of `owner` on `node` end: its POSIX locks at a close (`flush`), or its flock
    /// lock when the last descriptor of an open file description goes (`flock: true`). Called
    /// before `flush` / `release`.
    func releaseLocks(node: NodeID, owner: UInt64, flock: Bool)
    /// A request registered with `FuseReply.watchInterrupt(token)` was interrupted by a signal.
    func interrupted(token: UInt64)
}

extension FuseFilesystem {
    public func initialize(capabilities: UInt32) {}
    public func destroy() {}
    public func forget(node: NodeID, count: UInt64) {}
    public func lookup(parent: NodeID, name: String, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func getattr(node: NodeID, handle: HandleID?, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func setattr(node: NodeID, _ changes: FuseSetAttr, handle: HandleID?, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func readlink(node: NodeID, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func mknod(parent: NodeID, name: String, mode: mode_t, rdev: dev_t, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func mkdir(parent: NodeID, name: String, mode: mode_t, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func unlink(parent: NodeID, name: String, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func rmdir(parent: NodeID, name: String, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func symlink(target: [UInt8], parent: NodeID, name: String, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func rename(parent: NodeID, name: String, newParent: NodeID, newName: String, flags: RenameFlags, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func link(node: NodeID, newParent: NodeID, newName: String, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func open(node: NodeID, flags: Int32, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func create(parent: NodeID, name: String, mode: mode_t, flags: Int32, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func read(node: NodeID, handle: HandleID, offset: Int64, size: Int, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func write(node: NodeID, handle: HandleID, offset: Int64, data: UnsafeRawBufferPointer, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func flush(node: NodeID, handle: HandleID, reply: consuming FuseReply) { reply.ok() }
    public func release(node: NodeID, handle: HandleID, reply: consuming FuseReply) { reply.ok() }
    public func fsync(node: NodeID, handle: HandleID, dataOnly: Bool, reply: consuming FuseReply) { reply.ok() }
    public func fallocate(node: NodeID, handle: HandleID, mode: Int32, offset: Int64, length: Int64, reply: consuming FuseReply) { reply.error(.EOPNOTSUPP) }
    public func opendir(node: NodeID, reply: consuming FuseReply) { reply.open(FuseOpen(handle: .absent)) }
    public func readdir(node: NodeID, handle: HandleID, offset: Int64, into buffer: inout DirectoryBuffer, plus: Bool) -> Errno? { .ENOSYS }
    public func releasedir(node: NodeID, handle: HandleID, reply: consuming FuseReply) { reply.ok() }
    public func fsyncdir(node: NodeID, handle: HandleID, reply: consuming FuseReply) { reply.ok() }
    public func statfs(node: NodeID, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func setxattr(node: NodeID, name: String, value: UnsafeRawBufferPointer, flags: Int32, reply: consuming FuseReply) { reply.error(.ENOTSUP) }
    public func getxattr(node: NodeID, name: String, size: Int, reply: consuming FuseReply) { reply.error(.ENODATA) }
    public func listxattr(node: NodeID, size: Int, reply: consuming FuseReply) { reply.xattrSize(0) }
    public func removexattr(node: NodeID, name: String, reply: consuming FuseReply) { reply.error(.ENODATA) }
    public var handlesLocks: Bool { false }
    public func getlk(node: NodeID, handle: HandleID, owner: UInt64, lock: FuseLock, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func setlk(node: NodeID, handle: HandleID, owner: UInt64, lock: FuseLock, wait: Bool, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func flock(node: NodeID, handle: HandleID, owner: UInt64, operation: Int32, reply: consuming FuseReply) { reply.error(.ENOSYS) }
    public func releaseLocks(node: NodeID, owner: UInt64, flock: Bool) {}
    public func interrupted(token: UInt64) {}
}
