import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import SyncCore

/// The kernel's caches, for changes that did not come through the kernel (remote changes).
/// The FUSE adapter implements it; tests use a recorder.
public protocol KernelCache: Sendable {
    func invalidateNode(_ node: NodeID)
    func invalidateEntry(parent: NodeID, name: String)
    func notifyDelete(parent: NodeID, child: NodeID, name: String)
    /// Drops the cached attributes of `node` only, never its pages: safe to send from inside a
    /// request about that node (a write holds its pages locked until answered).
    func invalidateAttributes(_ node: NodeID)
    /// Fills the kernel's pages of `node` over `offset..<offset+length` from `fd` (the file's
    /// cache file), as they are there (`ContainerFS.release`).
    func storePages(_ node: NodeID, fd: Int32, offset: Int64, length: Int)
    /// How many requests of each kind the kernel sent (`.nimbus/requests`); none by default.
    func requestCounts() -> [(kind: String, count: UInt64)]
}

extension KernelCache {
    public func requestCounts() -> [(kind: String, count: UInt64)] { [] }
    public func invalidateAttributes(_ node: NodeID) {}
    public func storePages(_ node: NodeID, fd: Int32, offset: Int64, length: Int) {}
}

/// A kernel cache invalidation owed after a remote change (sent through `KernelCache`, never
/// while `lock` is held: a notification sent under the node lock deadlocks).
public enum KernelAction: Sendable, Equatable {
    case node(NodeID)
    case entry(parent: NodeID, name: String)
    case delete(parent: NodeID, child: NodeID, name: String)

    public func send(to k: any KernelCache) {
        switch self {
        case .node(let n): k.invalidateNode(n)
        case .entry(let p, let name): k.invalidateEntry(parent: p, name: name)
        case .delete(let p, let c, let name): k.notifyDelete(parent: p, child: c, name: name)
        }
    }
}

extension ContainerFS {
    /// Applies server states in any order (a listing comes by id, so children may precede their
    /// folders: those wait for a later pass), and sends the kernel invalidations they need (when a
    /// kernel is set). Returns those invalidations and the
    /// ids that could not be applied (their folder is unknown here, their name is taken by an
    /// item not yet uploaded — the server will rename one of them on upload — or the file is
    /// being written here).
    ///
    /// `applied` is called for each state shown, with the lock held, just before the tree and the
    /// cache file change: the engine switches the item's presence there, so no read can pair the
    /// new content's presence with the old file or the old presence with the new file.
    public func applyRemote(_ states: [RemoteState], applied: (ItemID) -> Void = { _ in }) -> (actions: [KernelAction], skipped: [ItemID]) {
        let result = applyLocked(states, applied: applied)
        sendKernel(result.actions)
        // Shown beside a local-only item (`nameBeside`): the new name goes to the server like a
        // rename made here.
        for id in result.renamed { notify(.moved(id)) }
        return (result.actions, result.skipped)
    }

    /// `MountedTree.show`: `applyRemote`, the kernel told.
    public func show(_ states: [RemoteState], applied: (ItemID) -> Void) -> [ItemID] {
        applyRemote(states, applied: applied).skipped
    }

    private func applyLocked(_ states: [RemoteState], applied: (ItemID) -> Void) -> (actions: [KernelAction], skipped: [ItemID], renamed: [ItemID]) {
        lock.withLock {
            var actions: [KernelAction] = []
            var pending = states
            var skipped: [ItemID] = []
            var renamed: [ItemID] = []
            while !pending.isEmpty {
                var rest: [RemoteState] = []
                for s in pending {
                    switch applyOne(s, &actions, &renamed, applied) {
                    case .done: break
                    case .waitForParent, .waitForName: rest.append(s)
                    case .skip: skipped.append(s.id)
                    }
                }
                if rest.count == pending.count {
                    // No progress: the names wanted may form a cycle (X takes Y's name while Y
                    // takes X's — the server renamed one of two same-name creates while the
                    // other moved). Setting one of the cycle aside lets the others move; it
                    // then takes its own new place in the next pass.
                    guard setAsideOneOfACycle(rest) else { skipped += rest.map(\.id); break }
                }
                pending = rest
            }
            return (actions, skipped, renamed)
        }
    }

