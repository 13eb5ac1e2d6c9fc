import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore

// Hard links (docs/posix.md "Hard links"). On this device a file can have several names: one
// node (inode, `st_ino`), `st_nlink` names, one content file. Each name is an item of its own:
// the server and other devices see ordinary files with the same content (its chunks are stored
// once). A change of the content or attributes here is a change of every name's item. A state
// of one of the names coming from another device takes that name off the node first
// (`splitOff`): it gets a node and a content file of its own, and the other names keep theirs,
// so nothing written here is lost.

extension ContainerFS {
    /// The most names a file can have (ext4's limit).
    static let maxLinks = 65_000

    /// link(2): `newName` in `newParent` becomes another name of file `node`, with an item of its
    /// own (uploaded as a new file with the same content). The content must be here: the mount
    /// downloads a placeholder's content first (`FuseAdapter.link`); EAGAIN when it went meanwhile.
    public func link(node: NodeID, newParent: NodeID, newName: String) throws(Errno) -> FuseEntry {
        try Self.check(name: newName, in: newParent)
        let newID = options.clock.newItemID()
        let e = try lock.withLock { () throws(Errno) -> FuseEntry in
            let n = try self.node(node)
            guard n.linked else { throw .ENOENT }
            if n.isDir { throw .EPERM }
            let p = try folder(newParent)
            guard p.children[newName] == nil else { throw .EEXIST }
            guard n.links.count + 1 < Self.maxLinks else { throw .EMLINK }
            if n.rec.kind == .file, !n.rec.isSpecial {
                guard n.unnoticed || content.isPresent(n.rec.id, range: 0..<n.rec.size) else { throw .EAGAIN }
                materializeCacheFile(n)
                let rc = store.cache.link(n.rec.id, as: newID)
                if rc != 0 { throw Errno(rc) }
            }
            let now = options.clock.wall()
            n.links.append(LinkName(id: newID, parent: p.rec.id, parentNode: p.node, name: newName))
            t.byID[newID] = n.node
            p.children[newName] = n.node
            p.rec.mtime = now
            p.rec.ctime = now
            n.rec.ctime = now
            linkedFiles.store(true, ordering: .relaxed)
            // A name a file was just renamed away from (`ln b a` after `mv a b`): its first upload
            // waits a moment, as a new file's there does, so the rename goes first. Sent in one
            // batch with a commit drafted before the rename, it would find the name taken on the
            // server and be moved beside it.
            noteCreated(n, folder: p.node, name: newName)
            persist(n)  // every name's row: the new one, and the shared ctime
            for (name, value) in n.xattrs { store.enqueue(.setXattr(newID, name: name, value: value)) }
            persist(p)
            return lookedUp(n)
        }
        notify(.created(newID))
        return e
    }

    /// Gives name `id` of linked file `n` its link to the shared content file again when it has
    /// none (lock held): a crash can lose a link made on disk after its row was committed (the
    /// cache folder is not synced with the database). False when no name has a file.
    @discardableResult
    func relinkCacheFile(_ n: Node, _ id: ItemID) -> Bool {
        guard !n.links.isEmpty, n.rec.kind == .file, !n.rec.isSpecial, store.cache.size(of: id) == nil else { return false }
        for other in n.itemIDs where other != id && store.cache.link(other, as: id) == 0 { return true }
        return false
    }

    /// Whether `node` is a file whose content must be downloaded before it can be linked.
    public func linkNeedsContent(_ node: NodeID) -> ItemID? {
        placeholder(node: node, range: 0..<Int64.max)
    }

    /// Removes item `id`, one name of `n` in folder `p` (lock held): the whole node when it is
    /// its only name (`detach`), else that name alone. When the first name goes, the next one
    /// takes its place in `rec`; the content file stays (each name has a link to it).
    func unlinkName(_ n: Node, _ id: ItemID, from p: Node, now: Int64, origin: EventOrigin? = .local) {
        guard !n.links.isEmpty else { return detach(n, from: p, now: now, origin: origin) }
        let place = n.place(id)
        if ItemName.same(place.name, Self.ignoreFileName) { rulesChanged() }
        if let origin { events.append(.deleted, origin: origin, path: pathLocked(n, id)) }
        p.children[place.name] = nil
        p.rec.mtime = now
        p.rec.ctime = now
        n.rec.ctime = now
        dropName(n, id)
        store.enqueue(.delete(id))
        if n.rec.kind == .file { retire(id) }
        persist(n)
        persist(p)
    }

