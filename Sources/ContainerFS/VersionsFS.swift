import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Synchronization

// `.nimbus/versions/PATH/` (docs/sync.md "Conflicts and versions"): a read-only mirror of the
// tree where every file is a folder listing its other versions (conflict and earlier ones),
// one read-only file each. `cat`/`cp` an entry streams that version from the server; `rm` of a
// conflict entry discards it on the server. Its nodes are numbered by the mount's `IDTable` at
// their first use (`.nimbus/versions` itself has a fixed id).
//
// Whatever needs the server — a file's version list, a version's bytes, a discard — answers
// through a callback (the FUSE adapter defers its reply), bounded by the engine's read timeout:
// no FUSE thread waits on the network. A version list is reused for 2 s so `ls -l` asks once.

/// What `.nimbus/versions/` reads of the tree it mirrors.
protocol VersionsTree: AnyObject, Sendable {
    /// The record of item `id` and whether it is linked; nil for an item not here.
    func mirrored(_ id: ItemID) -> (rec: ItemRecord, linked: Bool)?
    /// The linked children of folder `id` other than symlinks (ENOENT: no such folder here).
    func mirroredChildren(of id: ItemID) throws(Errno) -> [(name: String, id: ItemID, isDir: Bool)]
}

/// The `.nimbus/versions/` tree of one mount. It mirrors the item tree (`VersionsTree`) and asks
/// its `VersionSource` for the rest.
final class VersionsFS: Sendable {
    enum VNode: Hashable, Sendable {
        case mirror(ItemID)     // a folder (the root: `.nimbus/versions` itself)
        case versions(ItemID)   // a file: the folder of its versions
        case entry(ItemID, Int64)
    }
    struct State {
        var entries: [VNode: VersionEntry] = [:]
        var lists: [ItemID: (at: UInt64, list: [VersionEntry])] = [:]
        var readers: [HandleID: any VersionReader] = [:]
        /// Open listings, fixed at `opendir` (a listing may ask the server: it is never retaken),
        /// with what each listed node names.
        var listings: [HandleID: (snap: DirSnapshot, kids: [NodeID: VNode])] = [:]
    }
    let state = Mutex(State())
    let source: (any VersionSource)?
    private let ids: IDTable
    private let look: Presentation
    private let clock: MountClock
    /// The tree this mirrors (its filesystem owns this).
    private unowned let tree: any VersionsTree

    init(ids: IDTable, presentation: Presentation, clock: MountClock, tree: any VersionsTree, source: (any VersionSource)?) {
        self.ids = ids
        self.look = presentation
        self.clock = clock
        self.tree = tree
        self.source = source
    }

    func node(_ v: VNode) -> NodeID { ids.node(of: .versions(v)) }

    /// The name of a version entry: `report v7 laptop 2026-11-23T06-40-12Z conflict.txt`.
    static func entryName(_ fileName: String, _ e: VersionEntry) -> String {
        var stem = fileName, ext = ""
        if let dot = fileName.lastIndex(of: "."), dot != fileName.startIndex {
            stem = String(fileName[..<dot])
            ext = String(fileName[dot...])
        }
        var t = time_t(e.modified / 1_000_000_000)
        var tmv = tm()
        gmtime_r(&t, &tmv)
        let time = String(format: "%04d-%02d-%02dT%02d-%02d-%02dZ", tmv.tm_year + 1900, tmv.tm_mon + 1, tmv.tm_mday, tmv.tm_hour, tmv.tm_min, tmv.tm_sec)
        let device = e.device.replacingOccurrences(of: "/", with: "_")
        return "\(stem) v\(e.version) \(device) \(time)\(e.conflict ? " conflict" : "")\(ext)"
    }

    // MARK: attributes (from memory)

