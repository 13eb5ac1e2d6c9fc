import Coordination
import FuseKit
import Glibc
import MountPorts
import NimbusCore

// Program locks and claims (docs/coordination.md). fcntl and flock locks
// taken on the mount come here (FuseAdapter+Locks.swift) and live in `coordinator` beside the sync
// engine's claims, so the engine sees what programs hold: it neither uploads a file a program
// holds exclusively (mid-save) nor replaces one any program holds.

extension ContainerFS {
    /// The item of a regular file that locks may be taken on.
    func lockableItem(_ node: NodeID) throws(Errno) -> ItemID {
        guard node != .root else { throw .EINVAL }
        return try lock.withLock { () throws(Errno) -> ItemID in
            let n = try self.node(node)
            guard n.rec.kind == .file else { throw .EINVAL }
            return n.rec.id
        }
    }

    /// The item's path from the mount root ("(gone) ID" for an item no longer here).
    public func path(of id: ItemID) -> String {
        lock.withLock {
            guard let node = t.byID[id].flatMap({ t.nodes[$0] }), node.linked else { return "(gone) \(id)" }
            return pathLocked(node, id)
        }
    }

    /// The text of `.nimbus/claims` for `caller`: held and waiting claims on items the caller
    /// can reach (paths escaped as in `.nimbus/events`), and the presentations (all of them are
    /// the mount owner's: only the owner can use the presenter socket) for a caller who sees all.
    public func claimsText(for caller: Caller = .process) -> String {
        let lines = coordinator.dump { id in reachable(id, by: caller) ? EventLog.escape(self.path(of: id)) : nil }
        let presenting = seesAll(caller) ? presenters.presentationLines() : []
        let claims = lines.isEmpty ? "no claims\n" : lines.map { Self.describeOwners(in: $0) + "\n" }.joined()
        return claims + presenting.map { $0 + "\n" }.joined()
    }

    /// "pid 42" → "pid 42 (vim)" from /proc, when the process is still there.
    static func describeOwners(in line: String) -> String {
        guard let r = line.range(of: #"pid [0-9]+"#, options: .regularExpression),
              let pid = Int32(line[r].dropFirst(4)) else { return line }
        let fd = Glibc.open("/proc/\(pid)/comm", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return line }
        defer { close(fd) }
        var buf = [UInt8](repeating: 0, count: 64)
        let n = read(fd, &buf, buf.count)
        guard n > 0 else { return line }
        let comm = String(decoding: buf[0..<n], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        return line.replacingCharacters(in: r, with: "pid \(pid) (\(comm))")
    }
}
