import FuseKit
import Glibc
import LocalStore
import MountPorts
import Synchronization

// The hidden control folder `.nimbus/` at the mount root (docs/mount.md). It lives on reserved
// node ids (2–7), is found by lookup but never listed in the root, and cannot be removed,
// renamed, written into or chmod-ed. Its files are generated at open (direct I/O, size 0 in
// stat, like /proc) so `cat` always sees a consistent snapshot; `.nimbus/events` is read live.

/// The files of `.nimbus/` and their open handles. What they show is the tree's
/// (`statusText`, `claimsText`, `conflictsText` of its `ContainerFS`), filtered for who reads.
final class ControlFS: Sendable {
    private struct State {
        /// Open control files: handle → the bytes fixed at open.
        var snapshots: [HandleID: [UInt8]] = [:]
        /// Open handles of `.nimbus/events` (read live from the EventLog).
        var eventReaders: [HandleID: EventReader] = [:]
        /// The last handle given out.
        var last = ContainerFS.controlHandles.lowerBound
    }
    private let state = Mutex(State())
    /// The filesystem whose control folder this is (it owns this).
    unowned let fs: ContainerFS

    init(fs: ContainerFS) { self.fs = fs }

    func attr(_ node: NodeID) -> stat {
        var st = stat()
        st.node = node
        st.st_uid = fs.owner.uid
        st.st_gid = fs.owner.gid
        let ts = ContainerFS.ts(fs.mountTime)
        st.st_atim = ts; st.st_mtim = ts; st.st_ctim = ts
        if node == ContainerFS.controlDirNode || node == ContainerFS.controlVersionsNode {
            st.st_mode = S_IFDIR | 0o555
            st.st_nlink = 2
            st.st_size = 4096
        } else {
            st.st_mode = S_IFREG | 0o444
            st.st_nlink = 1
            // The events file grows like a log, so `tail -f` (which polls the size) follows it.
            st.st_size = node == ContainerFS.controlEventsNode ? Int(fs.events.size) : 0
        }
        st.st_blksize = 4096
        return st
    }

    func entry(_ node: NodeID) -> FuseEntry {
        FuseEntry(node: node, attr: attr(node), attrTimeout: fs.options.attrTimeout, entryTimeout: fs.options.entryTimeout)
    }

    /// A name in `.nimbus/`.
    func lookup(_ name: String) throws(Errno) -> FuseEntry {
        if let f = ContainerFS.controlFiles.first(where: { $0.name == name }) { return entry(f.node) }
        if name == "versions" { return entry(ContainerFS.controlVersionsNode) }
        throw .ENOENT
    }

    /// The listing of `.nimbus/`.
    var listing: DirSnapshot {
        DirSnapshot(node: ContainerFS.controlDirNode,
                    entries: [(".", ContainerFS.controlDirNode), ("..", NodeID.root)] + ContainerFS.controlFiles.map { ($0.name, $0.node) }
                        + [("versions", ContainerFS.controlVersionsNode)])
    }

    /// Opens a control file for `caller`: what it shows names only items the caller can reach
    /// in the tree (ContainerFS+Access.swift). Read-only whoever asks (root passes the kernel's
    /// mode check): EPERM, as for every change inside `.nimbus/`.
    func open(_ node: NodeID, flags: Int32, caller: Caller) throws(Errno) -> FuseOpen {
        guard ContainerFS.isControlFile(node) else { throw .EISDIR }
        if flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0 { throw .EPERM }
        if node == ContainerFS.controlEventsNode {
            // Read live from the log (no snapshot); a caller who may not see everything reads
            // through a cursor of its own that skips the lines it may not see.
            let reader = EventReader(caller: fs.seesAll(caller) ? nil : caller)
            return FuseOpen(handle: add { $0.eventReaders[$1] = reader }, keepCache: false, directIO: true)
        }
        let text = switch node {
        case ContainerFS.controlClaimsNode: fs.claimsText(for: caller)
        case ContainerFS.controlConflictsNode: fs.conflictsText(for: caller)
        default: fs.statusText()
        }
        let bytes = Array(text.utf8)
        return FuseOpen(handle: add { $0.snapshots[$1] = bytes }, keepCache: false, directIO: true)
    }

