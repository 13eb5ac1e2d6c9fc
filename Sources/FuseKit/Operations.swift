import CFuse3
import Glibc

// The C operation table. Each entry is a capture-free closure (so it converts to a C function
// pointer) that finds the Swift session through fuse_req_userdata and forwards typed arguments.
// Node and handle ids become `NodeID` and `HandleID` here, on the way in (Reply.swift and
// FuseSession.swift turn them back into the kernel's numbers on the way out). Names that are not
// valid UTF-8 are refused with EILSEQ here: item names are UTF-8 everywhere (the server protocol
// is JSON).

@inline(__always)
private func fs(_ req: fuse_req_t?) -> any FuseFilesystem {
    Unmanaged<FuseSession>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue().filesystem
}

/// The filesystem, counting the request (`FuseSession.requests`).
@inline(__always)
private func fs(_ req: fuse_req_t?, _ op: FuseRequestCounts.Op) -> any FuseFilesystem {
    let s = Unmanaged<FuseSession>.fromOpaque(fuse_req_userdata(req)!).takeUnretainedValue()
    s.requests.add(op)
    return s.filesystem
}

@inline(__always)
private func name(_ p: UnsafePointer<CChar>?) -> String? {
    guard let p else { return nil }
    return String(validatingCString: p)
}

private func setAttrChanges(_ st: stat, _ toSet: Int32) -> FuseSetAttr {
    var c = FuseSetAttr()
    if toSet & FUSE_SET_ATTR_MODE != 0 { c.mode = st.st_mode }
    if toSet & FUSE_SET_ATTR_UID != 0 { c.uid = st.st_uid }
    if toSet & FUSE_SET_ATTR_GID != 0 { c.gid = st.st_gid }
    if toSet & FUSE_SET_ATTR_SIZE != 0 { c.size = Int64(st.st_size) }
    if toSet & FUSE_SET_ATTR_ATIME_NOW != 0 { c.atime = .now } else if toSet & FUSE_SET_ATTR_ATIME != 0 { c.atime = .at(st.st_atim) }
    if toSet & FUSE_SET_ATTR_MTIME_NOW != 0 { c.mtime = .now } else if toSet & FUSE_SET_ATTR_MTIME != 0 { c.mtime = .at(st.st_mtim) }
    if toSet & FUSE_SET_ATTR_CTIME != 0 { c.ctime = st.st_ctim }
    // FATTR_KILL_SUIDGID (the same bit).
    if toSet & FUSE_SET_ATTR_KILL_SUID != 0 { c.killSetID = true }
    return c
}