    /// Among states that wait for a name held by another of them, or for a folder that is itself
    /// waiting, finds a cycle and unlinks the name of one of its items from its folder (lock
    /// held). That item is in `waiting`, so a later pass links it at its new place, which the
    /// cycle frees. False when there is no cycle. A cycle may run through a folder not here yet:
    /// a new folder F wants the name X holds, X wants the name Y holds, and Y moves into F.
    private func setAsideOneOfACycle(_ waiting: [RemoteState]) -> Bool {
        let ids = Set(waiting.map(\.id))
        // Each waiting state → the waiting item it waits for: the holder of the name it wants
        // (by name), or its folder when that is not here yet and waits too.
        var holder: [ItemID: (id: ItemID, byName: Bool)] = [:]
        for s in waiting where !s.deleted {
            guard let pnode = t.byID[s.parent], let p = t.nodes[pnode], p.isDir, p.linked else {
                if ids.contains(s.parent) { holder[s.id] = (s.parent, false) }
                continue
            }
            guard let occupant = p.children[s.name], let o = t.nodes[occupant], o.rec.id != s.id, ids.contains(o.rec.id) else { continue }
            holder[s.id] = (o.rec.id, true)
        }
        let byID = Dictionary(waiting.map { ($0.id, $0) }, uniquingKeysWith: { _, b in b })
        for start in holder.keys.sorted() {
            var path: [ItemID] = [start]
            var cur = start
            while let next = holder[cur]?.id {
                if let at = path.firstIndex(of: next) {
                    // The cycle is path[at...]. Only when every move in it is sure to go through in
                    // a later pass (else the one set aside could be left without a name).
                    let cycle = path[at...]
                    let movable = cycle.allSatisfy { id in
                        guard let st = byID[id] else { return false }
                        let target = t.byID[st.parent].flatMap { t.nodes[$0] }.flatMap { $0.isDir && $0.linked ? $0 : nil }
                        guard target != nil || ids.contains(st.parent) else { return false }
                        guard let node = t.byID[id], let n = t.nodes[node] else { return true }  // new here: made at its place
                        guard n.links.isEmpty else { return false }  // a linked name is split off first, alone
                        guard let p = t.nodes[n.parentNode], p.children[n.rec.name] == n.node else { return false }
                        if n.rec.kind == .file, st.resetContent, n.beingWritten || n.unnoticed { return false }
                        if let target, n.isDir, isInside(target, n) { return false }
                        return true
                    }
                    // The one set aside holds a name another of the cycle wants, and is here.
                    guard movable, let from = cycle.first(where: { holder[$0]?.byName == true }), let aside = holder[from]?.id,
                          let node = t.byID[aside], let n = t.nodes[node], let p = t.nodes[n.parentNode] else { return false }
                    p.children[n.rec.name] = nil  // `applyOne` moves it from here (its parent is unchanged)
                    return true
                }
                path.append(next)
                cur = next
            }
        }
        return false
    }

    /// The item's current local state, `nil` when it is gone (deleted here).
    public func placeGeneration(_ id: ItemID) -> UInt64? {
        lock.withLock { t.byID[id].flatMap { t.nodes[$0] }.map { $0.placeNoticed(id) } }
    }

    public func localState(_ id: ItemID) -> ItemRecord? {
        lock.withLock {
            guard let node = t.byID[id], let n = t.nodes[node], n.linked else { return nil }
            return n.record(id)
        }
    }

    /// The ids of the folders above `id`, nearest first, ending with the root (empty when unknown).
    public func ancestors(of id: ItemID) -> [ItemID] {
        lock.withLock {
            guard let node = t.byID[id], let n = t.nodes[node], n.node != .root else { return [] }
            var out: [ItemID] = []
            var p = n.place(id).parentNode
            while p != .root, let f = t.nodes[p] { out.append(f.rec.id); p = f.parentNode }
            out.append(.root)
            return out
        }
    }

