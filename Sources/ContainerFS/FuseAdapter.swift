import FuseKit
import Glibc
import MountPorts
import NimbusCore
import Synchronization

/// Maps kernel requests onto `ContainerFS`: decode, call, reply. The only file that knows both.
/// Every method answers its reply exactly once, after the filesystem call returned (so no
/// filesystem lock is held while replying).
///
/// Each request's node or handle id is resolved once (`ContainerFS.ids`) to its owner, which
/// answers it: the tree's item operations (`ContainerFS`), `.nimbus/` (`ControlFS`) or
/// `.nimbus/versions/` (`VersionsFS`). Everything in `.nimbus/` is read-only: a change asked
/// there is EPERM (`rm` of a conflict entry of `.nimbus/versions/` aside).
public final class FuseAdapter: FuseFilesystem {
    public let fs: ContainerFS

    public init(_ fs: ContainerFS) { self.fs = fs }

    public func lookup(parent: NodeID, name: String, reply: consuming FuseReply) {
        let found: FuseEntry
        do {
            switch fs.ids.owner(of: parent) {
            case .item: found = try fs.lookup(parent: parent, name: name)
            case .control(let f): found = try fs.control.lookup(in: f, name: name)
            case .versions(let v): return lookupVersions(v, name: name, reply: reply)
            case .trash(let t): return lookupTrash(t, name: name, reply: reply)
            }
        } catch .ENOENT {
            // A negative entry the kernel may cache: repeated misses (build tools, shells)
            // do not come back to us.
            return reply.entry(FuseEntry(node: .absent, attr: stat(), attrTimeout: 0, entryTimeout: fs.options.negativeTimeout))
        } catch { return reply.error(error) }
        reply.entry(found)
    }

    private func lookupVersions(_ v: VersionsFS.VNode, name: String, reply: consuming FuseReply) {
        let box = ReplyBox(reply)
        let negative = fs.options.controlTimeout
        fs.versions.lookup(parent: v, name: name) { r in
            guard let reply = box.take() else { return }
            switch r {
            case .success(let e): reply.entry(e)
            case .failure(.ENOENT): reply.entry(FuseEntry(node: .absent, attr: stat(), attrTimeout: 0, entryTimeout: negative))
            case .failure(let e): reply.error(e)
            }
        }
    }

    private func lookupTrash(_ t: TrashFS.TNode, name: String, reply: consuming FuseReply) {
        let box = ReplyBox(reply)
        let negative = fs.options.controlTimeout
        fs.trash.lookup(parent: t, name: name) { r in
            guard let reply = box.take() else { return }
            switch r {
            case .success(let e): reply.entry(e)
            case .failure(.ENOENT): reply.entry(FuseEntry(node: .absent, attr: stat(), attrTimeout: 0, entryTimeout: negative))
            case .failure(let e): reply.error(e)
            }
        }
    }

    /// The kernel forgets nodes of `.nimbus/` too; theirs stay numbered for the mount's life.
    public func forget(node: NodeID, count: UInt64) {
        if case .item = fs.ids.owner(of: node) { fs.forget(node: node, count: count) }
    }

    public func getattr(node: NodeID, handle: HandleID?, reply: consuming FuseReply) {
        if case .trash(let t) = fs.ids.owner(of: node) {
            let box = ReplyBox(reply)
            let timeout = fs.options.controlTimeout
            return fs.trash.attr(t) { r in
                guard let reply = box.take() else { return }
                switch r {
                case .success(let st): reply.attr(st, timeout: timeout)
                case .failure(let e): reply.error(e)
                }
            }
        }
        do throws(Errno) {
            let (st, timeout) = switch fs.ids.owner(of: node) {
            case .item: (try fs.getattr(node: node), fs.options.attrTimeout)
            case .control(let f): (fs.control.attr(f), fs.options.controlTimeout)
            case .versions(let v): (try fs.versions.attr(v), fs.options.controlTimeout)
            case .trash: throw .ENOENT  // answered above
            }
            reply.attr(st, timeout: timeout)
        } catch { reply.error(error) }
    }

