import FuseKit
import LocalStore
import MountPorts
import NimbusCore

extension ContainerFS {
    /// Takes `n` out of the tree (lock held): the database row goes at once; the node and its
    /// cache file live until the kernel forgets it and the last handle closes (POSIX: an open
    /// file stays readable after unlink).
    func detach(_ n: Node, from p: Node, now: Int64, origin: EventOrigin? = .local) {
        if ItemName.same(n.rec.name, Self.ignoreFileName) { rulesChanged() }
        if let origin { events.append(.deleted, origin: origin, path: pathLocked(n)) }
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

    /// Whether `name` in `parent` is the root's `.nimbus` (which cannot be removed or renamed).
    func namesControlFolder(parent: NodeID, name: String) -> Bool {
        parent == .root && ItemName.same(name, Self.controlName)
    }

    public func unlink(parent: NodeID, name: String) throws(Errno) {
        if namesControlFolder(parent: parent, name: name) { throw .EPERM }
        var keptIdentity: (ItemID, Node)?
        let id = try lock.withLock { () throws(Errno) -> ItemID in
            let p = try folder(parent)
            guard let node = p.children[name], let n = t.nodes[node] else { throw .ENOENT }
            if n.isDir { throw .EISDIR }
            // vim's save: the document was renamed to a backup name, a new file written under
            // the document's name, and now the backup goes: the new file takes the document's
            // identity (item id, versions, pin); the item that goes is the new file's.
            if n.links.isEmpty, let heir = safeSaveHeir(of: n), transferIdentity(from: n, to: heir) {
                events.append(.deleted, origin: .local, path: pathLocked(n))  // the backup name
                detach(n, from: p, now: options.clock.wall(), origin: nil)
                persist(heir)
                heir.noticesPending += 1
                keptIdentity = (heir.rec.id, heir)
                return n.rec.id
            }
            let id = n.id(in: p.node, named: name)
            unlinkName(n, id, from: p, now: options.clock.wall())
            return id
        }
        notify(.deleted(id))
        if let (kept, heir) = keptIdentity {
            notify(.contentChanged(kept), pending: heir)
            commitIdentityTransfer()
        }
    }

    // MARK: safe saves

    /// The content files of an identity transfer are exchanged on disk at once, while the rows
    /// and the upload-queue entry go through the write-behind queue: commit them now, so a crash
    /// right after a save cannot keep the exchanged bytes under an item the engine believes
    /// unchanged (EngineSimTests: a `kill -9` two steps after vim's save must not leave the new
    /// bytes under the document's id with no queued upload).
    /// The window left is the few milliseconds between the exchange and this commit.
    func commitIdentityTransfer() {
        _ = store.sync()
    }

    /// Gives `to` the identity of `from` (lock held): item id, and so the engine's base, versions
    /// and pin; the content files are exchanged so each id keeps naming its node's bytes. `from`
    /// gets `to`'s old id, which goes away. Only for files whose content is all here (a
    /// placeholder cannot take over: its bytes are another version's), and never when the id
    /// that goes away has unresolved conflict versions: those are other devices' writes, and
    /// they leave only through a resolve or an `rm` of the file. The caller then renames or
    /// deletes plainly, and that item, versions and all, lives on under its new name. False
    /// when it cannot be done; nothing changed.
    func transferIdentity(from: Node, to: Node) -> Bool {
        // The content files are exchanged at once, the rows only when the store commits: while
        // its commits fail (a full disk) a crash would leave each id naming the other's bytes.
        if store.lastError != nil, !Mutation.transferIdentityWhileUnsaved.isOn { return false }
        guard from.rec.kind == .file, to.rec.kind == .file, from !== to, !from.rec.isSpecial, !to.rec.isSpecial,
              from.links.isEmpty, to.links.isEmpty,
              content.isPresent(to.rec.id, range: 0..<to.rec.size),
              syncStatus?.hasConflictVersions(to.rec.id) != true else { return false }
        // An empty file synced from elsewhere may have no cache file yet.
        materializeCacheFile(from)
        materializeCacheFile(to)
        guard store.cache.exchange(from.rec.id, to.rec.id) else { return false }
        let keep = from.rec.id, temp = to.rec.id
        to.rec.id = keep
        from.rec.id = temp
        t.byID[keep] = to.node
        t.byID[temp] = from.node
        // Each id names other bytes now: a commit drafted before (or a snapshot being taken)
        // must not count them as unchanged.
        bumpWriteGen(to)
        bumpWriteGen(from)
        // The stored xattrs under `keep` become `to`'s own (POSIX: the surviving file's).
        for name in from.xattrs.keys where to.xattrs[name] == nil { store.enqueue(.removeXattr(keep, name: name)) }
        for (name, value) in to.xattrs { store.enqueue(.setXattr(keep, name: name, value: value)) }
        t.safeSaves[to.node] = nil
        return true
    }

    /// A file renamed away from `name` in `folder`: a new file created under that name soon
    /// after may be an editor's save (lock held).
    func noteRenamedAway(folder: NodeID, name: String, node: NodeID) {
        let now = options.clock.monotonic()
        t.renamedAway.removeAll { now &- $0.at > Self.safeSaveWindow }
        if t.renamedAway.count >= 32 { t.renamedAway.removeFirst() }
        t.renamedAway.append((folder, name, node, now))
    }

    /// Called by create (lock held): the new file `n` takes the name a file was just renamed from.
    func noteCreated(_ n: Node, folder: NodeID, name: String) {
        let now = options.clock.monotonic()
        t.safeSaves = t.safeSaves.filter { now &- $0.value.at <= Self.safeSaveWindow }
        guard let r = t.renamedAway.last(where: { $0.folder == folder && ItemName.same($0.name, name) && now &- $0.at <= Self.safeSaveWindow }),
              t.nodes[r.node]?.linked == true else { return }
        t.safeSaves[n.node] = (r.node, now)
    }

    /// The file that should take `n`'s identity when `n` is removed (vim's backup pattern).
    /// The heir may still count a writer: the kernel sends RELEASE after `close(2)` has returned,
    /// so the editor's unlink of the backup can arrive first. Its open handle follows the
    /// exchanged content file, and its upload waits for the writer as any other.
    func safeSaveHeir(of n: Node) -> Node? {
        let now = options.clock.monotonic()
        guard let (heir, _) = t.safeSaves.first(where: { $0.value.renamed == n.node && now &- $0.value.at <= Self.safeSaveWindow }),
              let h = t.nodes[heir], h.linked else { return nil }
        return h
    }

    /// How long a rename-away/create/remove sequence counts as one save.
    static let safeSaveWindow: UInt64 = 5_000_000_000

    /// Whether `item` is a new file that may yet take over another item's identity (a save in
    /// progress): the sync engine holds its first upload for a moment.
    public func isPendingSafeSave(_ item: ItemID) -> Bool {
        let now = options.clock.monotonic()
        return lock.withLock {
            guard let node = t.byID[item] else { return false }
            return pendingSafeSave(node, now: now)
        }
    }

    /// `isPendingSafeSave` of a node (lock held).
    func pendingSafeSave(_ node: NodeID, now: UInt64) -> Bool {
        guard let s = t.safeSaves[node] else { return false }
        return now &- s.at <= 2_000_000_000
    }

    public func rmdir(parent: NodeID, name: String) throws(Errno) {
        if namesControlFolder(parent: parent, name: name) { throw .EPERM }
        let id = try lock.withLock { () throws(Errno) -> ItemID in
            let p = try folder(parent)
            guard let id = p.children[name], let n = t.nodes[id] else { throw .ENOENT }
            guard n.isDir else { throw .ENOTDIR }
            guard n.children.isEmpty else { throw .ENOTEMPTY }
            detach(n, from: p, now: options.clock.wall())
            return n.rec.id
        }
        notify(.deleted(id))
    }

    /// Whether `ancestor` is `n` or one of its parents (lock held). Bounded like the server's
    /// cycle check so a corrupt tree cannot loop (hitting the bound counts as inside).
    func isInside(_ n: Node, _ ancestor: Node) -> Bool {
        var cur = n
        for _ in 0..<100_000 {
            if cur === ancestor { return true }
            if cur.node == .root { return false }
            guard let p = t.nodes[cur.parentNode] else { return false }
            cur = p
        }
        return true
    }

    /// rename(2)/renameat2(2): moves or renames, replacing a compatible target; RENAME_NOREPLACE
    /// fails with EEXIST, RENAME_EXCHANGE swaps the two items.
    public func rename(parent: NodeID, name: String, newParent: NodeID, newName: String, flags: RenameFlags) throws(Errno) {
        if namesControlFolder(parent: parent, name: name) || namesControlFolder(parent: newParent, name: newName) { throw .EPERM }
        if flags.contains(.whiteout) || (flags.contains(.exchange) && flags.contains(.noReplace)) { throw .EINVAL }
        if newName.utf8.count > ItemName.maxBytes { throw .ENAMETOOLONG }
        var changes: [LocalChange] = []
        var transferred: Node?  // an editor's save took over the document's identity (the node keeping it)
        var moved: [MovedNode] = []  // whose place changed (`placeGen`; noticed once the engine has the notices)
        try lock.withLock { () throws(Errno) in
            let p = try folder(parent)
            let np = try folder(newParent)
            guard let sid = p.children[name], let s = t.nodes[sid] else { throw .ENOENT }
            let sID = s.id(in: p.node, named: name)
            // A folder's move changes the rules above what it holds; a rules file's, its rules.
            if s.isDir || ItemName.same(name, Self.ignoreFileName) || ItemName.same(newName, Self.ignoreFileName) { rulesChanged() }
            let target = np.children[newName].flatMap { t.nodes[$0] }
            let targetID = target.map { $0.id(in: np.node, named: newName) }
            let now = options.clock.wall()
            if let target, target === s {
                // Same file (the same name, or two links of it): nothing to do (POSIX), but a
                // name that exists is taken for RENAME_NOREPLACE (the kernel checks that first).
                if flags.contains(.noReplace) { throw .EEXIST }
                return
            }
            if s.isDir && isInside(np, s) { throw .EINVAL }

            if flags.contains(.exchange) {
                guard let target else { throw .ENOENT }
                if target.isDir && isInside(p, target) { throw .EINVAL }
                p.children[name] = target.node
                np.children[newName] = s.node
                if s.isDir != target.isDir, p !== np {
                    if s.isDir { p.subdirs -= 1; np.subdirs += 1 } else { p.subdirs += 1; np.subdirs -= 1 }
                }
                let tID = targetID ?? target.rec.id
                s.setPlace(sID, parent: np.rec.id, parentNode: np.node, name: newName)
                target.setPlace(tID, parent: p.rec.id, parentNode: p.node, name: name)
                s.rec.ctime = now
                target.rec.ctime = now
                for x in [p, np] { x.rec.mtime = now; x.rec.ctime = now }
                persist(s); persist(target); persist(p)
                if p !== np { persist(np) }
                moved = [MovedNode(n: s, id: sID, gen: s.movedHere(sID)), MovedNode(n: target, id: tID, gen: target.movedHere(tID))]
                changes = [.moved(sID), .moved(tID)]
                events.append(.exchanged, origin: .local, path: pathLocked(s, sID), to: pathLocked(target, tID))
                return
            }

            // A file renamed over a file (an editor's safe save: write a temporary file, rename it
            // over the document): the document keeps its identity — item id, versions, pin — and
            // gets the new content; the temporary item is what goes away.
            if let target, !flags.contains(.noReplace), transferIdentity(from: target, to: s) {
                let keep = s.rec.id, temp = target.rec.id
                events.append(.deleted, origin: .local, path: pathLocked(s))  // the temporary name
                detach(target, from: np, now: now, origin: nil)  // deletes the row of `temp` (frees s's node number)
                p.children[name] = nil
                np.children[newName] = s.node
                s.rec.parent = np.rec.id
                s.rec.name = newName
                s.rec.ctime = now
                s.parentNode = np.node
                for x in [p, np] { x.rec.mtime = now; x.rec.ctime = now }
                persist(s); persist(p)
                if p !== np { persist(np) }
                changes = [.deleted(temp), .contentChanged(keep)]
                s.noticesPending += 1
                moved = [MovedNode(n: s, id: keep, gen: s.movedHere(keep))]
                transferred = s
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
                let tID = targetID ?? target.rec.id
                unlinkName(target, tID, from: np, now: now)
                changes.append(.deleted(tID))
            }
            let from = pathLocked(s, sID)
            p.children[name] = nil
            np.children[newName] = s.node
            if s.isDir && p !== np { p.subdirs -= 1; np.subdirs += 1 }
            s.setPlace(sID, parent: np.rec.id, parentNode: np.node, name: newName)
            s.rec.ctime = now
            for x in [p, np] { x.rec.mtime = now; x.rec.ctime = now }
            persist(s); persist(p)
            if p !== np { persist(np) }
            changes.append(.moved(sID))
            moved = [MovedNode(n: s, id: sID, gen: s.movedHere(sID))]
            events.append(.moved, origin: .local, path: from, to: pathLocked(s, sID))
            if s.rec.kind == .file { noteRenamedAway(folder: p.node, name: name, node: s.node) }
        }
        notifyMoves(changes, pending: transferred, moved: moved)
        if transferred != nil { commitIdentityTransfer() }
    }

    /// A rename's notices, delivered together and in order; then the moves count as noticed
    /// (`placeNoticed`): a remote state planned before that keeps the local place. `pending`:
    /// the node whose content change (the last notice) was counted in `noticesPending`.
    private func notifyMoves(_ changes: [LocalChange], pending: Node?, moved: [MovedNode]) {
        guard !changes.isEmpty else { return }
        for c in changes { queue(c) }
        let heir = pending.map(UncheckedNode.init)
        let deliver: @Sendable () -> Void = { [self] in
            for c in changes { tell(c) }
            lock.withLock {
                if let heir { heir.n.noticesPending -= 1 }
                for m in moved { m.n.noticedPlace(m.id, m.gen) }
            }
        }
        guard let line = options.deliverNotice else { return deliver() }
        line(deliver)
    }
}

/// A node whose place changed here and the place generation its move's notice covers, carried
/// to the notice's delivery (touched there under `lock` only).
struct MovedNode: @unchecked Sendable {
    let n: Node
    let id: ItemID
    let gen: UInt64
}
