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
        try lock.withLock { () throws(Errno) -> HandleID in
            let snap = try snapshot(node)
            let h = ids.newHandle(.listing)
            t.dirs[h] = snap
            return h
        }
    }

    /// The listing of a folder (lock held): ".", "..", then the children (the root's `.nimbus`
    /// is not one of them).
    func snapshot(_ node: NodeID) throws(Errno) -> DirSnapshot {
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
            if offset == 0 {
                // rewinddir (or the first read): take a fresh listing.
                t.dirs[handle] = try snapshot(node)
            }
            guard let snap = t.dirs[handle] else { throw .EBADF }
            return snap.page(from: offset, room: room, plus: plus, entry: { child, isDot in
                // Removed since the listing was taken: skipped.
                guard let c = t.nodes[child], c.linked || isDot else { return nil }
                return entry(c)
            }, counted: { t.nodes[$0]?.lookups += 1 })
        }
    }

    public func releasedir(handle: HandleID) {
        ids.release(handle)
        lock.withLock { t.dirs[handle] = nil }
    }
}
