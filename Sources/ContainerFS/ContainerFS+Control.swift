import FuseKit
import Glibc
import LocalStore

// The hidden control folder `.nimbus/` at the mount root (docs/mount.md). It lives on reserved
// node ids (2, 3), is found by lookup but never listed in the root, and cannot be removed,
// renamed, written into or chmod-ed. Its files are generated at open (direct I/O, size 0 in
// stat, like /proc) so `cat` always sees a consistent snapshot.

extension ContainerFS {
    func controlAttr(_ node: UInt64) -> stat {
        var st = stat()
        st.st_ino = UInt(node)
        st.st_uid = owner.uid
        st.st_gid = owner.gid
        let ts = Self.ts(mountTime)
        st.st_atim = ts; st.st_mtim = ts; st.st_ctim = ts
        if node == Self.controlDirNode || node == Self.controlVersionsNode {
            st.st_mode = S_IFDIR | 0o555
            st.st_nlink = 2
            st.st_size = 4096
        } else {
            st.st_mode = S_IFREG | 0o444
            st.st_nlink = 1
            // The events file grows like a log, so `tail -f` (which polls the size) follows it.
            st.st_size = node == Self.controlEventsNode ? Int(events.size) : 0
        }
        st.st_blksize = 4096
        return st
    }

    func controlEntry(_ node: UInt64) -> FuseEntry {
        FuseEntry(node: node, attr: controlAttr(node), attrTimeout: options.attrTimeout, entryTimeout: options.entryTimeout)
    }

    /// Opens a control file for `caller`: what it shows names only items the caller can reach
    /// in the tree (ContainerFS+Access.swift).
    func openControl(_ node: UInt64, caller: Caller) -> FuseOpen {
        if node == Self.controlEventsNode {
            // Read live from the log (no snapshot); a caller who may not see everything reads
            // through a cursor of its own that skips the lines it may not see.
            let reader = EventReader(caller: seesAll(caller) ? nil : caller)
            let h = lock.withLock { () -> UInt64 in
                let h = Self.controlHandleBase + t.nextControlHandle
                t.nextControlHandle += 1
                t.eventHandles[h] = reader
                return h
            }
            return FuseOpen(handle: h, keepCache: false, directIO: true)
        }
        let text = switch node {
        case Self.controlClaimsNode: claimsText(for: caller)
        case Self.controlConflictsNode: conflictsText(for: caller)
        default: statusText()
        }
        let bytes = Array(text.utf8)
        let h = lock.withLock { () -> UInt64 in
            let h = Self.controlHandleBase + t.nextControlHandle
            t.nextControlHandle += 1
            t.controls[h] = bytes
            return h
        }
        return FuseOpen(handle: h, keepCache: false, directIO: true)
    }

    public func readControl(handle: UInt64, offset: Int64, size: Int) throws(Errno) -> [UInt8] {
        guard offset >= 0, size >= 0 else { throw .EINVAL }
        if let reader = lock.withLock({ t.eventHandles[handle] }) {
            guard let caller = reader.caller else { return events.read(offset: offset, size: size) }
            var cursor = reader.cursor
            let bytes = events.readFiltered(&cursor, offset: offset, size: size) { paths in
                paths.allSatisfy { reachable(path: $0, by: caller) }
            }
            lock.withLock { t.eventHandles[handle]?.cursor = cursor }
            return bytes
        }
        return try lock.withLock { () throws(Errno) -> [UInt8] in
            guard let b = t.controls[handle] else { throw .EBADF }
            let start = Int(min(offset, Int64(b.count)))
            return Array(b[start..<(start + min(size, b.count - start))])
        }
    }

    func releaseControl(_ handle: UInt64) {
        if case .version = Self.kind(ofHandle: handle) { return versions.release(handle: handle) }
        lock.withLock { t.controls[handle] = nil; t.eventHandles[handle] = nil }
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