    private func add(_ put: (inout State, HandleID) -> Void) -> HandleID {
        state.withLock { s in
            s.last = s.last.successor
            put(&s, s.last)
            return s.last
        }
    }

    func read(handle: HandleID, offset: Int64, size: Int) throws(Errno) -> [UInt8] {
        guard offset >= 0, size >= 0 else { throw .EINVAL }
        if let reader = state.withLock({ $0.eventReaders[handle] }) {
            guard let caller = reader.caller else { return fs.events.read(offset: offset, size: size) }
            var cursor = reader.cursor
            let bytes = fs.events.readFiltered(&cursor, offset: offset, size: size) { paths in
                paths.allSatisfy { fs.reachable(path: $0, by: caller) }
            }
            state.withLock { $0.eventReaders[handle]?.cursor = cursor }
            return bytes
        }
        return try state.withLock { (s: inout State) throws(Errno) -> [UInt8] in
            guard let b = s.snapshots[handle] else { throw .EBADF }
            let start = Int(min(offset, Int64(b.count)))
            return Array(b[start..<(start + min(size, b.count - start))])
        }
    }

    func release(handle: HandleID) {
        state.withLock { s in
            s.snapshots[handle] = nil
            s.eventReaders[handle] = nil
        }
    }
}

extension ContainerFS {
    /// Reads an open control file (the FUSE adapter's read of a control handle).
    public func readControl(handle: HandleID, offset: Int64, size: Int) throws(Errno) -> [UInt8] {
        try control.read(handle: handle, offset: offset, size: size)
    }

    /// The text of `.nimbus/conflicts`: `COUNT PATH` per item with unresolved conflict versions
    /// that `caller` can reach, by path, the path escaped as in `.nimbus/events` (one item, one
    /// line); empty when there are none.
    public func conflictsText(for caller: Caller = .process) -> String {
        let items = (syncStatus?.conflictedItems() ?? []).filter { reachable($0.0, by: caller) }
        return items.map { (path(of: $0.0), $0.1) }.sorted { $0.0 < $1.0 }.map { "\($0.1) \(EventLog.escape($0.0))\n" }.joined()
    }

    /// The text of `.nimbus/status`: one `key: value` per line, stable keys for scripts.
    public func statusText() -> String {
        let (items, files, folders, bytes, open) = lock.withLock { () -> (Int, Int, Int, Int64, Int) in
            var files = 0, folders = 0
            var bytes: Int64 = 0
            for n in t.nodes.values where n.linked {
                if n.isDir { folders += 1 } else if n.rec.kind == .file { files += 1; bytes += n.rec.size }
            }
            return (t.nodes.count, files, folders, bytes, t.openFiles)
        }
        var sync: [String: String] = [:]
        var extra: [(String, String)] = []
        for (k, v) in syncStatus?.statusLines() ?? [] {
            if ["connection", "upload-queue", "download-queue", "conflicts"].contains(k) { sync[k] = v } else { extra.append((k, v)) }
        }
        var s = ""
        s += "connection: \(sync["connection"] ?? "local-only")\n"
        s += "items: \(items)\n"
        s += "files: \(files)\n"
        s += "folders: \(folders)\n"
        s += "bytes: \(bytes)\n"
        s += "open-files: \(open)\n"
        s += "pending-local-writes: \(store.backlog)\n"
        s += "upload-queue: \(sync["upload-queue"] ?? "0")\n"
        s += "download-queue: \(sync["download-queue"] ?? "0")\n"
        s += "conflicts: \(sync["conflicts"] ?? "0")\n"
        s += "state-dir: \(store.directory.path)\n"
        s += "store-error: \(store.lastError ?? "none")\n"
        for (k, v) in extra { s += "\(k): \(v)\n" }
        for (k, v) in presenters.statusLines() { s += "\(k): \(v)\n" }
        return s
    }
}