    func attr(_ v: VNode) throws(Errno) -> stat {
        // Each node carries the owner and permissions of the item it mirrors, so the kernel
        // (default_permissions) lets a user into `.nimbus/versions/PATH/` exactly where it lets
        // the user into PATH: a folder's search bit, a file's read bit. Nothing is writable but a
        // file's versions folder for who may write the file (`rm` of an entry resolves).
        let id: ItemID = switch v { case .mirror(let i), .versions(let i), .entry(let i, _): i }
        let node = node(v)
        if id == .root { return look.folderAttr(node) }
        guard let rec = tree.mirrored(id)?.rec else { throw .ENOENT }
        var st = stat()
        st.node = node
        st.st_uid = rec.uid
        st.st_gid = rec.gid
        st.st_blksize = 4096
        var ts = ContainerFS.ts(look.mountTime)
        let perm = rec.mode & 0o777
        switch v {
        case .entry:
            guard let e = state.withLock({ $0.entries[v] }) else { throw .ENOENT }
            st.st_mode = S_IFREG | (perm & 0o444)
            st.st_nlink = 1
            st.st_size = Int(e.size)
            st.st_blocks = Int(e.size / 512 + (e.size % 512 == 0 ? 0 : 1))
            ts = ContainerFS.ts(e.modified)
        case .versions:
            // r on the file → r-x on its versions folder; w on the file → w (discard a conflict).
            let readable = perm & 0o444
            st.st_mode = S_IFDIR | readable | (readable >> 2) | (perm & 0o222)
            st.st_nlink = 2
            st.st_size = 4096
        case .mirror:
            st.st_mode = S_IFDIR | (perm & 0o555)
            st.st_nlink = 2
            st.st_size = 4096
        }
        st.st_atim = ts; st.st_mtim = ts; st.st_ctim = ts
        return st
    }

    func entry(_ v: VNode) throws(Errno) -> FuseEntry { look.entry(node(v), try attr(v)) }

    // MARK: listings (may ask the server)

    /// The other versions of `item` (from the server; a listing younger than 2 s is reused).
    func list(_ item: ItemID, done: @escaping @Sendable (Result<[VersionEntry], Errno>) -> Void) {
        if let cached = state.withLock({ $0.lists[item] }), clock.monotonic() &- cached.at < 2_000_000_000 {
            return done(.success(cached.list))
        }
        guard let source else { return done(.success([])) }
        source.versionEntries(item) { [self] r in
            if case .success(let list) = r { state.withLock { $0.lists[item] = (clock.monotonic(), list) } }
            done(r)
        }
    }

    /// The children of a versions folder: (name, node).
    func children(_ v: VNode, done: @escaping @Sendable (Result<[(name: String, v: VNode)], Errno>) -> Void) {
        switch v {
        case .mirror(let id):
            let kids: [(name: String, id: ItemID, isDir: Bool)]
            do { kids = try tree.mirroredChildren(of: id) } catch { return done(.failure(error)) }
            done(.success(kids.map { k in (k.name, k.isDir ? .mirror(k.id) : .versions(k.id)) }))
        case .versions(let id):
            guard let (rec, linked) = tree.mirrored(id), linked else { return done(.failure(.ENOENT)) }
            list(id) { [self] r in
                done(r.map { list in
                    list.map { e in
                        let kid = VNode.entry(id, e.version)
                        state.withLock { $0.entries[kid] = e }
                        return (Self.entryName(rec.name, e), kid)
                    }
                })
            }
        case .entry:
            done(.failure(.ENOTDIR))
        }
    }

    func lookup(parent: VNode, name: String, done: @escaping @Sendable (Result<FuseEntry, Errno>) -> Void) {
        children(parent) { [self] r in
            done(r.flatMap { kids in
                guard let child = kids.first(where: { ItemName.same($0.name, name) }) else { return .failure(.ENOENT) }
                return Result { () throws(Errno) in try entry(child.v) }
            })
        }
    }

