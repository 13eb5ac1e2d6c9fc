import FuseKit
import Glibc
import MountPorts
import NimbusCore
import Synchronization

// `.nimbus/trash/` (docs/trash.md): Recently Deleted as a read-only tree. Each entry appears
// under the path it had, its name stamped with the deletion time so two deletions of one path
// never collide (`report 2026-11-27T14-20-00Z.txt`, `dir 2026-11-27T14-20-00Z/`); the folders
// on the way are the names those folders had. A deleted folder's entry holds the items deleted
// with it under their own names. `cat`/`cp` streams a file from the server; `rm` of a file entry
// and `rmdir` of a folder entry purge it (for the mount's owner, who owns the tree's folders).
//
// Everything comes from the server through the `VersionSource` (deferred replies, bounded by
// the engine's read timeout); the entry list and each entry's items are reused for 2 s.

final class TrashFS: Sendable {
    enum TNode: Hashable, Sendable {
        /// A folder on the way to entries ("/" is `.nimbus/trash` itself).
        case folder(String)
        /// An entry: a file, or a folder holding its items.
        case entry(ItemID)
        /// An item inside a folder entry.
        case member(root: ItemID, ItemID)
    }
    struct State {
        var entries: (at: UInt64, list: [TrashEntryInfo])?
        var members: [ItemID: (at: UInt64, list: [TrashMemberInfo])] = [:]
        var readers: [HandleID: any VersionReader] = [:]
        var listings: [HandleID: (snap: DirSnapshot, kids: [NodeID: TNode])] = [:]
    }
    let state = Mutex(State())
    private let source: (any VersionSource)?
    private let ids: IDTable
    private let look: Presentation
    private let clock: MountClock

    init(ids: IDTable, presentation: Presentation, clock: MountClock, source: (any VersionSource)?) {
        self.ids = ids
        self.look = presentation
        self.clock = clock
        self.source = source
    }

    func node(_ t: TNode) -> NodeID { ids.node(of: .trash(t)) }

    /// `NAME YYYY-MM-DDTHH-MM-SSZ.EXT` (a folder: no extension split).
    static func entryName(_ name: String, deletedAt: Int64, isFolder: Bool) -> String {
        var stem = name, ext = ""
        if !isFolder, let dot = name.lastIndex(of: "."), dot != name.startIndex {
            stem = String(name[..<dot])
            ext = String(name[dot...])
        }
        var t = time_t(deletedAt / 1_000_000_000)
        var tmv = tm()
        gmtime_r(&t, &tmv)
        let time = String(format: "%04d-%02d-%02dT%02d-%02d-%02dZ", tmv.tm_year + 1900, tmv.tm_mon + 1, tmv.tm_mday, tmv.tm_hour, tmv.tm_min, tmv.tm_sec)
        return "\(stem) \(time)\(ext)"
    }

    // MARK: what the server says (reused 2 s)

    private func fresh(_ at: UInt64) -> Bool { clock.monotonic() &- at < 2_000_000_000 }

    func entries(done: @escaping @Sendable (Result<[TrashEntryInfo], Errno>) -> Void) {
        if let c = state.withLock({ $0.entries }), fresh(c.at) { return done(.success(c.list)) }
        guard let source else { return done(.success([])) }
        source.trashEntries { [self] r in
            if case .success(let list) = r { state.withLock { $0.entries = (clock.monotonic(), list) } }
            done(r)
        }
    }

    func members(_ root: ItemID, done: @escaping @Sendable (Result<[TrashMemberInfo], Errno>) -> Void) {
        if let c = state.withLock({ $0.members[root] }), fresh(c.at) { return done(.success(c.list)) }
        guard let source else { return done(.failure(.ENOENT)) }
        source.trashMembers(root) { [self] r in
            if case .success(let list) = r { state.withLock { $0.members[root] = (clock.monotonic(), list) } }
            done(r)
        }
    }

