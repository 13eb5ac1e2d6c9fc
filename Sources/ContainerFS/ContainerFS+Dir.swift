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
        try openListing(node: node).handle
    }

    /// `opendir` as the kernel gets it. The kernel may keep the folder's listing
    /// (`cacheListing`): a change through the kernel resets it, and every change behind its back
    /// invalidates the folder's node (`applyRemote`), which drops it. The listing kept is reused
    /// (`keepCache`) only while the children's entries and attributes that came with it are
    /// fresh: past that, a listing from the cache would cost a lookup per child where a fresh one
    /// costs a readdirplus per page of children.
    public func openListing(node: NodeID) throws(Errno) -> FuseOpen {
        try lock.withLock { () throws(Errno) -> FuseOpen in
            let snap = try snapshot(node)
            let h = ids.newHandle(.listing)
            t.dirs[h] = snap
            let fresh = UInt64(min(options.entryTimeout, options.attrTimeout) * 0.8 * 1e9)
            let listed = t.nodes[node]?.listedAt ?? 0
            let keep = listed != 0 && options.clock.monotonic() &- listed < fresh
            return FuseOpen(handle: h, keepCache: keep, cacheListing: true)
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
                if plus { t.nodes[node]?.listedAt = options.clock.monotonic() }
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
