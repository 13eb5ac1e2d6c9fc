import FuseKit
import Glibc
import MountPorts

/// One entry of a folder listing, as `ContainerFS.readdir` returns it; the FUSE adapter copies
/// it into the kernel's buffer. "." and ".." carry `NodeID.absent`: the kernel takes no reference.
public struct DirEntry: Sendable {
    public var name: String
    public var entry: FuseEntry
    /// The offset of the entry after this one (where the next readdir goes on).
    public var nextOffset: Int64
}

extension ContainerFS {
    public func opendir(node: NodeID) throws(Errno) -> HandleID {
        // `.nimbus/versions` listings may ask the server: VersionsFS.opendir (deferred).
        if case .versions = Self.kind(of: node) { throw .ENOENT }
        return try lock.withLock { () throws(Errno) -> HandleID in
            let snap = try snapshot(node)
            let h = t.newDirHandle()
            t.dirs[h] = snap
            return h
        }
    }

    /// The listing of a folder (lock held): ".", "..", then the children. The control folder is
    /// never listed in the root; it lists its own files.
    func snapshot(_ node: NodeID) throws(Errno) -> DirSnapshot {
        if node == Self.controlDirNode { return control.listing }
        let n = try self.node(node)
        guard n.isDir else { throw .ENOTDIR }
        var entries: [(name: String, node: NodeID)] = [(".", node), ("..", n.parentNode)]
        entries.reserveCapacity(n.children.count + 2)
        for (name, child) in n.children { entries.append((name, child)) }
        return DirSnapshot(node: node, entries: entries)
    }

    /// The entries of the listing from entry `offset` on that fit in `room` bytes of the
    /// kernel's buffer (`DirectoryBuffer.entrySize`). With `plus`, every entry other than "."
    /// and ".." counts as a lookup: the caller hands all of them to the kernel.
    public func readdir(node: NodeID, handle: HandleID, offset: Int64, plus: Bool, room: Int) throws(Errno) -> [DirEntry] {
        guard offset >= 0 else { throw .EINVAL }
        return try lock.withLock { () throws(Errno) -> [DirEntry] in
            if offset == 0, !Self.isVersionsNode(node) {
                // rewinddir (or the first read): take a fresh listing.
                t.dirs[handle] = try snapshot(node)
            }
            guard let snap = t.dirs[handle] else { throw .EBADF }
            var out: [DirEntry] = []
            var left = room
            var i = Int(clamping: offset)
            while i < snap.entries.count {
                let (name, child) = snap.entries[i]
                let isDot = i < 2
                let kind = Self.kind(of: child)
                var e: FuseEntry
                switch kind {
                case .control: e = control.entry(child)
                case .versions:
                    guard let v = try? versions.entryLocked(child) else { i += 1; continue }
                    e = v
                case .item:
                    guard let c = t.nodes[child], c.linked || isDot else { i += 1; continue }  // removed since the listing was taken
                    e = entry(c)
                }
                if isDot { e.node = .absent }  // the kernel takes no reference for dot entries
                let size = DirectoryBuffer.entrySize(nameBytes: name.utf8.count, plus: plus)
                guard size <= left else { break }
                left -= size
                out.append(DirEntry(name: name, entry: e, nextOffset: Int64(i + 1)))
                if plus, !isDot, case .item = kind { t.nodes[child]?.lookups += 1 }
                i += 1
            }
            return out
        }
    }

    public func releasedir(handle: HandleID) {
        lock.withLock { t.dirs[handle] = nil }
    }
}
