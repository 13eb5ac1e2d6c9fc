import FuseKit
import Glibc
import LocalStore
import MountPorts

// Extended attributes.
// - `user.nimbus.*` are virtual (computed): `status` = the sync state from the sync engine
//   (`current` on a local-only mount), `itemid` = the item's UUID; on a synced mount also
//   `progress`, `version`, `pinned`, `error` (read) and `pinned`, `evict`, `download`, and on the
//   root `paused` (write) — the engine answers those (docs/sync.md "Status and control").
// - Other `user.*` attributes are stored per item (database row per name), survive remounts and
//   sync (`UserXattrs`: at most 4 KiB of names and values per item, `E2BIG` beyond).
// - `security.*`, `system.*` (ACLs) and `trusted.*` are not supported: reads answer ENODATA at
//   once, without a lock or I/O — the kernel asks for `security.capability` before every
//   write(2), so this path is hot.

extension ContainerFS {
    public func getxattr(node: NodeID, name: String) throws(Errno) -> [UInt8] {
        guard name.hasPrefix("user.") else { throw .ENODATA }
        let virtual = NimbusXattr(name: name)
        if virtual == .versions, versions.source != nil { throw .ENODATA }  // `versionsText` answers it (deferred)
        if virtual == nil, name.hasPrefix(NimbusXattr.prefix) { throw .ENODATA }
        if virtual == .error, let problems = lock.withLock({ t.nodes[node].map(\.rec.id) }).flatMap(rulesProblems), !problems.isEmpty {
            // A rules file says which of its lines are left out (with the engine's error, if any).
            let engine = lock.withLock { t.nodes[node].flatMap { n in syncStatus?.itemAttribute(.error, item: n.rec.id, ancestors: []) } } ?? ""
            return Array(((engine.isEmpty ? [] : [engine]) + ["rules left out: " + problems.joined(separator: "; ")]).joined(separator: "; ").utf8)
        }
        if virtual == .ignored {
            // Read outside the lock: a rules file not parsed yet is read from its cache file.
            guard let id = lock.withLock({ t.nodes[node]?.rec.id }) else { throw .ENOENT }
            guard let text = ignoredText(id) else { throw .ENODATA }
            return Array(text.utf8)
        }
        return try lock.withLock { () throws(Errno) -> [UInt8] in
            let n = try self.node(node)
            switch virtual {
            case nil: break
            case .status?: return Array((syncStatus?.itemStatus(n.rec.id) ?? .current).rawValue.utf8)
            case .itemid?: return Array(n.rec.id.description.utf8)
            case let x?:
                guard let sync = syncStatus, NimbusXattr.listedWhenSynced.contains(x) else { throw .ENODATA }
                var ancestors: [ItemID] = []
                var p = n.parentNode
                while p != .root, let f = t.nodes[p] { ancestors.append(f.rec.id); p = f.parentNode }
                if n.node != .root { ancestors.append(.root) }
                guard let v = sync.itemAttribute(x, item: n.rec.id, ancestors: ancestors) else { throw .ENODATA }
                return Array(v.utf8)
            }
            guard let v = n.xattrs[name] else { throw .ENODATA }
            return v
        }
    }

    /// The names, each NUL-terminated (the listxattr(2) format).
    public func listxattr(node: NodeID) throws(Errno) -> [UInt8] {
        try lock.withLock { () throws(Errno) -> [UInt8] in
            let n = try self.node(node)
            var out: [UInt8] = []
            if n.rec.kind != .symlink {
                for x in NimbusXattr.listed { out += Array(x.name.utf8); out.append(0) }
                if syncStatus != nil { for x in NimbusXattr.listedWhenSynced { out += Array(x.name.utf8); out.append(0) } }
            }
            for name in n.xattrs.keys.sorted() { out += Array(name.utf8); out.append(0) }
            return out
        }
    }

    /// `flags`: XATTR_CREATE fails with EEXIST if present, XATTR_REPLACE with ENODATA if absent.
    public func setxattr(node: NodeID, name: String, value: [UInt8], flags: Int32) throws(Errno) {
        guard name.hasPrefix("user.") else { throw .EOPNOTSUPP }
        if name.hasPrefix(NimbusXattr.prefix) { return try setControlXattr(node: node, name: NimbusXattr(name: name), value: value) }
        if name.utf8.count > 255 { throw .ERANGE }
        if value.count > UserXattrs.budget { throw .E2BIG }
        let (id, n) = try lock.withLock { () throws(Errno) -> (ItemID, Node) in
            let n = try self.node(node)
            let old = n.xattrs[name]
            if flags & 1 /* XATTR_CREATE */ != 0 && old != nil { throw .EEXIST }
            if flags & 2 /* XATTR_REPLACE */ != 0 && old == nil { throw .ENODATA }
            // The item's attributes sync, within a budget every device keeps (docs/mount.md).
            let size = UserXattrs.size(n.xattrs) - (old.map { name.utf8.count + $0.count } ?? 0) + name.utf8.count + value.count
            if size > UserXattrs.budget { throw .E2BIG }
            n.xattrs[name] = value
            n.rec.ctime = options.clock.wall()
            if n.linked {
                for id in n.itemIDs { store.enqueue(.setXattr(id, name: name, value: value)) }
                persist(n)
            }
            n.xattrNotices[name, default: 0] += 1
            return (n.rec.id, n)
        }
        notifyXattrs(id, n, name: name)
    }