    /// The ids of every item below folder `id` here, in id order (empty for a file or an unknown
    /// id): what the engine decides from it never depends on a dictionary's order.
    public func descendants(of id: ItemID) -> [ItemID] {
        lock.withLock {
            guard let node = t.byID[id], let n = t.nodes[node] else { return [] }
            var out: [ItemID] = []
            var stack = [n]
            while let f = stack.popLast() {
                for (name, c) in f.children {
                    guard let child = t.nodes[c] else { continue }
                    out.append(child.id(in: f.node, named: name))
                    if child.isDir { stack.append(child) }
                }
            }
            return out.sorted()
        }
    }

    public enum ReadPlan {
        /// Serve from the handle's file now.
        case direct
        /// Wait for the content provider to fetch the bytes of this item.
        case hydrate(ItemID)
        case fail(Errno)
    }

    /// How to serve a read through `handle`: a handle whose file was replaced by a remote version
    /// reads the old bytes it has (EIO for the rest); otherwise as `placeholder(node:range:)`.
    public func readPlan(node: NodeID, handle: HandleID, range: Range<Int64>) -> ReadPlan {
        guard lazyContent else { return .direct }
        let (stale, id) = lock.withLock { () -> (StaleHandle?, ItemID?) in
            if let s = t.stale[handle] { return (s, nil) }
            // A change the engine has not heard of yet (an editor's save that took over a
            // placeholder's identity) left its bytes here whole: never fetch the old ones over them.
            guard let n = t.nodes[node], n.rec.kind == .file, !n.unnoticed else { return (nil, nil) }
            return (nil, n.rec.id)
        }
        if let stale {
            guard let present = stale.present else { return .direct }
            return present(range) ? .direct : .fail(.EIO)
        }
        guard let id, !content.isPresent(id, range: range) else { return .direct }
        return .hydrate(id)
    }

    /// For a read answered after hydration: EIO when its handle went stale meanwhile and the old
    /// file lacks the bytes (the download went into the new file).
    public func staleReadError(handle: HandleID, range: Range<Int64>) -> Errno? {
        guard let stale = lock.withLock({ t.stale[handle] }), let present = stale.present else { return nil }
        return present(range) ? nil : .EIO
    }

    /// Whether a read of `range` must wait for the content provider; the item id if so.
    /// Local-only mounts never ask (no lock on the read path).
    func placeholder(node: NodeID, range: Range<Int64>) -> ItemID? {
        guard lazyContent else { return nil }
        let id = lock.withLock { () -> ItemID? in
            guard let n = t.nodes[node], n.rec.kind == .file, !n.unnoticed else { return nil }
            return n.rec.id
        }
        guard let id, !content.isPresent(id, range: range) else { return nil }
        return id
    }

    private enum ApplyResult { case done, waitForParent, waitForName, skip }