    public func setattr(node: NodeID, _ changes: FuseSetAttr, handle: HandleID?, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: node) else { return reply.error(.EPERM) }
        // truncate(2) of a placeholder to a non-zero size keeps bytes: download them first.
        if let size = changes.size, size > 0, let id = fs.placeholder(node: node, range: 0..<Int64.max) {
            let fs = self.fs
            return afterDownload(id, node: node, reply) { r in
                switch Result(catching: { () throws(Errno) in try fs.setattr(node: node, changes, handle: handle) }) {
                case .success(let st): r.attr(st, timeout: fs.options.attrTimeout)
                case .failure(let e): r.error(e)
                }
            }
        }
        do { reply.attr(try fs.setattr(node: node, changes, handle: handle), timeout: fs.options.attrTimeout) } catch { reply.error(error) }
    }

    public func readlink(node: NodeID, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: node) else { return reply.error(.EINVAL) }  // `.nimbus/` holds no symlinks
        do { reply.readlink(try fs.readlink(node: node)) } catch { reply.error(error) }
    }

    public func mknod(parent: NodeID, name: String, mode: mode_t, rdev: dev_t, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: parent) else { return reply.error(.EPERM) }
        let caller = Caller(reply.context)
        do { reply.entry(try fs.mknod(parent: parent, name: name, mode: mode, rdev: UInt64(rdev), caller: caller)) } catch { reply.error(error) }
    }

    public func mkdir(parent: NodeID, name: String, mode: mode_t, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: parent) else { return reply.error(.EPERM) }
        let caller = Caller(reply.context)
        do { reply.entry(try fs.mkdir(parent: parent, name: name, mode: mode, caller: caller)) } catch { reply.error(error) }
    }

    public func symlink(target: [UInt8], parent: NodeID, name: String, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: parent) else { return reply.error(.EPERM) }
        let caller = Caller(reply.context)
        do { reply.entry(try fs.symlink(target: target, parent: parent, name: name, caller: caller)) } catch { reply.error(error) }
    }

    public func create(parent: NodeID, name: String, mode: mode_t, flags: Int32, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: parent) else { return reply.error(.EPERM) }
        let caller = Caller(reply.context)
        do {
            let (e, o) = try fs.create(parent: parent, name: name, mode: mode, flags: flags, caller: caller)
            reply.create(e, o)
        } catch { reply.error(error) }
    }

    public func unlink(parent: NodeID, name: String, reply: consuming FuseReply) {
        switch fs.ids.owner(of: parent) {
        case .item: break
        case .control: return reply.error(.EPERM)
        case .versions(let v):
            let box = ReplyBox(reply)
            return fs.versions.unlink(parent: v, name: name) { e in
                guard let reply = box.take() else { return }
                if let e { reply.error(e) } else { reply.ok() }
            }
        case .trash(let t): return removeTrash(t, name: name, folder: false, reply: reply)
        }
        do { try fs.unlink(parent: parent, name: name); reply.ok() } catch { reply.error(error) }
    }

    /// `rm` / `rmdir` of a Recently Deleted entry purges it (deferred: asks the server).
    private func removeTrash(_ t: TrashFS.TNode, name: String, folder: Bool, reply: consuming FuseReply) {
        let box = ReplyBox(reply)
        fs.trash.remove(parent: t, name: name, folder: folder) { e in
            guard let reply = box.take() else { return }
            if let e { reply.error(e) } else { reply.ok() }
        }
    }

    public func rmdir(parent: NodeID, name: String, reply: consuming FuseReply) {
        if case .trash(let t) = fs.ids.owner(of: parent) { return removeTrash(t, name: name, folder: true, reply: reply) }
        guard case .item = fs.ids.owner(of: parent) else { return reply.error(.EPERM) }
        do { try fs.rmdir(parent: parent, name: name); reply.ok() } catch { reply.error(error) }
    }

    public func rename(parent: NodeID, name: String, newParent: NodeID, newName: String, flags: RenameFlags, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: parent), case .item = fs.ids.owner(of: newParent) else { return reply.error(.EPERM) }
        do { try fs.rename(parent: parent, name: name, newParent: newParent, newName: newName, flags: flags); reply.ok() } catch { reply.error(error) }
    }

    public func link(node: NodeID, newParent: NodeID, newName: String, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: node), case .item = fs.ids.owner(of: newParent) else { return reply.error(.EPERM) }
        // The names of a file share its content here: a placeholder's is downloaded first.
        if let id = fs.linkNeedsContent(node) {
            let fs = self.fs
            return afterDownload(id, node: node, reply) { r in
                switch Result(catching: { () throws(Errno) in try fs.link(node: node, newParent: newParent, newName: newName) }) {
                case .success(let e): r.entry(e)
                case .failure(let e): r.error(e)
                }
            }
        }
        do { reply.entry(try fs.link(node: node, newParent: newParent, newName: newName)) } catch { reply.error(error) }
    }

    public func open(node: NodeID, flags: Int32, reply: consuming FuseReply) {
        switch fs.ids.owner(of: node) {
        case .item: break
        case .control(let f):
            // What a control file shows depends on who reads it (ContainerFS+Access.swift).
            do { reply.open(try fs.control.open(f, flags: flags, caller: Caller(reply.context, groups: reply.groups))) } catch { reply.error(error) }
            return
        case .trash(let t):
            let box = ReplyBox(reply)
            return fs.trash.open(t, flags: flags) { r in
                guard let reply = box.take() else { return }
                switch r {
                case .success(let o): reply.open(o)
                case .failure(let e): reply.error(e)
                }
            }
        case .versions(let v):
            let box = ReplyBox(reply)
            return fs.versions.open(v, flags: flags) { r in
                guard let reply = box.take() else { return }
                switch r {
                case .success(let o): reply.open(o)
                case .failure(let e): reply.error(e)
                }
            }
        }
        // Writing into a placeholder: download it all first, so local bytes are never mixed
        // with holes a later download would fill (O_TRUNC needs nothing: the bytes go anyway).
        if flags & O_ACCMODE != O_RDONLY, flags & O_TRUNC == 0, let id = fs.placeholder(node: node, range: 0..<Int64.max) {
            let fs = self.fs
            return afterDownload(id, node: node, reply) { r in
                switch Result(catching: { () throws(Errno) in try fs.open(node: node, flags: flags) }) {
                case .success(let o): r.open(o)
                case .failure(let e): r.error(e)
                }
            }
        }
        let kill = flags & O_TRUNC != 0 && reply.context.uid != 0
        do { reply.open(try fs.open(node: node, flags: flags, killSetID: kill)) } catch { reply.error(error) }
    }

    /// File reads splice from the cache file: no filesystem lock (the handle resolves in the id
    /// table), no Swift allocation.
    public func read(node: NodeID, handle: HandleID, offset: Int64, size: Int, reply: consuming FuseReply) {
        let fd: Int32
        switch fs.ids.owner(ofHandle: handle) {
        case .file(let d)?: fd = d
        case .listing?, nil: return reply.error(.EBADF)
        case .control?:
            do { reply.bytes(try fs.control.read(handle: handle, offset: offset, size: size)) } catch { reply.error(error) }
            return
        case .trash?:
            let box = ReplyBox(reply)
            return fs.trash.read(handle: handle, offset: offset, size: size) { r in
                guard let reply = box.take() else { return }
                switch r {
                case .success(let b): reply.bytes(b)
                case .failure(let e): reply.error(e)
                }
            }
        case .versions?:
            // Streamed from the server (deferred): the bytes of the chunks the range covers.
            let box = ReplyBox(reply)
            return fs.versions.read(handle: handle, offset: offset, size: size) { r in
                guard let reply = box.take() else { return }
                switch r {
                case .success(let b): reply.bytes(b)
                case .failure(let e): reply.error(e)
                }
            }
        }
        // (The kernel sends no negative or overflowing range; a bad one is EINVAL, not a trap.)
        guard offset >= 0, size >= 0, offset <= Int64.max - Int64(size) else { return reply.error(.EINVAL) }
        // A placeholder: the reply waits (deferred, off this thread) until the provider has put
        // the covering bytes into the cache file, or fails with its errno — never hangs.
        switch fs.readPlan(node: node, handle: handle, range: offset..<(offset + Int64(size))) {
        case .direct: break
        case .fail(let e): return reply.error(e)
        case .hydrate(let id):
            if fs.refusesDownload(pid: reply.context.pid, node: node) { return reply.error(.EACCES) }
            let box = ReplyBox(reply)
            let fs = self.fs
            fs.content.hydrate(id, range: offset..<(offset + Int64(size))) { error in
                guard let r = box.take() else { return }
                // Replaced by a remote version while waiting: this handle reads the old bytes.
                if let error = error ?? fs.staleReadError(handle: handle, range: offset..<(offset + Int64(size))) {
                    r.error(error)
                } else {
                    r.data(fd: fd, offset: offset, size: size)
                }
            }
            return
        }
        reply.data(fd: fd, offset: offset, size: size)
    }

    public func write(node: NodeID, handle: HandleID, offset: Int64, data: UnsafeRawBufferPointer, reply: consuming FuseReply) {
        // Only root keeps set-ID bits through a write (the kernel's CAP_FSETID test, which the
        // request does not carry).
        let kill = reply.context.uid != 0
        do { reply.write(count: try fs.write(node: node, handle: handle, offset: offset, data: data, killSetID: kill)) } catch { reply.error(error) }
    }

    public func flush(node: NodeID, handle: HandleID, reply: consuming FuseReply) {
        fs.flush(node: node, handle: handle)
        reply.ok()
    }

    public func release(node: NodeID, handle: HandleID, reply: consuming FuseReply) {
        switch fs.ids.owner(ofHandle: handle) {
        case .file?: fs.release(node: node, handle: handle)
        case .control?: fs.control.release(handle: handle)
        case .versions?: fs.versions.release(handle: handle)
        case .trash?: fs.trash.release(handle: handle)
        case .listing?, nil: break
        }
        reply.ok()
    }

    public func fsync(node: NodeID, handle: HandleID, dataOnly: Bool, reply: consuming FuseReply) {
        do { try fs.fsync(node: node, handle: handle, dataOnly: dataOnly); reply.ok() } catch { reply.error(error) }
    }

    public func fallocate(node: NodeID, handle: HandleID, mode: Int32, offset: Int64, length: Int64, reply: consuming FuseReply) {
        do { try fs.fallocate(node: node, handle: handle, mode: mode, offset: offset, length: length); reply.ok() } catch { reply.error(error) }
    }

    public func opendir(node: NodeID, reply: consuming FuseReply) {
        let h: HandleID
        do {
            switch fs.ids.owner(of: node) {
            case .item: return reply.open(try fs.openListing(node: node))
            case .control(let f): h = try fs.control.opendir(f)
            case .versions(let v): return opendirVersions(v, reply: reply)
            case .trash(let t): return opendirTrash(t, node: node, reply: reply)
            }
        } catch { return reply.error(error) }
        reply.open(FuseOpen(handle: h, keepCache: false))
    }

    /// A listing of `.nimbus/trash/` asks the server (deferred). ".." of an entry's folder is
    /// given as the folder itself (the kernel takes nothing from dot entries but their type).
    private func opendirTrash(_ t: TrashFS.TNode, node: NodeID, reply: consuming FuseReply) {
        let box = ReplyBox(reply)
        let up = t == .folder("/") ? fs.ids.node(of: .control(.folder)) : node
        fs.trash.opendir(t, parent: up) { r in
            guard let reply = box.take() else { return }
            switch r {
            case .success(let h): reply.open(FuseOpen(handle: h, keepCache: false))
            case .failure(let e): reply.error(e)
            }
        }
    }

    /// A listing of `.nimbus/versions/` may ask the server (deferred).
    private func opendirVersions(_ v: VersionsFS.VNode, reply: consuming FuseReply) {
        let box = ReplyBox(reply)
        fs.versions.opendir(v) { r in
            guard let reply = box.take() else { return }
            switch r {
            case .success(let h): reply.open(FuseOpen(handle: h, keepCache: false))
            case .failure(let e): reply.error(e)
            }
        }
    }

    public func readdir(node: NodeID, handle: HandleID, offset: Int64, into buffer: inout DirectoryBuffer, plus: Bool) -> Errno? {
        do throws(Errno) {
            let entries = switch fs.ids.owner(ofHandle: handle) {
            case .listing?: try fs.readdir(node: node, handle: handle, offset: offset, plus: plus, room: buffer.room)
            case .control?: try fs.control.readdir(handle: handle, offset: offset, plus: plus, room: buffer.room)
            case .versions?: try fs.versions.readdir(handle: handle, offset: offset, plus: plus, room: buffer.room)
            case .trash?: try fs.trash.readdir(handle: handle, offset: offset, plus: plus, room: buffer.room)
            case .file?, nil: throw .EBADF
            }
            for e in entries {
                guard buffer.add(name: e.name, entry: e.entry, nextOffset: e.nextOffset) else { break }
            }
            return nil
        } catch { return error }
    }

    public func releasedir(node: NodeID, handle: HandleID, reply: consuming FuseReply) {
        switch fs.ids.owner(ofHandle: handle) {
        case .listing?: fs.releasedir(handle: handle)
        case .control?: fs.control.release(handle: handle)
        case .versions?: fs.versions.release(handle: handle)
        case .trash?: fs.trash.release(handle: handle)
        case .file?, nil: break
        }
        reply.ok()
    }

    public func fsyncdir(node: NodeID, handle: HandleID, reply: consuming FuseReply) {
        do { try fs.fsyncdir(); reply.ok() } catch { reply.error(error) }
    }

    public func statfs(node: NodeID, reply: consuming FuseReply) { reply.statfs(fs.statfs()) }

    /// `user.nimbus.versions`: asks the server (a deferred reply). Compared on every getxattr,
    /// which the kernel sends before each write(2): a constant, not built per call.
    static let versionsXattr = NimbusXattr.versions.name

    /// `.nimbus/` stores no attributes (ENODATA), and takes none.
    private static func xattrChangeError(_ name: String) -> Errno { name.hasPrefix("user.") ? .EPERM : .EOPNOTSUPP }

    public func setxattr(node: NodeID, name: String, value: UnsafeRawBufferPointer, flags: Int32, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: node) else { return reply.error(Self.xattrChangeError(name)) }
        if let x = NimbusXattr(name: name), x.needsServer {
            let box = ReplyBox(reply)
            return fs.resolve(node: node, name: x, value: Array(value)) { e in
                guard let reply = box.take() else { return }
                if let e { reply.error(e) } else { reply.ok() }
            }
        }
        do { try fs.setxattr(node: node, name: name, value: Array(value), flags: flags); reply.ok() } catch { reply.error(error) }
    }

    public func getxattr(node: NodeID, name: String, size: Int, reply: consuming FuseReply) {
        if case .trash(let t) = fs.ids.owner(of: node) {
            let box = ReplyBox(reply)
            return fs.trash.xattr(t, name: name) { r in
                guard let reply = box.take() else { return }
                switch r {
                case .success(let v): if size == 0 { reply.xattrSize(v.count) } else if v.count > size { reply.error(.ERANGE) } else { reply.bytes(v) }
                case .failure(let e): reply.error(e)
                }
            }
        }
        guard case .item = fs.ids.owner(of: node) else { return reply.error(.ENODATA) }
        if name == Self.versionsXattr {
            let box = ReplyBox(reply)
            return fs.versionsText(node: node) { r in
                guard let reply = box.take() else { return }
                switch r {
                case .success(let v): if size == 0 { reply.xattrSize(v.count) } else if v.count > size { reply.error(.ERANGE) } else { reply.bytes(v) }
                case .failure(let e): reply.error(e)
                }
            }
        }
        do {
            let v = try fs.getxattr(node: node, name: name)
            if size == 0 { reply.xattrSize(v.count) } else if v.count > size { reply.error(.ERANGE) } else { reply.bytes(v) }
        } catch { reply.error(error) }
    }

    public func listxattr(node: NodeID, size: Int, reply: consuming FuseReply) {
        do {
            let v: [UInt8]
            switch fs.ids.owner(of: node) {
            case .item: v = try fs.listxattr(node: node)
            case .trash(let t): v = fs.trash.listxattr(t)
            default: v = []
            }
            if size == 0 { reply.xattrSize(v.count) } else if v.count > size { reply.error(.ERANGE) } else { reply.bytes(v) }
        } catch { reply.error(error) }
    }

    public func removexattr(node: NodeID, name: String, reply: consuming FuseReply) {
        guard case .item = fs.ids.owner(of: node) else { return reply.error(Self.xattrChangeError(name)) }
        do { try fs.removexattr(node: node, name: name); reply.ok() } catch { reply.error(error) }
    }

    public func destroy() { _ = fs.store.sync() }
}

