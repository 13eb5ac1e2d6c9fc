import FuseKit
import Glibc

extension ContainerFS {
    public func opendir(node: UInt64) throws(Errno) -> UInt64 {
        // `.nimbus/versions` listings may ask the server: VersionsFS.opendir (deferred).
        if Self.isVersionsNode(node) { throw .ENOENT }
        return try lock.withLock { () throws(Errno) -> UInt64 in
            let snap = try snapshot(node)
            let h = t.nextDirHandle
            t.nextDirHandle += 1
            t.dirs[h] = snap
            return h
        }
    }

    /// The listing of a folder (lock held): ".", "..", then the children. The control folder is
    /// never listed in the root; it lists its own files.
    func snapshot(_ node: UInt64) throws(Errno) -> DirSnapshot {
        if node == Self.controlDirNode {
            return DirSnapshot(node: node, entries: [(".", node), ("..", Self.rootNode)] + Self.controlFiles.map { ($0.name, $0.node) }
                               + [("versions", Self.controlVersionsNode)])
        }
        let n = try self.node(node)
        guard n.isDir else { throw .ENOTDIR }
        var entries: [(name: String, node: UInt64)] = [(".", node), ("..", n.parentNode)]
        entries.reserveCapacity(n.children.count + 2)
        for (name, child) in n.children { entries.append((name, child)) }
        return DirSnapshot(node: node, entries: entries)
    }

    /// Fills `buffer` from entry `offset` of the listing. With `plus`, every entry other than
    /// "." and ".." carries attributes and counts as a lookup (only if it fit in the buffer).
    public func readdir(node: UInt64, handle: UInt64, offset: Int64, into buffer: inout DirectoryBuffer, plus: Bool) throws(Errno) {
        try lock.withLock { () throws(Errno) in
            if offset == 0 && !Self.isVersionsNode(node) {
                // rewinddir (or the first read): take a fresh listing.
                t.dirs[handle] = try snapshot(node)
            }
            guard let snap = t.dirs[handle] else { throw .EBADF }
            var i = Int(offset)
            while i < snap.entries.count {
                let (name, child) = snap.entries[i]
                var e: FuseEntry
                let isDot = i < 2
                if child < 16, child != Self.rootNode {
                    e = controlEntry(child)
                    if isDot { e.node = 0 }
                } else if child >= Self.virtualBase {
                    guard let v = try? versions.entryLocked(child) else { i += 1; continue }
                    e = v
                    if isDot { e.node = 0 }
                } else if let c = t.nodes[child], (c.linked || isDot) {
                    e = entry(c)
                    if isDot { e.node = 0 }  // the kernel takes no reference for dot entries
                } else {
                    i += 1
                    continue  // removed since the listing was taken
                }
                guard buffer.add(name: name, entry: e, nextOffset: Int64(i + 1)) else { break }
                if plus && !isDot && child >= 16 { t.nodes[child]?.lookups += 1 }
                i += 1
            }
        }
    }

    public func releasedir(handle: UInt64) {
        lock.withLock { t.dirs[handle] = nil }
    }
}