    /// Opens a versions folder: its listing is taken now (readdir serves it from memory).
    func opendir(_ v: VNode, done: @escaping @Sendable (Result<HandleID, Errno>) -> Void) {
        let here = node(v)
        let up = v == .mirror(.root) ? ids.node(of: .control(.folder)) : node(.mirror(.root))
        children(v) { [self] r in
            done(r.map { kids in
                let named = kids.map { (name: $0.name, node: node($0.v), v: $0.v) }
                let snap = DirSnapshot(node: here, entries: [(".", here), ("..", up)] + named.map { ($0.name, $0.node) })
                let byNode = Dictionary(named.map { ($0.node, $0.v) }, uniquingKeysWith: { a, _ in a })
                let h = ids.newHandle(.versions)
                state.withLock { $0.listings[h] = (snap, byNode) }
                return h
            })
        }
    }

    func readdir(handle: HandleID, offset: Int64, plus: Bool, room: Int) throws(Errno) -> [DirEntry] {
        guard offset >= 0 else { throw .EINVAL }
        guard let (snap, kids) = state.withLock({ $0.listings[handle] }) else { throw .EBADF }
        return snap.page(from: offset, room: room, plus: plus) { child, isDot in
            // (The kernel takes nothing from dot entries but their type.)
            if isDot { return look.entry(child, look.folderAttr(child)) }
            return kids[child].flatMap { try? entry($0) }  // nil: gone since the listing was taken
        }
    }

    // MARK: version content (streamed from the server)

    /// Opens an entry read-only; its bytes are fetched as they are read (`read`).
    func open(_ v: VNode, flags: Int32, done: @escaping @Sendable (Result<FuseOpen, Errno>) -> Void) {
        guard case .entry(let id, let version) = v else { return done(.failure(.EISDIR)) }
        if flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0 { return done(.failure(.EROFS)) }
        guard let source else { return done(.failure(.ENOENT)) }
        source.openVersion(id, version: version) { [self] r in
            done(r.map { reader in
                let h = ids.newHandle(.versions)
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

    /// Releases an open version or listing.
    func release(handle: HandleID) {
        ids.release(handle)
        state.withLock { s in
            s.readers[handle] = nil
            s.listings[handle] = nil
        }
    }

    // MARK: discarding a conflict

    /// `rm` of an entry: a conflict version is discarded on the server; history stays (EPERM).
    func unlink(parent: VNode, name: String, done: @escaping @Sendable (Errno?) -> Void) {
        guard case .versions(let id) = parent else { return done(.EPERM) }
        children(parent) { [self] r in
            let kids: [(name: String, v: VNode)]
            switch r {
            case .failure(let e): return done(e)
            case .success(let k): kids = k
            }
            guard let child = kids.first(where: { ItemName.same($0.name, name) }),
                  let e = state.withLock({ $0.entries[child.v] }) else { return done(.ENOENT) }
            guard e.conflict, let source else { return done(.EPERM) }
            source.resolve(.discard, value: "\(e.version)", item: id) { [self] error in
                state.withLock { _ = $0.lists.removeValue(forKey: id) }
                done(error)
            }
        }
    }
}

extension ContainerFS: VersionsTree {
    func mirrored(_ id: ItemID) -> (rec: ItemRecord, linked: Bool)? {
        lock.withLock { t.byID[id].flatMap { t.nodes[$0] }.map { ($0.record(id), $0.linked) } }
    }

    func mirroredChildren(of id: ItemID) throws(Errno) -> [(name: String, id: ItemID, isDir: Bool)] {
        try lock.withLock { () throws(Errno) -> [(name: String, id: ItemID, isDir: Bool)] in
            guard let fn = t.byID[id], let f = t.nodes[fn], f.isDir else { throw .ENOENT }
            return f.children.compactMap { name, child in
                guard let c = t.nodes[child], c.linked, c.rec.kind != .symlink else { return nil }
                return (name, c.id(in: fn, named: name), c.isDir)
            }
        }
    }
}
