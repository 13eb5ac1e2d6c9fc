import FuseKit
import Glibc
import NimbusCore
import Synchronization

// `.nimbus/versions/PATH/` (docs/sync.md "Conflicts and versions"): a read-only mirror of the
// tree where every file is a folder listing its other versions (conflict and earlier ones),
// one read-only file each. `cat`/`cp` an entry downloads that version; `rm` of a conflict entry
// discards it on the server. Nodes live above `virtualBase`; listing a file's versions asks the
// server (bounded by the read timeout; `EIO` offline) and is reused for 2 s so `ls -l` asks once.

/// One non-current version of a file, as `.nimbus/versions/PATH/` lists it.
public struct VersionEntry: Sendable, Hashable {
    public let version: Int64
    public let device: String
    /// Modification time of that content, ns since 1970 UTC.
    public let modified: Int64
    public let size: Int64
    public let conflict: Bool
    public init(version: Int64, device: String, modified: Int64, size: Int64, conflict: Bool) {
        self.version = version
        self.device = device
        self.modified = modified
        self.size = size
        self.conflict = conflict
    }
}

final class VersionsTree: Sendable {
    enum VNode: Hashable, Sendable {
        case mirror(ItemID)     // a folder (the root: `.nimbus/versions` itself)
        case versions(ItemID)   // a file: the folder of its versions
        case entry(ItemID, Int64)
    }
    struct State {
        var byNode: [UInt64: VNode] = [:]
        var byKey: [VNode: UInt64] = [:]
        var next = ContainerFS.virtualBase
        var entries: [UInt64: VersionEntry] = [:]
        var lists: [ItemID: (at: ContinuousClock.Instant, list: [VersionEntry])] = [:]
    }
    let state = Mutex(State())

    func node(_ v: VNode) -> UInt64 {
        if case .mirror(let id) = v, id == .root { return ContainerFS.controlVersionsNode }
        return state.withLock { s in
            if let n = s.byKey[v] { return n }
            let n = s.next
            s.next += 1
            s.byKey[v] = n
            s.byNode[n] = v
            return n
        }
    }

    func vnode(_ n: UInt64) -> VNode? {
        if n == ContainerFS.controlVersionsNode { return .mirror(.root) }
        return state.withLock { $0.byNode[n] }
    }
}

extension ContainerFS {
    static let controlVersionsNode: UInt64 = 7
    static let virtualBase: UInt64 = 1 << 48

    static func isVersionsNode(_ n: UInt64) -> Bool { n == controlVersionsNode || n >= virtualBase }

