import FuseKit
import LocalStore
import NimbusCore

extension ContainerFS {
    /// Takes `n` out of the tree (lock held): the database row goes at once; the node and its
    /// cache file live until the kernel forgets it and the last handle closes (POSIX: an open
    /// file stays readable after unlink).
    func detach(_ n: Node, from p: Node, now: Int64) {
        p.children[n.rec.name] = nil
        if n.isDir { p.subdirs -= 1 }
        p.rec.mtime = now
        p.rec.ctime = now
        n.linked = false
        n.rec.ctime = now
        store.enqueue(.delete(n.rec.id))
        persist(p)
        reapIfUnused(n)
    }

    func isControl(parent: UInt64, name: String) -> Bool {
        parent == Self.controlDirNode || (parent == Self.rootNode && name == Self.controlName)
    }

    public func unlink(parent: UInt64, name: String) throws(Errno) {
        if isControl(parent: parent, name: name) { throw .EPERM }
        let id = try lock.withLock { () throws(Errno) -> ItemID in
            let p = try folder(parent)
            guard let id = p.children[name], let n = t.nodes[id] else { throw .ENOENT }
            if n.isDir { throw .EISDIR }
            detach(n, from: p, now: WallClock.nowNanoseconds())
            return n.rec.id
        }
        notify(.deleted(id))
    }

    public func rmdir(parent: UInt64, name: String) throws(Errno) {
        if isControl(parent: parent, name: name) { throw .EPERM }
        let id = try lock.withLock { () throws(Errno) -> ItemID in
            let p = try folder(parent)
            guard let id = p.children[name], let n = t.nodes[id] else { throw .ENOENT }
            guard n.isDir else { throw .ENOTDIR }
            guard n.children.isEmpty else { throw .ENOTEMPTY }
            detach(n, from: p, now: WallClock.nowNanoseconds())
            return n.rec.id
        }
        notify(.deleted(id))
    }

    /// Hard links: an item has one place in a synced tree (EPERM, as on filesystems without links).
    public func link(node: UInt64, newParent: UInt64, newName: String) throws(Errno) -> FuseEntry {
        throw .EPERM
    }

    /// Whether `ancestor` is `n` or one of its parents (lock held). Bounded like the server's
    /// cycle check so a corrupt tree cannot loop (hitting the bound counts as inside).
    func isInside(_ n: Node, _ ancestor: Node) -> Bool {
        var cur = n
        for _ in 0..<100_000 {
            if cur === ancestor { return true }
            if cur.node == Self.rootNode { return false }
            guard let p = t.nodes[cur.parentNode] else { return false }
            cur = p
        }
        return true
    }

    /// rename(2)/renameat2(2): moves or renames, replacing a compatible target; RENAME_NOREPLACE
    /// fails with EEXIST, RENAME_EXCHANGE swaps the two items.
    public func rename(parent: UInt64, name: String, newParent: UInt64, newName: String, flags: RenameFlags) throws(Errno) {
        if isControl(parent: parent, name: name) || isControl(parent: newParent, name: newName) { throw .EPERM }
        if flags.contains(.whiteout) || (flags.contains(.exchange) && flags.contains(.noReplace)) { throw .EINVAL }
        if newName.utf8.count > ItemName.maxBytes { throw .ENAMETOOLONG }
        var changes: [LocalChange] = []
        try lock.withLock { () throws(Errno) in
            let p = try folder(parent)
            let np = try folder(newParent)
            guard let sid = p.children[name], let s = t.nodes[sid] else { throw .ENOENT }
            let target = np.children[newName].flatMap { t.nodes[$0] }
            let now = WallClock.nowNanoseconds()
            if let target, target === s { return }  // same item: nothing to do (POSIX)
            if s.isDir && isInside(np, s) { throw .EINVAL }

            if flags.contains(.exchange) {
                guard let target else { throw .ENOENT }
                if target.isDir && isInside(p, target) { throw .EINVAL }
                p.children[name] = target.node
                np.children[newName] = s.node
                if s.isDir != target.isDir, p !== np {
                    if s.isDir { p.subdirs -= 1; np.subdirs += 1 } else { p.subdirs += 1; np.subdirs -= 1 }
                }
                (s.rec.parent, s.rec.name, target.rec.parent, target.rec.name) = (np.rec.id, newName, p.rec.id, name)
                s.rec.ctime = now
                target.rec.ctime = now
                s.parentNode = np.node
                target.parentNode = p.node
                for x in [p, np] { x.rec.mtime = now; x.rec.ctime = now }
                persist(s); persist(target); persist(p)
                if p !== np { persist(np) }
                changes = [.moved(s.rec.id), .moved(target.rec.id)]
                return
            }

            if let target {
                if flags.contains(.noReplace) { throw .EEXIST }
                if s.isDir {
                    guard target.isDir else { throw .ENOTDIR }
                    guard target.children.isEmpty else { throw .ENOTEMPTY }
                } else if target.isDir {
                    throw .EISDIR
                }
                detach(target, from: np, now: now)
                changes.append(.deleted(target.rec.id))
            }
            p.children[name] = nil
            np.children[newName] = s.node
            if s.isDir && p !== np { p.subdirs -= 1; np.subdirs += 1 }
            s.rec.parent = np.rec.id
            s.rec.name = newName
            s.rec.ctime = now
            s.parentNode = np.node
            for x in [p, np] { x.rec.mtime = now; x.rec.ctime = now }
            persist(s); persist(p)
            if p !== np { persist(np) }
            changes.append(.moved(s.rec.id))
        }
        for c in changes { notify(c) }
    }
}