func makeOperations() -> fuse_lowlevel_ops {
    var o = fuse_lowlevel_ops()
    o.`init` = { userdata, conn in
        guard let conn else { return }
        // A large max_background so deferred replies do not complete in batches (the kernel's default, 12, makes them).
        let s = Unmanaged<FuseSession>.fromOpaque(userdata!).takeUnretainedValue()
        cfuse_conn_tune(conn, 256, 192, 1, s.filesystem.handlesLocks ? 1 : 0)
        s.filesystem.initialize(capabilities: conn.pointee.capable)
    }
    o.destroy = { userdata in
        Unmanaged<FuseSession>.fromOpaque(userdata!).takeUnretainedValue().filesystem.destroy()
    }
    o.lookup = { req, parent, n in
        let r = FuseReply(req!)
        guard let n = name(n) else { return r.error(.EILSEQ) }
        fs(req, .lookup).lookup(parent: NodeID(rawValue: parent), name: n, reply: r)
    }
    o.forget = { req, node, count in
        fs(req, .forget).forget(node: NodeID(rawValue: node), count: count)
        fuse_reply_none(req)
    }
    o.forget_multi = { req, count, list in
        let f = fs(req, .forgetMulti)
        for i in 0..<count { f.forget(node: NodeID(rawValue: list![i].ino), count: list![i].nlookup) }
        fuse_reply_none(req)
    }
    o.getattr = { req, node, fi in
        fs(req, .getattr).getattr(node: NodeID(rawValue: node), handle: fi.map { HandleID(rawValue: $0.pointee.fh) }, reply: FuseReply(req!))
    }
    o.setattr = { req, node, st, toSet, fi in
        fs(req, .setattr).setattr(node: NodeID(rawValue: node), setAttrChanges(st!.pointee, toSet), handle: fi.map { HandleID(rawValue: $0.pointee.fh) }, reply: FuseReply(req!))
    }
    o.readlink = { req, node in fs(req, .readlink).readlink(node: NodeID(rawValue: node), reply: FuseReply(req!)) }
    o.mknod = { req, parent, n, mode, rdev in
        let r = FuseReply(req!)
        guard let n = name(n) else { return r.error(.EILSEQ) }
        fs(req, .mknod).mknod(parent: NodeID(rawValue: parent), name: n, mode: mode, rdev: rdev, reply: r)
    }
    o.mkdir = { req, parent, n, mode in
        let r = FuseReply(req!)
        guard let n = name(n) else { return r.error(.EILSEQ) }
        fs(req, .mkdir).mkdir(parent: NodeID(rawValue: parent), name: n, mode: mode, reply: r)
    }
    o.unlink = { req, parent, n in
        let r = FuseReply(req!)
        guard let n = name(n) else { return r.error(.EILSEQ) }
        fs(req, .unlink).unlink(parent: NodeID(rawValue: parent), name: n, reply: r)
    }
    o.rmdir = { req, parent, n in
        let r = FuseReply(req!)
        guard let n = name(n) else { return r.error(.EILSEQ) }
        fs(req, .rmdir).rmdir(parent: NodeID(rawValue: parent), name: n, reply: r)
    }
    o.symlink = { req, target, parent, n in
        let r = FuseReply(req!)
        guard let n = name(n), let target else { return r.error(.EILSEQ) }
        let bytes = Array(UnsafeRawBufferPointer(start: target, count: strlen(target)))
        fs(req, .symlink).symlink(target: bytes, parent: NodeID(rawValue: parent), name: n, reply: r)
    }
    o.rename = { req, parent, n, newParent, newName, flags in
        let r = FuseReply(req!)
        guard let n = name(n), let nn = name(newName) else { return r.error(.EILSEQ) }
        fs(req, .rename).rename(parent: NodeID(rawValue: parent), name: n, newParent: NodeID(rawValue: newParent), newName: nn, flags: RenameFlags(rawValue: flags), reply: r)
    }
    o.link = { req, node, newParent, newName in
        let r = FuseReply(req!)
        guard let nn = name(newName) else { return r.error(.EILSEQ) }
        fs(req, .link).link(node: NodeID(rawValue: node), newParent: NodeID(rawValue: newParent), newName: nn, reply: r)
    }
    o.open = { req, node, fi in
        fs(req, .open).open(node: NodeID(rawValue: node), flags: fi!.pointee.flags, reply: FuseReply(req!))
    }
    o.create = { req, parent, n, mode, fi in
        let r = FuseReply(req!)
        guard let n = name(n) else { return r.error(.EILSEQ) }
        fs(req, .create).create(parent: NodeID(rawValue: parent), name: n, mode: mode, flags: fi!.pointee.flags, reply: r)
    }
    o.read = { req, node, size, off, fi in
        fs(req, .read).read(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), offset: Int64(off), size: size, reply: FuseReply(req!))
    }
    o.write = { req, node, buf, size, off, fi in
        fs(req, .write).write(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), offset: Int64(off),
                      data: UnsafeRawBufferPointer(start: buf, count: size), reply: FuseReply(req!))
    }
    o.flush = { req, node, fi in
        let f = fs(req, .flush)
        // A close: the closing process's POSIX locks on this file end (fcntl semantics).
        if f.handlesLocks { f.releaseLocks(node: NodeID(rawValue: node), owner: fi!.pointee.lock_owner, flock: false) }
        f.flush(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), reply: FuseReply(req!))
    }
    o.release = { req, node, fi in
        let f = fs(req, .release)
        if f.handlesLocks && fi!.pointee.flock_release != 0 { f.releaseLocks(node: NodeID(rawValue: node), owner: fi!.pointee.lock_owner, flock: true) }
        f.release(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), reply: FuseReply(req!))
    }
    o.getlk = { req, node, fi, lock in
        let l = lock!.pointee
        fs(req, .getlk).getlk(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), owner: fi!.pointee.lock_owner,
                      lock: FuseLock(type: l.l_type, start: UInt64(max(0, l.l_start)), length: UInt64(max(0, l.l_len)), pid: l.l_pid),
                      reply: FuseReply(req!))
    }
    o.setlk = { req, node, fi, lock, sleep in
        let l = lock!.pointee
        fs(req, .setlk).setlk(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), owner: fi!.pointee.lock_owner,
                      lock: FuseLock(type: l.l_type, start: UInt64(max(0, l.l_start)), length: UInt64(max(0, l.l_len)), pid: l.l_pid),
                      wait: sleep != 0, reply: FuseReply(req!))
    }
    o.flock = { req, node, fi, op in
        fs(req, .flock).flock(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), owner: fi!.pointee.lock_owner, operation: op, reply: FuseReply(req!))
    }
    o.fsync = { req, node, datasync, fi in
        fs(req, .fsync).fsync(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), dataOnly: datasync != 0, reply: FuseReply(req!))
    }
    o.fallocate = { req, node, mode, off, len, fi in
        fs(req, .fallocate).fallocate(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), mode: mode, offset: Int64(off), length: Int64(len), reply: FuseReply(req!))
    }
    o.opendir = { req, node, _ in fs(req, .opendir).opendir(node: NodeID(rawValue: node), reply: FuseReply(req!)) }
    o.readdir = { req, node, size, off, fi in readdir(req!, NodeID(rawValue: node), size, off, HandleID(rawValue: fi!.pointee.fh), plus: false) }
    o.readdirplus = { req, node, size, off, fi in readdir(req!, NodeID(rawValue: node), size, off, HandleID(rawValue: fi!.pointee.fh), plus: true) }
    o.releasedir = { req, node, fi in fs(req, .releasedir).releasedir(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), reply: FuseReply(req!)) }
    o.fsyncdir = { req, node, _, fi in fs(req, .fsyncdir).fsyncdir(node: NodeID(rawValue: node), handle: HandleID(rawValue: fi!.pointee.fh), reply: FuseReply(req!)) }
    o.statfs = { req, node in fs(req, .statfs).statfs(node: NodeID(rawValue: node), reply: FuseReply(req!)) }
    o.setxattr = { req, node, n, value, size, flags in
        let r = FuseReply(req!)
        guard let n = name(n) else { return r.error(.EILSEQ) }
        fs(req, .setxattr).setxattr(node: NodeID(rawValue: node), name: n, value: UnsafeRawBufferPointer(start: value, count: size), flags: flags, reply: r)
    }
    o.getxattr = { req, node, n, size in
        let r = FuseReply(req!)
        guard let n = name(n) else { return r.error(.ENODATA) }
        fs(req, .getxattr).getxattr(node: NodeID(rawValue: node), name: n, size: size, reply: r)
    }
    o.listxattr = { req, node, size in fs(req, .listxattr).listxattr(node: NodeID(rawValue: node), size: size, reply: FuseReply(req!)) }
    o.removexattr = { req, node, n in
        let r = FuseReply(req!)
        guard let n = name(n) else { return r.error(.ENODATA) }
        fs(req, .removexattr).removexattr(node: NodeID(rawValue: node), name: n, reply: r)
    }
    return o
}

private func readdir(_ req: fuse_req_t, _ node: NodeID, _ size: Int, _ off: off_t, _ handle: HandleID, plus: Bool) {
    let r = FuseReply(req)
    var buf = DirectoryBuffer(req: req, capacity: size, plus: plus)
    if let e = fs(req, plus ? .readdirplus : .readdir).readdir(node: node, handle: handle, offset: Int64(off), into: &buf, plus: plus) {
        return r.error(e)
    }
    r.buffer(buf.bytes)
}

/// libfuse's interrupt callback (registered by `FuseReply.watchInterrupt`).
@_cdecl("cfuse_interrupted")
func cfuseInterrupted(_ req: fuse_req_t?, _ token: UnsafeMutableRawPointer?) {
    fs(req).interrupted(token: UInt64(UInt(bitPattern: token)))
}
