import FuseKit
import LocalStore
import MountPorts
import NimbusCore

// What another local user may see of the tree through the control files (`.nimbus/events`,
// `claims`, `conflicts`): only items the user could reach in the tree itself, that is, every
// folder from the root down to the item's folder lets the user search it (the `x` bit for the
// user's class, as the kernel checks under `default_permissions`). Root and the mount's owner
// (whose state directory holds everything anyway) see all.

extension ContainerFS {
    /// Whether `c` sees every item (no filtering needed).
    func seesAll(_ c: Caller) -> Bool { c.uid == 0 || c.uid == owner.uid }

    /// Whether `c` has permission `bit` (4 read, 2 write, 1 search) on `rec` by its mode, owner
    /// and group — the check the kernel makes under `default_permissions` (root passes).
    static func permits(_ c: Caller, _ rec: ItemRecord, _ bit: UInt32) -> Bool {
        if c.uid == 0 { return true }
        let m = rec.mode
        if c.uid == rec.uid { return m & (bit << 6) != 0 }
        if c.gid == rec.gid || c.groups.contains(rec.gid) { return m & (bit << 3) != 0 }
        return m & bit != 0
    }

    /// Whether `c` may write `node` by its mode (false for an unknown node).
    func mayWrite(node: NodeID, caller c: Caller) -> Bool {
        if c.uid == 0 { return true }
        return lock.withLock { t.nodes[node].map { Self.permits(c, $0.rec, 2) } ?? false }
    }

    /// Whether `c` may search every folder from the root down to `n`'s folder (lock held).
    func reachableLocked(_ n: Node, by c: Caller) -> Bool {
        if seesAll(c) { return true }
        if n.node == .root { return true }
        var p = n.parentNode
        for _ in 0..<100_000 {
            guard let f = t.nodes[p], f.linked || f.node == .root else { return false }
            if !Self.permits(c, f.rec, 1) { return false }
            if f.node == .root { return true }
            p = f.parentNode
        }
        return false
    }

    /// Whether item `id` is here and `c` can reach it.
    func reachable(_ id: ItemID, by c: Caller) -> Bool {
        if seesAll(c) { return true }
        return lock.withLock {
            guard let node = t.byID[id], let n = t.nodes[node], n.linked else { return false }
            return reachableLocked(n, by: c)
        }
    }

    /// Whether `c` can reach every folder a path (as the event log writes it, unescaped) passes
    /// through: each exists now and lets `c` search it. The last part need not exist (a deleted
    /// item's event). A path that no longer leads anywhere is not shown.
    func reachable(path: String, by c: Caller) -> Bool {
        if seesAll(c) { return true }
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)
        return lock.withLock {
            guard var f = t.nodes[.root] else { return false }
            for part in parts.dropLast() {
                if !Self.permits(c, f.rec, 1) { return false }
                guard let next = f.children[String(part)], let n = t.nodes[next], n.isDir else { return false }
                f = n
            }
            return Self.permits(c, f.rec, 1)
        }
    }
}