    /// The children of `t`: (name, node).
    func children(_ t: TNode, done: @escaping @Sendable (Result<[(name: String, t: TNode)], Errno>) -> Void) {
        switch t {
        case .folder(let path):
            entries { r in
                done(r.map { list in Self.folderChildren(path, list) })
            }
        case .entry(let root), .member(root: let root, _):
            let folder: ItemID = if case .member(_, let id) = t { id } else { root }
            members(root) { r in
                done(r.flatMap { list in
                    guard let me = list.first(where: { $0.id == folder }), me.isFolder else { return .failure(.ENOTDIR) }
                    return .success(list.filter { $0.parent == folder && $0.id != root && !$0.isSymlink }.map { ($0.name, .member(root: root, $0.id)) })
                })
            }
        }
    }

    /// What folder `path` of the tree shows: entries whose folder is `path`, and the next folder
    /// on the way to the deeper ones. Names that would repeat get the entry's id.
    static func folderChildren(_ path: String, _ list: [TrashEntryInfo]) -> [(name: String, t: TNode)] {
        let prefix = path == "/" ? "/" : path + "/"
        var out: [(name: String, t: TNode)] = []
        var folders = Set<String>()
        var taken = Set<String>()
        for e in list where e.path.hasPrefix(prefix) {
            let rest = e.path.dropFirst(prefix.count)
            if let slash = rest.firstIndex(of: "/") {
                let name = String(rest[..<slash])
                if folders.insert(name).inserted { out.append((name, .folder(prefix + name))) }
            } else {
                var name = entryName(String(rest), deletedAt: e.deletedAt, isFolder: e.isFolder)
                if !taken.insert(name).inserted { name += " " + String(e.id.description.prefix(8)) }
                taken.insert(name)
                out.append((name, .entry(e.id)))
            }
        }
        return out
    }

    // MARK: attributes

    func attr(_ t: TNode, done: @escaping @Sendable (Result<stat, Errno>) -> Void) {
        switch t {
        case .folder:
            var st = look.folderAttr(node(t))
            st.st_mode = S_IFDIR | 0o755  // the owner may purge what is inside
            done(.success(st))
        case .entry(let root):
            entries { [self] r in
                done(r.flatMap { list in
                    guard let e = list.first(where: { $0.id == root }) else { return .failure(.ENOENT) }
                    return .success(stat(node(t), isFolder: e.isFolder, size: e.size, mode: e.mode, modified: e.modified))
                })
            }
        case .member(let root, let id):
            members(root) { [self] r in
                done(r.flatMap { list in
                    guard let m = list.first(where: { $0.id == id }) else { return .failure(.ENOENT) }
                    return .success(stat(node(t), isFolder: m.isFolder, size: m.size, mode: m.mode, modified: m.modified))
                })
            }
        }
    }

    private func stat(_ node: NodeID, isFolder: Bool, size: Int64, mode: UInt32, modified: Int64) -> stat {
        var st = Glibc.stat()
        st.node = node
        st.st_uid = look.uid
        st.st_gid = look.gid
        st.st_blksize = 4096
        let perm = mode & 0o555
        if isFolder {
            // A folder entry: its owner may remove it (rmdir purges), and enter it.
            st.st_mode = S_IFDIR | perm | 0o500 | 0o200
            st.st_nlink = 2
            st.st_size = 4096
        } else {
            st.st_mode = S_IFREG | (perm & 0o444)
            st.st_nlink = 1
            st.st_size = Int(size)
            st.st_blocks = Int(size / 512 + (size % 512 == 0 ? 0 : 1))
        }
        let ts = ContainerFS.ts(modified)
        st.st_atim = ts; st.st_mtim = ts; st.st_ctim = ts
        return st
    }