    /// One state (lock held).
    private func applyOne(_ s: RemoteState, _ actions: inout [KernelAction], _ renamed: inout [ItemID], _ applied: (ItemID) -> Void) -> ApplyResult {
        let now = options.clock.wall()
        var existing = t.byID[s.id].flatMap { t.nodes[$0] }.flatMap { $0.linked ? $0 : nil }
        if s.deleted {
            // A delete never takes a file written since its content was read for the commit
            // that brought this answer (a move committed against a delete elsewhere while a
            // program rewrote the file would lose the write with it; EngineSimTests).
            // Skipped: the write's upload commits on the old base, and wins as an edit.
            // Nor one the engine has not heard of yet (`noticesPending`).
            if let n = existing, n.rec.kind == .file,
               n.unnoticed || s.unlessWrittenSince.map({ $0 != n.writeGen }) == true { return .skip }
            applied(s.id)
            if let n = existing, let p = t.nodes[n.place(s.id).parentNode] { removeRemote(n, s.id, from: p, now: now, &actions) }
            return .done
        }
        if let n = existing, !n.links.isEmpty {
            // One name of a file hard-linked here (ShowRules.linkedName).
            let answer = s.sentPlace.map { sent in
                ShowRules.Answer(placeAsSent: s.parent == sent.parent && ItemName.same(s.name, sent.name),
                                 xattrsAsSent: s.xattrs == nil || s.xattrs == s.sentXattrs)
            }
            let held = n.rec.kind == .file && (n.beingWritten || n.unnoticed || s.unlessWrittenSince.map { $0 != n.writeGen } == true)
            switch ShowRules.linkedName(answer: answer, resetsContent: s.resetContent, heldHere: held) {
            case .nothingToShow:
                applied(s.id)
                return .done
            case .wait:
                return .skip
            case .takeOff(let copy):
                guard let fresh = splitOff(n, s.id, copyContent: copy, &actions) else { return .skip }
                existing = fresh
            case .showOnInode:
                break
            }
        }
        var s = existing.map { keepingLocalPlace(s, of: $0) } ?? s
        // Renamed or moved here after the engine planned this state, or while the notice of it
        // is on its way: the local place stays (the engine pushes it next, on this version).
        if let n = existing, !s.deleted, let parent = n.rec.parent, !Mutation.pullUndoesLocalMove.isOn,
           n.placeNoticed != n.placeGen || s.unlessMovedSince.map({ $0 != n.placeGen }) == true {
            s.parent = parent
            s.name = n.rec.name
        }
        guard let pnode = t.byID[s.parent], let p = t.nodes[pnode], p.isDir, p.linked else { return .waitForParent }
        // The control folder's name at the top is no item's: the server refuses it, and an item
        // that has it anyway (an older server) is not shown, so `.nimbus/` always works.
        if p.node == .root && ItemName.same(s.name, Self.controlName) { return .skip }
        if let n = existing {
            // Written here since the last close/fsync, or open for writing: the writer's close
            // queues an upload with the old base (the server keeps both) or lets the engine
            // apply the new version then; never replace bytes being written.
            // A change whose notice has not reached the engine yet (a rename over the file, a
            // close) is as unsynced as a write in progress.
            if n.rec.kind == .file && s.resetContent
                && (n.beingWritten || n.unnoticed || s.unlessWrittenSince.map { $0 != n.writeGen } == true) { return .skip }
            if n.rec.parent != s.parent || !ItemName.same(n.rec.name, s.name) {
                // Taken: perhaps by an item this batch moves away (retried after it); by a
                // local-only item, for good: the remote item takes the name beside it.
                if let occupant = p.children[s.name], occupant != n.node {
                    guard let beside = nameBeside(occupant, in: p, for: s.name, item: n.node) else { return .waitForName }
                    s.name = beside
                    renamed.append(s.id)
                }
                if n.isDir && isInside(p, n) { return .skip }
            }
            applied(s.id)
            let oldPath = pathLocked(n)
            if n.rec.parent != s.parent || !ItemName.same(n.rec.name, s.name) {
                if n.isDir || ItemName.same(n.rec.name, Self.ignoreFileName) { rulesChanged() }
                if let old = t.nodes[n.parentNode] {
                    // (Not there when set aside to break a cycle, and then maybe taken already.)
                    if old.children[n.rec.name] == n.node { old.children[n.rec.name] = nil }
                    if n.isDir { old.subdirs -= 1 }
                    actions.append(.entry(parent: old.node, name: n.rec.name))
                    actions.append(.node(old.node))  // its link count and times
                }
                p.children[s.name] = n.node
                if n.isDir { p.subdirs += 1 }
                n.parentNode = p.node
                n.rec.parent = s.parent
                n.rec.name = s.name
                n.placedBeside = renamed.last == s.id
                actions.append(.entry(parent: p.node, name: s.name))
                actions.append(.node(p.node))
            }
            n.rec.mode = (n.rec.mode & UInt32(S_IFMT)) | (s.perm & ItemLimits.syncedPermissions)
            n.rec.mtime = s.mtime
            n.rec.ctime = now
            if n.rec.kind == .symlink, let target = s.target {
                n.rec.target = target
                n.rec.size = Int64(target.utf8.count)
            }
            showXattrs(s, on: n)
            let newPath = pathLocked(n)
            if newPath != oldPath { events.append(.moved, origin: .remote, path: oldPath, to: newPath) }
            if n.rec.kind == .file && s.resetContent {
                events.append(.version, origin: .remote, path: newPath, detail: "v\(s.version)")
            } else if newPath == oldPath {
                events.append(.attributes, origin: .remote, path: newPath, detail: "v\(s.version)")
            }
            if n.rec.kind == .file && s.resetContent && !n.handles.isEmpty {
                replaceUnderReaders(n, in: p, with: s, &actions)
                return .done
            }
            if n.rec.kind == .file && s.resetContent {
                resetCacheFile(s.id)
                n.rec.size = s.size
                n.pagesStale = true
                n.dropPageStore()
            }
            persist(n)
            actions.append(.node(n.node))
            return .done
        }
        if let occupant = p.children[s.name] {
            guard let beside = nameBeside(occupant, in: p, for: s.name) else { return .waitForName }
            s.name = beside
            renamed.append(s.id)
        }
        let besideHere = renamed.last == s.id
        applied(s.id)
        let type: UInt32 = switch s.kind {
        case .file: UInt32(S_IFREG)
        case .folder: UInt32(S_IFDIR)
        case .symlink: UInt32(S_IFLNK)
        }
        let node = ids.newItemNode()
        // Remote items belong to the user running the mount (the server has no uids).
        var rec = ItemRecord(id: s.id, node: node, parent: s.parent, name: s.name, kind: s.kind,
                             mode: type | (s.kind == .symlink ? 0o777 : s.perm & ItemLimits.syncedPermissions), uid: owner.uid, gid: owner.gid,
                             size: s.kind == .file ? s.size : Int64(s.target?.utf8.count ?? 0), time: s.mtime, target: s.target)
        rec.ctime = now
        rec.dirty = false
        // (No cache file: a placeholder gets one when its content is first needed.)
        reclaimRetired(s.id)
        let n = Node(rec)
        n.parentNode = p.node
        n.placedBeside = besideHere
        t.nodes[node] = n
        t.byID[s.id] = node
        p.children[s.name] = node
        if s.kind == .folder { p.subdirs += 1 }
        store.enqueue(.upsert(rec))
        showXattrs(s, on: n)
        events.append(s.restored ? .restored : .created, origin: .remote, path: pathLocked(n), detail: "v\(s.version)")
        actions.append(.entry(parent: p.node, name: s.name))
        actions.append(.node(p.node))
        return .done
    }