    /// An attribute change's notice: a remote state shown before it reaches the engine keeps the
    /// attribute as it is here (`XattrRules.shown`).
    private func notifyXattrs(_ id: ItemID, _ n: Node, name: String) {
        let all = forEveryName(.attributesChanged(id))
        for c in all { queue(c) }
        let node = UncheckedNode(n)
        let tell: @Sendable () -> Void = { [self] in
            events.append(.attributes, origin: .local, path: path(of: id))
            for c in all { observer?.localChange(c) }
            lock.withLock {
                if let left = node.n.xattrNotices[name], left > 1 { node.n.xattrNotices[name] = left - 1 } else { node.n.xattrNotices[name] = nil }
            }
        }
        guard let deliver = options.deliverNotice else { return tell() }
        deliver(tell)
    }

    /// `setfattr -n user.nimbus.pinned -v 1 FILE` and friends: handed to the sync engine.
    private func setControlXattr(node: NodeID, name: NimbusXattr?, value: [UInt8]) throws(Errno) {
        guard let sync = syncControl, let name, name.isControl else { throw .EPERM }
        let (id, isFolder, text) = try controlXattrTarget(node: node, value: value)
        try sync.setItemAttribute(name, value: text, item: id, isFolder: isFolder)
    }

    /// The item a `user.nimbus.*` write names, and its value as text (trailing newline, blank
    /// or NUL dropped).
    private func controlXattrTarget(node: NodeID, value: [UInt8]) throws(Errno) -> (ItemID, Bool, String) {
        let (id, isFolder) = try lock.withLock { () throws(Errno) -> (ItemID, Bool) in
            let n = try self.node(node)
            guard n.linked, n.rec.kind != .symlink else { throw .EPERM }
            return (n.rec.id, n.isDir)
        }
        guard var text = String(validating: value, as: UTF8.self) else { throw .EINVAL }
        while let l = text.last, l == "\n" || l == " " || l == "\0" { text.removeLast() }
        return (id, isFolder, text)
    }

    /// `getfattr -n user.nimbus.versions FILE`: every version of the file, from the server.
    public func versionsText(node: NodeID, done: @escaping @Sendable (Result<[UInt8], Errno>) -> Void) {
        guard let source = versions.source else { return done(.failure(.ENODATA)) }
        let id: ItemID
        do { id = try lock.withLock { () throws(Errno) -> ItemID in try self.node(node).rec.id } } catch { return done(.failure(error)) }
        source.versionsText(id) { done($0.map { Array($0.utf8) }) }
    }

    /// `setfattr -n user.nimbus.resolve|restore|discard -v VALUE FILE`: asks the server.
    public func resolve(node: NodeID, name: NimbusXattr, value: [UInt8], done: @escaping @Sendable (Errno?) -> Void) {
        guard let source = versions.source, name.needsServer, name != .versions else { return done(.EPERM) }
        let target: (ItemID, Bool, String)
        do { target = try controlXattrTarget(node: node, value: value) } catch { return done(error) }
        guard !target.1 else { return done(.EISDIR) }
        source.resolve(name, value: target.2, item: target.0, done: done)
    }

    public func removexattr(node: NodeID, name: String) throws(Errno) {
        guard name.hasPrefix("user.") else { throw .EOPNOTSUPP }
        if name.hasPrefix(NimbusXattr.prefix) { throw .EPERM }
        let (id, n) = try lock.withLock { () throws(Errno) -> (ItemID, Node) in
            let n = try self.node(node)
            guard n.xattrs.removeValue(forKey: name) != nil else { throw .ENODATA }
            n.rec.ctime = options.clock.wall()
            if n.linked {
                for id in n.itemIDs { store.enqueue(.removeXattr(id, name: name)) }
                persist(n)
            }
            n.xattrNotices[name, default: 0] += 1
            return (n.rec.id, n)
        }
        notifyXattrs(id, n, name: name)
    }
}

import NimbusCore