    func lookup(parent: TNode, name: String, done: @escaping @Sendable (Result<FuseEntry, Errno>) -> Void) {
        children(parent) { [self] r in
            let kids: [(name: String, t: TNode)]
            switch r {
            case .failure(let e): return done(.failure(e))
            case .success(let k): kids = k
            }
            guard let child = kids.first(where: { ItemName.same($0.name, name) }) else { return done(.failure(.ENOENT)) }
            attr(child.t) { [self] a in done(a.map { look.entry(node(child.t), $0) }) }
        }
    }

    // MARK: listings

    func opendir(_ t: TNode, parent up: NodeID, done: @escaping @Sendable (Result<HandleID, Errno>) -> Void) {
        let here = node(t)
        children(t) { [self] r in
            let kids: [(name: String, t: TNode)]
            switch r {
            case .failure(let e): return done(.failure(e))
            case .success(let k): kids = k
            }
            // Each child's attributes are known now (the same 2 s lists): readdirplus needs them.
            prefetch(kids.map(\.t)) { [self] in
                let named = kids.map { (name: $0.name, node: node($0.t), t: $0.t) }
                let snap = DirSnapshot(node: here, entries: [(".", here), ("..", up)] + named.map { ($0.name, $0.node) })
                let byNode = Dictionary(named.map { ($0.node, $0.t) }, uniquingKeysWith: { a, _ in a })
                let h = ids.newHandle(.trash)
                state.withLock { $0.listings[h] = (snap, byNode) }
                done(.success(h))
            }
        }
    }

    /// Fetches what the attributes of `nodes` need (the entry list, the items of their entries).
    private func prefetch(_ nodes: [TNode], then: @escaping @Sendable () -> Void) {
        let roots = Set(nodes.compactMap { t -> ItemID? in if case .member(let r, _) = t { r } else { nil } })
        guard let root = roots.first else { return entries { _ in then() } }
        members(root) { _ in then() }
    }

    func readdir(handle: HandleID, offset: Int64, plus: Bool, room: Int) throws(Errno) -> [DirEntry] {
        guard offset >= 0 else { throw .EINVAL }
        guard let (snap, kids) = state.withLock({ $0.listings[handle] }) else { throw .EBADF }
        return snap.page(from: offset, room: room, plus: plus) { [self] child, isDot in
            if isDot { return look.entry(child, look.folderAttr(child)) }
            guard let t = kids[child], let st = cachedAttr(t) else { return nil }
            return look.entry(child, st)
        }
    }

    /// Attributes from the lists at hand (readdir must not wait on the network).
    private func cachedAttr(_ t: TNode) -> stat? {
        switch t {
        case .folder:
            var st = look.folderAttr(node(t))
            st.st_mode = S_IFDIR | 0o755
            return st
        case .entry(let root):
            guard let e = state.withLock({ $0.entries?.list.first { $0.id == root } }) else { return nil }
            return stat(node(t), isFolder: e.isFolder, size: e.size, mode: e.mode, modified: e.modified)
        case .member(let root, let id):
            guard let m = state.withLock({ $0.members[root]?.list.first { $0.id == id } }) else { return nil }
            return stat(node(t), isFolder: m.isFolder, size: m.size, mode: m.mode, modified: m.modified)
        }
    }

    // MARK: content

    func open(_ t: TNode, flags: Int32, done: @escaping @Sendable (Result<FuseOpen, Errno>) -> Void) {
        if flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0 { return done(.failure(.EROFS)) }
        guard let source else { return done(.failure(.ENOENT)) }
        let (root, item): (ItemID, ItemID)
        switch t {
        case .folder: return done(.failure(.EISDIR))
        case .entry(let r): (root, item) = (r, r)
        case .member(let r, let i): (root, item) = (r, i)
        }
        source.openTrashFile(root, item: item) { [self] r in
            done(r.map { reader in
                let h = ids.newHandle(.trash)
                state.withLock { $0.readers[h] = reader }
                return FuseOpen(handle: h, keepCache: false, directIO: true)
            })
        }
    }