/// The kernel-cache port over a live session (what the sync engine will call after remote changes).
public struct SessionKernelCache: KernelCache {
    public let session: FuseSession
    public init(_ session: FuseSession) { self.session = session }
    public func invalidateNode(_ node: NodeID) { session.invalidateNode(node) }
    public func invalidateAttributes(_ node: NodeID) { session.invalidateNode(node, offset: -1) }
    public func storePages(_ node: NodeID, fd: Int32, offset: Int64, length: Int) {
        session.storePages(node, fd: fd, offset: offset, length: length)
    }
    public func invalidateEntry(parent: NodeID, name: String) { session.invalidateEntry(parent: parent, name: name) }
    public func notifyDelete(parent: NodeID, child: NodeID, name: String) { session.notifyDelete(parent: parent, child: child, name: name) }
    public func requestCounts() -> [(kind: String, count: UInt64)] { session.requests.snapshot().map { ($0.op.name, $0.count) } }
}

/// Carries a reply into a provider's completion (which may run on any thread, exactly once).
extension FuseAdapter {
    /// Downloads all of placeholder `id` (node `node`), then lets `then` answer (deferred: no FUSE
    /// thread waits); a program the download policy refuses gets EACCES, a failed download its
    /// errno.
    func afterDownload(_ id: ItemID, node: NodeID, _ reply: consuming FuseReply, then: @escaping @Sendable (consuming FuseReply) -> Void) {
        if fs.refusesDownload(pid: reply.context.pid, node: node) { return reply.error(.EACCES) }
        let box = ReplyBox(reply)
        fs.content.hydrate(id, range: 0..<Int64.max) { error in
            guard let r = box.take() else { return }
            if let error { return r.error(error) }
            then(r)
        }
    }
}

final class ReplyBox: Sendable {
    // The reply is taken under the mutex, so only one caller can answer it.
    private let reply: Mutex<FuseReply?>
    init(_ r: consuming FuseReply) { reply = Mutex(Optional(r)) }
    func take() -> FuseReply? { reply.withLock { $0.take() } }
}
