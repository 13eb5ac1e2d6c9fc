import Foundation
import FuseKit
import LocalStore
import MountPorts
import NimbusCore

/// Who creates an item: the caller of the request (pjdfstest and every multi-user tool expect
/// new files to belong to the caller, not to the daemon).
public struct Caller: Sendable {
    public var uid: UInt32
    public var gid: UInt32
    /// Supplementary groups (for permission checks the daemon makes itself: what the control
    /// files show this caller).
    public var groups: [UInt32] = []
    public init(uid: UInt32, gid: UInt32, groups: [UInt32] = []) { self.uid = uid; self.gid = gid; self.groups = groups }
    public init(_ c: FuseContext, groups: [UInt32] = []) { uid = c.uid; gid = c.gid; self.groups = groups }
    public static var process: Caller { Caller(uid: getuid(), gid: getgid()) }
}

extension ContainerFS {
    /// Inserts a new item under `parent` (lock held). The kernel already applied the umask.
    /// A folder with the set-group-ID bit passes its group (and, to folders, the bit) on.
    func insert(parent p: Node, name: String, kind: ItemKind, mode: mode_t, caller: Caller, target: String? = nil,
                special: (type: UInt32, rdev: UInt64)? = nil) throws(Errno) -> Node {
        guard p.children[name] == nil else { throw .EEXIST }
        let now = options.clock.wall()
        let node = ids.newItemNode()
        var perm = UInt32(mode) & 0o7777
        var gid = caller.gid
        if p.rec.mode & UInt32(S_ISGID) != 0 {
            gid = p.rec.gid
            if kind == .folder { perm |= UInt32(S_ISGID) }
        }
        let plain: UInt32 = switch kind {
        case .file: UInt32(S_IFREG)
        case .folder: UInt32(S_IFDIR)
        case .symlink: UInt32(S_IFLNK)
        }
        let type = special?.type ?? plain
        if kind == .symlink { perm = 0o777 }
        var rec = ItemRecord(id: options.clock.newItemID(), node: node, parent: p.rec.id, name: name, kind: kind,
                             mode: type | perm, uid: caller.uid, gid: gid, size: Int64(target?.utf8.count ?? 0),
                             time: now, target: target)
        rec.rdev = special?.rdev ?? 0
        let n = Node(rec)
        n.parentNode = p.node
        t.nodes[node] = n
        t.byID[rec.id] = node
        p.children[name] = node
        if kind == .folder { p.subdirs += 1 }
        p.rec.mtime = now
        p.rec.ctime = now
        store.enqueue(.upsert(rec))
        persist(p)
        return n
    }

    public func mkdir(parent: NodeID, name: String, mode: mode_t, caller: Caller) throws(Errno) -> FuseEntry {
        try Self.check(name: name, in: parent)
        let (e, id) = try lock.withLock { () throws(Errno) -> (FuseEntry, ItemID) in
            let n = try insert(parent: try folder(parent), name: name, kind: .folder, mode: mode, caller: caller)
            return (lookedUp(n), n.rec.id)
        }
        notify(.created(id))
        return e
    }

    public func symlink(target: [UInt8], parent: NodeID, name: String, caller: Caller) throws(Errno) -> FuseEntry {
        try Self.check(name: name, in: parent)
        guard let text = String(validating: target, as: UTF8.self) else { throw .EILSEQ }
        let (e, id) = try lock.withLock { () throws(Errno) -> (FuseEntry, ItemID) in
            let n = try insert(parent: try folder(parent), name: name, kind: .symlink, mode: 0o777, caller: caller, target: text)
            return (lookedUp(n), n.rec.id)
        }
        notify(.created(id))
        return e
    }

    /// Creates and opens a regular file. Returns the entry and the file handle (it names a
    /// descriptor of the item's cache file).
    public func create(parent: NodeID, name: String, mode: mode_t, flags: Int32, caller: Caller) throws(Errno) -> (FuseEntry, FuseOpen) {
        try Self.check(name: name, in: parent)
        let (e, id, h) = try lock.withLock { () throws(Errno) -> (FuseEntry, ItemID, HandleID) in
            let p = try folder(parent)
            guard p.children[name] == nil else { throw .EEXIST }
            let n = try insert(parent: p, name: name, kind: .file, mode: mode, caller: caller)
            let fd = store.cache.open(n.rec.id, create: true, truncate: true, fresh: true)
            if fd < 0 {
                // Roll back the insert: the cache is unusable (disk full, permissions).
                p.children[name] = nil
                t.nodes[n.node] = nil
                t.byID[n.rec.id] = nil
                store.enqueue(.delete(n.rec.id))
                throw Errno(-fd)
            }
            noteCreated(n, folder: p.node, name: name)
            let h = ids.newHandle(.file(fd))
            n.openHandles += 1
            n.handles.insert(h)
            n.writers += 1
            t.writerHandles.insert(h)
            t.openFiles += 1
            return (lookedUp(n), n.rec.id, h)
        }
        notify(.created(id))
        return (e, FuseOpen(handle: h, keepCache: true))
    }

    /// Regular files only: a synced folder cannot hold device nodes, FIFOs or sockets (EPERM, the
    /// errno of a filesystem that does not support the node type; see docs/mount.md).
    public func mknod(parent: NodeID, name: String, mode: mode_t, rdev: UInt64 = 0, caller: Caller) throws(Errno) -> FuseEntry {
        let type = mode & S_IFMT
        if [S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK].contains(type) {
            return try mknodSpecial(parent: parent, name: name, mode: mode, rdev: type == S_IFCHR || type == S_IFBLK ? rdev : 0, caller: caller)
        }
        guard type == S_IFREG || type == 0 else { throw .EINVAL }
        try Self.check(name: name, in: parent)
        let (e, id) = try lock.withLock { () throws(Errno) -> (FuseEntry, ItemID) in
            let n = try insert(parent: try folder(parent), name: name, kind: .file, mode: mode, caller: caller)
            let fd = store.cache.open(n.rec.id, create: true, truncate: true)
            if fd >= 0 { close(fd) }
            return (lookedUp(n), n.rec.id)
        }
        notify(.created(id))
        return e
    }

    /// A FIFO, socket or device node: a local-only item (docs/posix.md "Local-only items"). It
    /// has no content file; the kernel serves its opens itself (a pipe, a socket, the device's
    /// driver). The sync engine hears of it like any item and keeps it here.
    func mknodSpecial(parent: NodeID, name: String, mode: mode_t, rdev: UInt64, caller: Caller) throws(Errno) -> FuseEntry {
        try Self.check(name: name, in: parent)
        let (e, id) = try lock.withLock { () throws(Errno) -> (FuseEntry, ItemID) in
            let n = try insert(parent: try folder(parent), name: name, kind: .file, mode: mode, caller: caller,
                               special: (UInt32(mode & S_IFMT), rdev))
            return (lookedUp(n), n.rec.id)
        }
        notify(.created(id))
        return e
    }
}
