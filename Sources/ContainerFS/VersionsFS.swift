import FuseKit
import Glibc
import MountPorts
import NimbusCore
import Synchronization

// `.nimbus/versions/PATH/` (docs/sync.md "Conflicts and versions"): a read-only mirror of the
// tree where every file is a folder listing its other versions (conflict and earlier ones),
// one read-only file each. `cat`/`cp` an entry streams that version from the server; `rm` of a
// conflict entry discards it on the server. Its nodes are numbered in `versionsNodes`.
//
// Whatever needs the server — a file's version list, a version's bytes, a discard — answers
// through a callback (the FUSE adapter defers its reply), bounded by the engine's read timeout:
// no FUSE thread waits on the network. A version list is reused for 2 s so `ls -l` asks once.

/// The `.nimbus/versions/` tree of one mount. It mirrors the item tree of its `ContainerFS`
/// (read under that filesystem's lock) and asks its `VersionSource` for the rest.
final class VersionsFS: Sendable {
    enum VNode: Hashable, Sendable {
        case mirror(ItemID)     // a folder (the root: `.nimbus/versions` itself)
        case versions(ItemID)   // a file: the folder of its versions
        case entry(ItemID, Int64)
    }
    struct State {
        var byNode: [NodeID: VNode] = [:]
        var byKey: [VNode: NodeID] = [:]
        var next = ContainerFS.versionsNodes.lowerBound
        var entries: [NodeID: VersionEntry] = [:]
        var lists: [ItemID: (at: UInt64, list: [VersionEntry])] = [:]
        var readers: [HandleID: any VersionReader] = [:]
        /// The last handle given out.
        var lastHandle = ContainerFS.versionHandles.lowerBound
    }
    let state = Mutex(State())
    let source: (any VersionSource)?
    /// The filesystem this tree mirrors (it owns this tree).
    unowned let fs: ContainerFS

    init(fs: ContainerFS, source: (any VersionSource)?) {
        self.fs = fs
        self.source = source
    }

    func node(_ v: VNode) -> NodeID {
        if case .mirror(let id) = v, id == .root { return ContainerFS.controlVersionsNode }
        return state.withLock { s in
            if let n = s.byKey[v] { return n }
            let n = s.next
            s.next = n.successor
            s.byKey[v] = n
            s.byNode[n] = v
            return n
        }
    }

    func vnode(_ n: NodeID) -> VNode? {
        if n == ContainerFS.controlVersionsNode { return .mirror(.root) }
        return state.withLock { $0.byNode[n] }
    }

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

    func attr(_ node: NodeID) throws(Errno) -> stat {
        try fs.lock.withLock { () throws(Errno) -> stat in try attrLocked(node) }
    }