    /// The state's user attributes become the item's (lock held), name by name, except those
    /// changed here since the commit this state answers (`sentXattrs`) or whose change is on its
    /// way to the engine: those are pushed next, on this version, and the server merges them name
    /// by name (`XattrRules.shown`). Attributes past the budget (set before it held) never sync
    /// and stay as they are.
    private func showXattrs(_ s: RemoteState, on n: Node) {
        guard let remote = s.xattrs,
              let shown = XattrRules.shown(remote, here: n.xattrs, isSymlink: n.rec.kind == .symlink,
                                           onItsWay: Set(n.xattrNotices.keys), sent: s.sentXattrs) else { return }
        for name in n.xattrs.keys where shown[name] == nil { store.enqueue(.removeXattr(s.id, name: name)) }
        for (name, value) in shown where n.xattrs[name] != value { store.enqueue(.setXattr(s.id, name: name, value: value)) }
        n.xattrs = shown
    }

    /// `s` with the item's local place and mode where they changed here since the commit that
    /// `s` answers was drafted (`sentPlace`; lock held).
    private func keepingLocalPlace(_ s: RemoteState, of n: Node) -> RemoteState {
        guard let sent = s.sentPlace else { return s }
        var s = s
        if let parent = n.rec.parent, parent != sent.parent || !ItemName.same(n.rec.name, sent.name) {
            s.parent = parent
            s.name = n.rec.name
        }
        let perm = n.rec.mode & ItemLimits.syncedPermissions
        if perm != sent.perm { s.perm = perm }
        return s
    }

