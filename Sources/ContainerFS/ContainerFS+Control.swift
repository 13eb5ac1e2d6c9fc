import FuseKit
import Glibc
import LocalStore
import MountPorts
import Synchronization

// The hidden control folder `.nimbus/` at the mount root (docs/mount.md). Its nodes have fixed
// ids (`IDTable.fixedNodes`); it is found by lookup but never listed in the root, and cannot be
// removed, renamed, written into or chmod-ed. Its files are generated at open (direct I/O, size 0
// in stat, like /proc) so `cat` always sees a consistent snapshot; `.nimbus/events` is read live.

/// What the files of `.nimbus/` show of the tree, filtered for who reads (ContainerFS+Access.swift).
protocol ControlSource: AnyObject, Sendable {
    func statusText() -> String
    func requestsText() -> String
    func claimsText(for caller: Caller) -> String
    func conflictsText(for caller: Caller) -> String
    /// Whether `caller` sees every item (no filtering needed).
    func seesAll(_ caller: Caller) -> Bool
    /// Whether `caller` can reach every folder an event's path passes through.
    func reachable(path: String, by caller: Caller) -> Bool
}

/// The nodes of `.nimbus/` and their open handles (files and listings). `versions` is a name in
/// this folder, but `VersionsFS` answers for its node.
final class ControlFS: Sendable {
    enum File: Hashable, Sendable {
        case folder, status, claims, events, conflicts, requests
        /// The generated files, in listing order.
        static let files: [(name: String, file: File)] = [("status", .status), ("claims", .claims), ("events", .events), ("conflicts", .conflicts),
                                                          ("requests", .requests)]
    }
    private struct State {
        /// Open control files: handle → the bytes fixed at open.
        var snapshots: [HandleID: [UInt8]] = [:]
        /// Open handles of `.nimbus/events` (read live from the EventLog).
        var eventReaders: [HandleID: EventReader] = [:]
        /// Open listings of `.nimbus/` (its entries never change).
        var listings: Set<HandleID> = []
    }
    private let state = Mutex(State())
    private let ids: IDTable
    private let look: Presentation
    private let events: EventLog
    /// The filesystem whose control folder this is (it owns this).
    private unowned let source: any ControlSource

    init(ids: IDTable, presentation: Presentation, events: EventLog, source: any ControlSource) {
        self.ids = ids
        self.look = presentation
        self.events = events
        self.source = source
    }

    func node(_ f: File) -> NodeID { ids.node(of: .control(f)) }
    /// `.nimbus/versions`.
    var versionsNode: NodeID { ids.node(of: .versions(.mirror(.root))) }
    /// `.nimbus/trash`.
    var trashNode: NodeID { ids.node(of: .trash(.folder("/"))) }
    func trashEntry() -> FuseEntry {
        var st = look.folderAttr(trashNode)
        st.st_mode = S_IFDIR | 0o755
        return look.entry(trashNode, st)
    }

    func attr(_ f: File) -> stat {
        if f == .folder { return look.folderAttr(node(f)) }
        var st = stat()
        st.node = node(f)
        st.st_uid = look.uid
        st.st_gid = look.gid
        let ts = ContainerFS.ts(look.mountTime)
        st.st_atim = ts; st.st_mtim = ts; st.st_ctim = ts
        st.st_mode = S_IFREG | 0o444
        st.st_nlink = 1
        // The events file grows like a log, so `tail -f` (which polls the size) follows it.
        st.st_size = f == .events ? Int(events.size) : 0
        st.st_blksize = 4096
        return st
    }

    func entry(_ f: File) -> FuseEntry { look.entry(node(f), attr(f)) }

    /// A name in `.nimbus/` (the files have none).
    func lookup(in f: File, name: String) throws(Errno) -> FuseEntry {
        guard f == .folder else { throw .ENOENT }
        if let x = File.files.first(where: { $0.name == name }) { return entry(x.file) }
        if name == "versions" { return look.entry(versionsNode, look.folderAttr(versionsNode)) }
        if name == "trash" { return trashEntry() }
        throw .ENOENT
    }

    // MARK: the listing of `.nimbus/`

    func opendir(_ f: File) throws(Errno) -> HandleID {
        guard f == .folder else { throw .ENOTDIR }
        let h = ids.newHandle(.control)
        state.withLock { _ = $0.listings.insert(h) }
        return h
    }

    func readdir(handle: HandleID, offset: Int64, plus: Bool, room: Int) throws(Errno) -> [DirEntry] {
        guard offset >= 0 else { throw .EINVAL }
        guard state.withLock({ $0.listings.contains(handle) }) else { throw .EBADF }
        // ("..", the root, is listed with this folder's entry: the kernel takes nothing from dot entries.)
        let listed = [(".", entry(.folder)), ("..", entry(.folder))] + File.files.map { ($0.name, entry($0.file)) }
            + [("versions", look.entry(versionsNode, look.folderAttr(versionsNode))), ("trash", trashEntry())]
        let byNode = Dictionary(listed.map { ($0.1.node, $0.1) }, uniquingKeysWith: { a, _ in a })
        let listing = DirSnapshot(node: node(.folder), entries: listed.map { ($0.0, $0.1.node) })
        return listing.page(from: offset, room: room, plus: plus) { child, _ in byNode[child] }
    }