    /// The name of a version entry: `report v7 laptop 2026-11-23T06-40-12Z conflict.txt`.
    static func versionEntryName(_ fileName: String, _ e: VersionEntry) -> String {
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

    func versionsAttr(_ node: UInt64) throws(Errno) -> stat {
        try lock.withLock { () throws(Errno) -> stat in try versionsAttrLocked(node) }
    }

    /// `versionsAttr` with `lock` held (readdir fills entries under it).
    func versionsAttrLocked(_ node: UInt64) throws(Errno) -> stat {
        guard let v = versionsTree.vnode(node) else { throw .ENOENT }
        // Each node carries the owner and permissions of the item it mirrors, so the kernel
        // (default_permissions) lets a user into `.nimbus/versions/PATH/` exactly where it lets
        // the user into PATH: a folder's search bit, a file's read bit. Nothing is writable but a
        // file's versions folder for who may write the file (`rm` of an entry resolves).
        let id: ItemID = switch v { case .mirror(let i), .versions(let i), .entry(let i, _): i }
        guard let rec = id == .root ? nil : t.byID[id].flatMap({ t.nodes[$0] }).map(\.rec) else {
            if id == .root { return controlAttr(Self.controlVersionsNode) }
            throw .ENOENT
        }
        var st = stat()
        st.st_ino = UInt(node)
        st.st_uid = rec.uid
        st.st_gid = rec.gid
        st.st_blksize = 4096
        var ts = Self.ts(mountTime)
        let perm = rec.mode & 0o777
        switch v {
        case .entry:
            guard let e = versionsTree.state.withLock({ $0.entries[node] }) else { throw .ENOENT }
            st.st_mode = S_IFREG | (perm & 0o444)
            st.st_nlink = 1
            st.st_size = Int(e.size)
            st.st_blocks = Int(e.size / 512 + (e.size % 512 == 0 ? 0 : 1))
            ts = Self.ts(e.modified)
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

    func versionsEntry(_ node: UInt64) throws(Errno) -> FuseEntry {
        FuseEntry(node: node, attr: try versionsAttr(node), attrTimeout: options.attrTimeout, entryTimeout: options.entryTimeout)
    }

    /// `versionsEntry` with `lock` held.
    func versionsEntryLocked(_ node: UInt64) throws(Errno) -> FuseEntry {
        FuseEntry(node: node, attr: try versionsAttrLocked(node), attrTimeout: options.attrTimeout, entryTimeout: options.entryTimeout)
    }

    /// The other versions of `item` (from the server; a listing younger than 2 s is reused).
    func versionList(_ item: ItemID) throws(Errno) -> [VersionEntry] {
        if let cached = versionsTree.state.withLock({ $0.lists[item] }), ContinuousClock.now - cached.at < .seconds(2) {
            return cached.list
        }
        let list = try syncStatus?.versionEntries(item) ?? []
        versionsTree.state.withLock { $0.lists[item] = (ContinuousClock.now, list) }
        return list
    }

    /// The children of a versions folder: (name, node), registering their nodes.
    func versionsChildren(_ node: UInt64) throws(Errno) -> [(name: String, node: UInt64)] {
        guard let v = versionsTree.vnode(node) else { throw .ENOENT }
        switch v {
        case .mirror(let id):
            let kids: [(String, ItemID, Bool)] = try lock.withLock { () throws(Errno) -> [(String, ItemID, Bool)] in
                guard let fn = t.byID[id], let f = t.nodes[fn], f.isDir else { throw .ENOENT }
                return f.children.compactMap { name, child in
                    guard let c = t.nodes[child], c.linked, c.rec.kind != .symlink else { return nil }
                    return (name, c.rec.id, c.isDir)
                }
            }
            return kids.map { name, id, isDir in (name, versionsTree.node(isDir ? .mirror(id) : .versions(id))) }
        case .versions(let id):
            let name = try lock.withLock { () throws(Errno) -> String in
                guard let fn = t.byID[id], let f = t.nodes[fn], f.linked else { throw .ENOENT }
                return f.rec.name
            }
            return try versionList(id).map { e in
                let n = versionsTree.node(.entry(id, e.version))
                versionsTree.state.withLock { $0.entries[n] = e }
                return (Self.versionEntryName(name, e), n)
            }
        case .entry:
            throw .ENOTDIR
        }
    }

    func versionsLookup(parent: UInt64, name: String) throws(Errno) -> FuseEntry {
        guard let child = try versionsChildren(parent).first(where: { ItemName.same($0.name, name) }) else { throw .ENOENT }
        return try versionsEntry(child.node)
    }

    func versionsSnapshot(_ node: UInt64) throws(Errno) -> DirSnapshot {
        let up = node == Self.controlVersionsNode ? Self.controlDirNode : Self.controlVersionsNode
        return DirSnapshot(node: node, entries: [(".", node), ("..", up)] + (try versionsChildren(node)))
    }

    /// Opens an entry read-only: the version's bytes are fetched now (bounded) and served from
    /// memory, like a control file.
    func openVersionEntry(_ node: UInt64, flags: Int32) throws(Errno) -> FuseOpen {
        guard case .entry(let id, let version)? = versionsTree.vnode(node) else { throw .EISDIR }
        if flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0 { throw .EROFS }
        guard let sync = syncStatus else { throw .ENOENT }
        let bytes = try sync.versionContent(id, version: version)
        let h = lock.withLock { () -> UInt64 in
            let h = Self.controlHandleBase + t.nextControlHandle
            t.nextControlHandle += 1
            t.controls[h] = bytes
            return h
        }
        return FuseOpen(handle: h, keepCache: false, directIO: true)
    }

    /// `rm` of an entry: a conflict version is discarded on the server; history stays (EPERM).
    func unlinkVersionEntry(parent: UInt64, name: String) throws(Errno) {
        guard case .versions(let id)? = versionsTree.vnode(parent) else { throw .EPERM }
        guard let child = try versionsChildren(parent).first(where: { ItemName.same($0.name, name) }) else { throw .ENOENT }
        guard let e = versionsTree.state.withLock({ $0.entries[child.node] }) else { throw .ENOENT }
        guard e.conflict else { throw .EPERM }
        guard let sync = syncStatus else { throw .EPERM }
        try sync.setItemAttribute("discard", value: "\(e.version)", item: id, isFolder: false)
        versionsTree.state.withLock { _ = $0.lists.removeValue(forKey: id) }
    }
}