    func read(handle: HandleID, offset: Int64, size: Int, done: @escaping @Sendable (Result<[UInt8], Errno>) -> Void) {
        guard offset >= 0, size >= 0, offset <= Int64.max - Int64(size) else { return done(.failure(.EINVAL)) }
        guard let reader = state.withLock({ $0.readers[handle] }) else { return done(.failure(.EBADF)) }
        reader.read(offset..<(offset + Int64(size)), done: done)
    }

    func release(handle: HandleID) {
        ids.release(handle)
        state.withLock { s in
            s.readers[handle] = nil
            s.listings[handle] = nil
        }
    }

    // MARK: attributes of an entry

    /// What `getfattr` reads on an entry (`user.nimbus.itemid`, and `user.nimbus.trash.deleted`,
    /// `.deleted-by`, `.expires`: UTC times and the device's name) and on an item inside one
    /// (`user.nimbus.itemid`).
    static let entryXattrs = ["user.nimbus.itemid", "user.nimbus.trash.deleted", "user.nimbus.trash.deleted-by", "user.nimbus.trash.expires"]

    func listxattr(_ t: TNode) -> [UInt8] {
        let names: [String] = switch t {
        case .folder: []
        case .entry: Self.entryXattrs
        case .member: ["user.nimbus.itemid"]
        }
        return names.flatMap { Array($0.utf8) + [0] }
    }

    func xattr(_ t: TNode, name: String, done: @escaping @Sendable (Result<[UInt8], Errno>) -> Void) {
        switch t {
        case .folder: done(.failure(.ENODATA))
        case .member(_, let id): done(name == "user.nimbus.itemid" ? .success(Array(id.description.utf8)) : .failure(.ENODATA))
        case .entry(let root):
            guard Self.entryXattrs.contains(name) else { return done(.failure(.ENODATA)) }
            entries { r in
                done(r.flatMap { list in
                    guard let e = list.first(where: { $0.id == root }) else { return .failure(.ENOENT) }
                    let text = switch name {
                    case "user.nimbus.itemid": e.id.description
                    case "user.nimbus.trash.deleted": Self.utc(e.deletedAt)
                    case "user.nimbus.trash.deleted-by": e.device
                    default: Self.utc(e.expires)
                    }
                    return .success(Array(text.utf8))
                })
            }
        }
    }

    static func utc(_ ns: Int64) -> String {
        var t = time_t(ns / 1_000_000_000)
        var tmv = tm()
        gmtime_r(&t, &tmv)
        return String(format: "%04d-%02d-%02dT%02d:%02d:%02dZ", tmv.tm_year + 1900, tmv.tm_mon + 1, tmv.tm_mday, tmv.tm_hour, tmv.tm_min, tmv.tm_sec)
    }

    // MARK: purging

    /// `rm` of a file entry, `rmdir` of a folder entry (`folder` says which was asked): purged
    /// on the server. Anything else in the tree: EPERM.
    func remove(parent: TNode, name: String, folder: Bool, done: @escaping @Sendable (Errno?) -> Void) {
        guard case .folder = parent, let source else { return done(.EPERM) }
        children(parent) { [self] r in
            let kids: [(name: String, t: TNode)]
            switch r {
            case .failure(let e): return done(e)
            case .success(let k): kids = k
            }
            guard let child = kids.first(where: { ItemName.same($0.name, name) }) else { return done(.ENOENT) }
            guard case .entry(let root) = child.t else { return done(folder ? .EPERM : .EISDIR) }
            let isFolder = state.withLock { $0.entries?.list.first { $0.id == root }?.isFolder } ?? false
            if isFolder != folder { return done(folder ? .ENOTDIR : .EISDIR) }
            source.purgeTrash(root) { [self] error in
                state.withLock { $0.entries = nil; $0.members[root] = nil }
                done(error)
            }
        }
    }
}