    /// New content for a file that programs have open (lock held): the item moves to a new node
    /// (inode) with a new cache file; the old node keeps the open handles, its unlinked cache file,
    /// its size and its page cache, so those programs read the old bytes — consistently, never
    /// mixed with new ones — until they reopen. Reads of old bytes that were never downloaded
    /// fail with EIO (`StaleHandle`).
    private func replaceUnderReaders(_ n: Node, in p: Node, with s: RemoteState, _ actions: inout [KernelAction]) {
        for h in n.handles where t.stale[h] == nil { t.stale[h] = StaleHandle(present: s.oldPresent) }
        resetCacheFile(s.id)  // open descriptors keep the old file
        var rec = n.rec
        rec.node = ids.newItemNode()
        rec.size = s.size
        let fresh = Node(rec)
        fresh.xattrs = n.xattrs
        fresh.parentNode = p.node
        t.nodes[fresh.node] = fresh
        t.byID[s.id] = fresh.node
        p.children[s.name] = fresh.node
        n.linked = false
        persist(fresh)
        // The name now leads to the new node; the old node (and its cached pages) stays for
        // its handles and goes when they close and the kernel forgets it.
        actions.append(.entry(parent: p.node, name: s.name))
        actions.append(.node(p.node))
    }

    /// Removes a remotely deleted item and, for a folder, what is still in it here (lock held).
    /// The name a remote item takes when a local-only item (a FIFO, socket or device node, which
    /// the server never hears of) holds its name here: the name the server gives any taken name
    /// (`NAME 2.EXT`, ItemName.deduplicated). The local-only item keeps its name; the remote
    /// item's move to the new name is pushed like a rename made here (`applyRemote`), so every
    /// device shows it there. So for an item ignored here (`.nimbusignore`), whose changes stay
    /// here. Nil when `occupant` is neither (lock held).
    func nameBeside(_ occupant: NodeID, in p: Node, for name: String, item: NodeID? = nil) -> String? {
        guard let o = t.nodes[occupant],
              ShowRules.takenName(occupantLocalOnly: o.rec.isSpecial, occupantIgnored: !o.rec.isSpecial && ignoredLocked(o)) == .besideIt else { return nil }
        return ItemName(trusted: name).deduplicated { p.children[$0].map { $0 != item } ?? false }.value
    }

    private func removeRemote(_ n: Node, _ id: ItemID, from p: Node, now: Int64, _ actions: inout [KernelAction]) {
        for (name, c) in n.children {
            if let child = t.nodes[c] { removeRemote(child, child.id(in: n.node, named: name), from: n, now: now, &actions) }
        }
        let name = n.place(id).name
        unlinkName(n, id, from: p, now: now, origin: .remote)
        actions.append(.delete(parent: p.node, child: n.node, name: name))
        actions.append(.node(p.node))
        if n.linked { actions.append(.node(n.node)) }  // its link count
    }

    /// A new version's content is not here: its cache file goes, and is made (as holes of the
    /// new size) when the content is first needed — never for a placeholder nobody reads.
    private func resetCacheFile(_ id: ItemID) {
        store.cache.remove(id)
    }

    /// Opens the cache file of a file item, creating it with the item's size when it has none
    /// yet (a placeholder's first download or upload). Negative errno; ENOENT when the item is
    /// gone (its file is not made again).
    public func openCacheFile(_ item: ItemID) -> Int32 {
        lock.withLock {
            let fd = store.cache.open(item, create: false)
            guard fd == -ENOENT, let node = t.byID[item], let n = t.nodes[node], n.linked, n.rec.kind == .file else { return fd }
            // The names of a linked file each have a link to its content file: never a new one.
            if !n.links.isEmpty { return relinkCacheFile(n, item) ? store.cache.open(item, create: false) : fd }
            return store.cache.open(item, create: true, size: n.rec.size)
        }
    }

    /// Makes sure a file item's cache file exists (lock held).
    func materializeCacheFile(_ n: Node) {
        let fd = store.cache.open(n.rec.id, create: true, size: n.rec.size)
        if fd >= 0 { close(fd) }
    }
}
extension ContainerFS: MountedTree {}