    /// `attr` with the filesystem's lock held (readdir fills entries under it).
    func attrLocked(_ node: NodeID) throws(Errno) -> stat {
        guard let v = vnode(node) else { throw .ENOENT }
        // Each node carries the owner and permissions of the item it mirrors, so the kernel
        // (default_permissions) lets a user into `.nimbus/versions/PATH/` exactly where it lets
        // the user into PATH: a folder's search bit, a file's read bit. Nothing is writable but a
        // file's versions folder for who may write the file (`rm` of an entry resolves).
        let id: ItemID = switch v { case .mirror(let i), .versions(let i), .entry(let i, _): i }
        guard let rec = id == .root ? nil : fs.t.byID[id].flatMap({ fs.t.nodes[$0] }).map(\.rec) else {
            if id == .root { return fs.control.attr(ContainerFS.controlVersionsNode) }
            throw .ENOENT
        }
        var st = stat()
        st.node = node
        st.st_uid = rec.uid
        st.st_gid = rec.gid
        st.st_blksize = 4096
        var ts = ContainerFS.ts(fs.mountTime)
        let perm = rec.mode & 0o777
        switch v {
        case .entry:
            guard let e = state.withLock({ $0.entries[node] }) else { throw .ENOENT }
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

    func entry(_ node: NodeID) throws(Errno) -> FuseEntry {
        FuseEntry(node: node, attr: try attr(node), attrTimeout: fs.options.attrTimeout, entryTimeout: fs.options.entryTimeout)
    }

    /// `entry` with the filesystem's lock held.
    func entryLocked(_ node: NodeID) throws(Errno) -> FuseEntry {
        FuseEntry(node: node, attr: try attrLocked(node), attrTimeout: fs.options.attrTimeout, entryTimeout: fs.options.entryTimeout)
    }

    // MARK: listings (may ask the server)

    /// The other versions of `item` (from the server; a listing younger than 2 s is reused).
    func list(_ item: ItemID, done: @escaping @Sendable (Result<[VersionEntry], Errno>) -> Void) {
        if let cached = state.withLock({ $0.lists[item] }), fs.options.clock.monotonic() &- cached.at < 2_000_000_000 {
            return done(.success(cached.list))
        }
        guard let source else { return done(.success([])) }
        source.versionEntries(item) { [self] r in
            if case .success(let list) = r { state.withLock { $0.lists[item] = (fs.options.clock.monotonic(), list) } }
            done(r)
        }
    }

    /// The children of a versions folder: (name, node), registering their nodes.
    func children(_ node: NodeID, done: @escaping @Sendable (Result<[(name: String, node: NodeID)], Errno>) -> Void) {
        guard let v = vnode(node) else { return done(.failure(.ENOENT)) }
        switch v {
        case .mirror(let id):
            let kids: [(String, ItemID, Bool)]
            do {
                kids = try fs.lock.withLock { () throws(Errno) -> [(String, ItemID, Bool)] in
                    guard let fn = fs.t.byID[id], let f = fs.t.nodes[fn], f.isDir else { throw .ENOENT }
                    return f.children.compactMap { name, child in
                        guard let c = fs.t.nodes[child], c.linked, c.rec.kind != .symlink else { return nil }
                        return (name, c.rec.id, c.isDir)
                    }
                }
            } catch { return done(.failure(error)) }
            done(.success(kids.map { name, id, isDir in (name, self.node(isDir ? .mirror(id) : .versions(id))) }))
        case .versions(let id):
            let name: String
            do {
                name = try fs.lock.withLock { () throws(Errno) -> String in
                    guard let fn = fs.t.byID[id], let f = fs.t.nodes[fn], f.linked else { throw .ENOENT }
                    return f.rec.name
                }
            } catch { return done(.failure(error)) }
            list(id) { [self] r in
                done(r.map { list in
                    list.map { e in
                        let n = self.node(.entry(id, e.version))
                        state.withLock { $0.entries[n] = e }
                        return (Self.entryName(name, e), n)
                    }
                })
            }
        case .entry:
            done(.failure(.ENOTDIR))
        }
    }

    func lookup(parent: NodeID, name: String, done: @escaping @Sendable (Result<FuseEntry, Errno>) -> Void) {
        children(parent) { [self] r in
            done(r.flatMap { kids in
                guard let child = kids.first(where: { ItemName.same($0.name, name) }) else { return .failure(.ENOENT) }
                return Result { () throws(Errno) in try entry(child.node) }
            })
        }
    }

    /// Opens a versions folder: its listing is taken now (readdir serves it from memory).
    func opendir(_ node: NodeID, done: @escaping @Sendable (Result<HandleID, Errno>) -> Void) {
        let up = node == ContainerFS.controlVersionsNode ? ContainerFS.controlDirNode : ContainerFS.controlVersionsNode
        children(node) { [fs] r in
            done(r.map { kids in
                let snap = DirSnapshot(node: node, entries: [(".", node), ("..", up)] + kids)
                return fs.lock.withLock { () -> HandleID in
                    let h = fs.t.newDirHandle()
                    fs.t.dirs[h] = snap
                    return h
                }
            })
        }
    }

    // MARK: version content (streamed from the server)

    /// Opens an entry read-only; its bytes are fetched as they are read (`read`).
    func open(_ node: NodeID, flags: Int32, done: @escaping @Sendable (Result<FuseOpen, Errno>) -> Void) {
        guard case .entry(let id, let version)? = vnode(node) else { return done(.failure(.EISDIR)) }
        if flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0 { return done(.failure(.EROFS)) }
        guard let source else { return done(.failure(.ENOENT)) }
        source.openVersion(id, version: version) { [self] r in
            done(r.map { reader in
                let h = state.withLock { s -> HandleID in
                    s.lastHandle = s.lastHandle.successor
                    s.readers[s.lastHandle] = reader
                    return s.lastHandle
                }
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
        state.withLock { _ = $0.readers.removeValue(forKey: handle) }
    }

    // MARK: discarding a conflict

    /// `rm` of an entry: a conflict version is discarded on the server; history stays (EPERM).
    func unlink(parent: NodeID, name: String, done: @escaping @Sendable (Errno?) -> Void) {
        guard case .versions(let id)? = vnode(parent) else { return done(.EPERM) }
        children(parent) { [self] r in
            let kids: [(name: String, node: NodeID)]
            switch r {
            case .failure(let e): return done(e)
            case .success(let k): kids = k
            }
            guard let child = kids.first(where: { ItemName.same($0.name, name) }),
                  let e = state.withLock({ $0.entries[child.node] }) else { return done(.ENOENT) }
            guard e.conflict, let source else { return done(.EPERM) }
            source.resolve(.discard, value: "\(e.version)", item: id) { [self] error in
                state.withLock { _ = $0.lists.removeValue(forKey: id) }
                done(error)
            }
        }
    }
}

extension ContainerFS {
    /// `.nimbus/versions` itself (a node of `.nimbus/`'s reserved range).
    static let controlVersionsNode = NodeID(rawValue: 7)
    /// The nodes below `.nimbus/versions` (above every item's).
    static let versionsNodes = NodeID(rawValue: 1 << 48)...

    static func isVersionsNode(_ n: NodeID) -> Bool { n == controlVersionsNode || versionsNodes.contains(n) }
}