    // MARK: the files

    /// Opens a control file for `caller`: what it shows names only items the caller can reach
    /// in the tree (ContainerFS+Access.swift). Read-only whoever asks (root passes the kernel's
    /// mode check): EPERM, as for every change inside `.nimbus/`.
    func open(_ f: File, flags: Int32, caller: Caller) throws(Errno) -> FuseOpen {
        if f == .folder { throw .EISDIR }
        if flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0 { throw .EPERM }
        if f == .events {
            // Read live from the log (no snapshot); a caller who may not see everything reads
            // through a cursor of its own that skips the lines it may not see.
            let reader = EventReader(caller: source.seesAll(caller) ? nil : caller)
            return FuseOpen(handle: add { $0.eventReaders[$1] = reader }, keepCache: false, directIO: true)
        }
        let text = switch f {
        case .claims: source.claimsText(for: caller)
        case .conflicts: source.conflictsText(for: caller)
        case .requests: source.requestsText()
        default: source.statusText()
        }
        let bytes = Array(text.utf8)
        return FuseOpen(handle: add { $0.snapshots[$1] = bytes }, keepCache: false, directIO: true)
    }

    private func add(_ put: (inout State, HandleID) -> Void) -> HandleID {
        let h = ids.newHandle(.control)
        state.withLock { put(&$0, h) }
        return h
    }

    func read(handle: HandleID, offset: Int64, size: Int) throws(Errno) -> [UInt8] {
        guard offset >= 0, size >= 0 else { throw .EINVAL }
        if let reader = state.withLock({ $0.eventReaders[handle] }) {
            guard let caller = reader.caller else { return events.read(offset: offset, size: size) }
            var cursor = reader.cursor
            let bytes = events.readFiltered(&cursor, offset: offset, size: size) { [source] paths in
                paths.allSatisfy { source.reachable(path: $0, by: caller) }
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

    /// Releases an open file or listing.
    func release(handle: HandleID) {
        ids.release(handle)
        state.withLock { s in
            s.snapshots[handle] = nil
            s.eventReaders[handle] = nil
            s.listings.remove(handle)
        }
    }
}

extension ContainerFS: ControlSource {
    /// The text of `.nimbus/conflicts`: `COUNT PATH` per item with unresolved conflict versions
    /// that `caller` can reach, by path, the path escaped as in `.nimbus/events` (one item, one
    /// line); empty when there are none.
    public func conflictsText(for caller: Caller = .process) -> String {
        let items = (syncStatus?.conflictedItems() ?? []).filter { reachable($0.0, by: caller) }
        return items.map { (path(of: $0.0), $0.1) }.sorted { $0.0 < $1.0 }.map { "\($0.1) \(EventLog.escape($0.0))\n" }.joined()
    }

    /// The text of `.nimbus/requests`: `KIND COUNT` per kind of request the kernel sent this
    /// mount since it started (every kind, in a fixed order; counted, not timed).
    public func requestsText() -> String {
        guard let k = kernel.withLock({ $0 }) else { return "" }
        return k.requestCounts().map { "\($0.kind) \($0.count)\n" }.joined()
    }

    /// The text of `.nimbus/status`: one `key: value` per line, stable keys for scripts.
    public func statusText() -> String {
        let (items, files, folders, bytes, open) = lock.withLock { () -> (Int, Int, Int, Int64, Int) in
            let c = t.nodes.counts
            #if DEBUG
            // Debug builds (the tests) check the kept counts against a look at every node.
            var walked = TreeCounts.Share()
            for n in t.nodes.values where n.linked {
                if n.isDir { walked.folders += 1 } else if n.rec.kind == .file && !n.rec.isSpecial { walked.files += 1; walked.bytes += n.rec.size }
            }
            assert(walked == TreeCounts.Share(files: c.files, folders: c.folders, bytes: c.bytes), "status counts \(c.files)/\(c.folders)/\(c.bytes), nodes \(walked)")
            #endif
            return (t.nodes.count, c.files, c.folders, c.bytes, t.openFiles)
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
        let refused = options.downloadPolicy?.refusedPrograms ?? []
        s += "refused-programs: \(refused.isEmpty ? "none" : refused.joined(separator: " "))\n"
        s += "store-error: \(store.lastError ?? "none")\n"
        for (k, v) in extra { s += "\(k): \(v)\n" }
        for (k, v) in presenters.statusLines() { s += "\(k): \(v)\n" }
        return s
    }
}