    /// Takes name `id` off `n`'s names (lock held), the next name becoming the first when it is
    /// the first; `t.byID` forgets it.
    private func dropName(_ n: Node, _ id: ItemID) {
        n.droppedNames.insert(id)
        if let i = n.linkIndex(id) {
            n.links.remove(at: i)
        } else if !n.links.isEmpty {
            let l = n.links.removeFirst()
            n.rec.id = l.id
            n.rec.parent = l.parent
            n.rec.name = l.name
            n.parentNode = l.parentNode
            n.placeGen = l.placeGen
            n.placeNoticed = l.placeNoticed
            n.placedBeside = false
        }
        if t.byID[id] == n.node { t.byID[id] = nil }
    }

    /// Takes item `id` off linked file `n` into a node of its own at the same place (lock held),
    /// for a state another device made of it. `copyContent`: the new node gets a copy of the
    /// bytes (the state keeps them); otherwise its content file goes (the state brings new
    /// content). Nil when the copy could not be made (a full disk): the state waits.
    func splitOff(_ n: Node, _ id: ItemID, copyContent: Bool, _ actions: inout [KernelAction]) -> Node? {
        let place = n.place(id)
        guard let p = t.nodes[place.parentNode] else { return nil }
        if n.rec.kind == .file, !n.rec.isSpecial {
            if copyContent {
                guard copyCacheFile(of: n.rec.id, to: id) else { return nil }
            } else {
                store.cache.remove(id)
            }
        }
        var rec = n.record(id)
        rec.node = ids.newItemNode()
        let gen = (n.placeGen(id), n.placeNoticed(id))
        dropName(n, id)
        let fresh = Node(rec)
        fresh.xattrs = n.xattrs
        fresh.parentNode = p.node
        (fresh.placeGen, fresh.placeNoticed) = gen
        fresh.writeGen = n.writeGen  // the same bytes (or about to be replaced by the state)
        t.nodes[fresh.node] = fresh
        t.byID[id] = fresh.node
        p.children[place.name] = fresh.node
        persist(fresh)
        persist(n)
        actions.append(.entry(parent: p.node, name: place.name))
        actions.append(.node(n.node))  // its link count
        return fresh
    }

    /// Gives item `to` a content file of its own with the bytes of `from`'s (lock held): a copy,
    /// renamed over `to`'s link to the shared file.
    private func copyCacheFile(of from: ItemID, to: ItemID) -> Bool {
        let src = Glibc.open(store.cache.path(for: from), O_RDONLY | O_CLOEXEC)
        guard src >= 0 else { return false }
        defer { close(src) }
        let tmp = store.cache.path(for: to) + ".split"
        let dst = Glibc.open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard dst >= 0 else { return false }
        var ok = true
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 20, alignment: 16)
        defer { buffer.deallocate() }
        copying: while true {
            let n = Glibc.read(src, buffer.baseAddress, buffer.count)
            if n == 0 { break }
            if n < 0 { ok = false; break }
            var done = 0
            while done < n {
                let w = Glibc.write(dst, buffer.baseAddress! + done, n - done)
                if w <= 0 { ok = false; break copying }
                done += w
            }
        }
        if ok { ok = Glibc.fsync(dst) == 0 }
        close(dst)
        guard ok, Glibc.rename(tmp, store.cache.path(for: to)) == 0 else {
            Glibc.unlink(tmp)
            return false
        }
        store.cache.placed(to)
        return true
    }

    /// `c`, and the same change for every other name of the file it names: a change of a linked
    /// file's content or attributes is a change of each of its items.
    func forEveryName(_ c: LocalChange) -> [LocalChange] {
        guard linkedFiles.load(ordering: .relaxed) else { return [c] }
        let id: ItemID
        let make: (ItemID) -> LocalChange
        switch c {
        case .contentChanged(let i): (id, make) = (i, LocalChange.contentChanged)
        case .attributesChanged(let i): (id, make) = (i, LocalChange.attributesChanged)
        case .writing(let i): (id, make) = (i, LocalChange.writing)
        default: return [c]
        }
        let others = lock.withLock { () -> [ItemID] in
            guard let n = t.byID[id].flatMap({ t.nodes[$0] }), !n.links.isEmpty else { return [] }
            return n.itemIDs.filter { $0 != id }
        }
        return [c] + others.map(make)
    }
}
