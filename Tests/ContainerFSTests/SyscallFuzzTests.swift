@testable import ContainerFS
import Foundation
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Testing

/// Every filesystem operation with hostile arguments from many users, seeded (docs/security.md
/// "Another local user"): whatever the kernel lets through must get an answer — a value or an
/// errno — never a trap. A trap ends the test process, so a crash fails the run; the seed and
/// step are printed first so `NIMBUS_FS_FUZZ_SEED=S` replays it.
@Suite struct SyscallFuzzTests {
    struct Rng {
        var s: UInt64
        mutating func next() -> UInt64 {
            s &+= 0x9E37_79B9_7F4A_7C15
            var z = s
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
        mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
        mutating func pick<T>(_ xs: [T]) -> T { xs[below(xs.count)] }
    }

    static let extremes: [Int64] = [0, 1, -1, 4095, 4096, 1 << 31, 1 << 40, Int64(Int32.max), .max, .min, .max - 1, .min + 1, 10_000_000_000, -11_676_096_000]
    static let names = ["a", "b", "caf\u{E9}", "cafe\u{301}", ".nimbus", "x\ny", "-\u{3E}", String(repeating: "n", count: 255),
                        String(repeating: "é", count: 128), "\u{1B}[31m", ".", "..", "d", "e f", "\u{7F}"]

    @Test func hostileArgumentsNeverTrap() throws {
        let seed = ProcessInfo.processInfo.environment["NIMBUS_FS_FUZZ_SEED"].flatMap(UInt64.init) ?? 20_261_124
        let steps = ProcessInfo.processInfo.environment["NIMBUS_FS_FUZZ_STEPS"].flatMap(Int.init) ?? 6_000
        let dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-fsfuzz-\(UUID().uuidString)")
        let store = try LocalStore(directory: dir)
        defer { try? FileManager.default.removeItem(at: dir) }
        let fs = try ContainerFS(store: store)
        var rng = Rng(s: seed)
        let callers = [Caller.process, Caller(uid: 1000, gid: 1000), Caller(uid: 65534, gid: 65534, groups: [1000])]
        var nodes: [NodeID] = [.root]
        var handles: [(node: NodeID, handle: HandleID)] = []
        // Node ids no item has, as the kernel could send them: `.nimbus/`'s, unused, out of range.
        let strangeNodes = [0, 2, 3, 4, 5, 6, 7, 15, 1 << 48, UInt64.max].map(NodeID.init(rawValue:))
        var errnos = 0
        for step in 0..<steps {
            // (Printed only when replaying: the test process dies on a trap, and this says where.)
            if ProcessInfo.processInfo.environment["NIMBUS_FS_FUZZ_TRACE"] != nil { print("fs fuzz seed \(seed) step \(step)") }
            let node = rng.below(10) == 0 ? rng.pick(strangeNodes) : rng.pick(nodes)
            let name = rng.pick(Self.names)
            let caller = rng.pick(callers)
            let v = rng.pick(Self.extremes)
            do {
                switch rng.below(17) {
                case 0: nodes.append(try fs.mkdir(parent: node, name: name, mode: mode_t(truncatingIfNeeded: v), caller: caller).node)
                case 1:
                    let (e, o) = try fs.create(parent: node, name: name, mode: mode_t(truncatingIfNeeded: v), flags: O_RDWR, caller: caller)
                    nodes.append(e.node)
                    handles.append((e.node, o.handle))
                case 2:
                    var c = FuseSetAttr()
                    let t = timespec(tv_sec: Int(truncatingIfNeeded: v), tv_nsec: Int(truncatingIfNeeded: rng.pick(Self.extremes)))
                    if rng.below(2) == 0 { c.mtime = .at(t) } else { c.atime = .at(t) }
                    if rng.below(3) == 0 { c.size = rng.pick([0, 1, 4096, 1 << 20]) }
                    if rng.below(3) == 0 { c.mode = mode_t(truncatingIfNeeded: rng.next()) }
                    _ = try fs.setattr(node: node, c, handle: nil)
                case 3:
                    guard let h = handles.randomElement(using: &rng) else { continue }
                    let bytes = [UInt8](repeating: 7, count: rng.below(3) * 100)
                    _ = try bytes.withUnsafeBytes { try fs.write(node: h.node, handle: h.handle, offset: rng.pick([0, 1, 4096, 1 << 20, 1 << 40, .max, .max - 1, -1]), data: $0) }
                case 4:
                    guard let h = handles.randomElement(using: &rng) else { continue }
                    // Lengths that succeed stay small (the disk is real); the extremes fail in the syscall.
                    try fs.fallocate(node: h.node, handle: h.handle, mode: rng.pick([0, 1, 3]), offset: rng.pick([0, 4096, -1, .max, .min, .max - 1]),
                                     length: rng.pick([0, 1, 4096, -1, .max, .min]))
                case 5: try fs.rename(parent: node, name: name, newParent: rng.pick(nodes), newName: rng.pick(Self.names),
                                      flags: RenameFlags(rawValue: UInt32(rng.below(8))))
                case 6: try fs.unlink(parent: node, name: name)
                case 7: try fs.rmdir(parent: node, name: name)
                case 8: _ = try fs.lookup(parent: node, name: name)
                case 9: try fs.setxattr(node: node, name: rng.pick(["user.x", "user.nimbus.pinned", "user.nimbus.evict", "security.capability", "user." + name]),
                                        value: [UInt8](repeating: 1, count: rng.pick([0, 1, 65536, 65537])), flags: Int32(rng.below(4)))
                case 10: _ = try fs.getxattr(node: node, name: rng.pick(["user.x", "user.nimbus.status", "user.nimbus.versions", "system.posix_acl_access"]))
                case 11:
                    // Resolved as the FUSE adapter does: `.nimbus/`'s files answer for their nodes.
                    let flags = rng.pick([O_RDONLY, O_WRONLY, O_RDWR | O_TRUNC, O_RDONLY | O_TRUNC])
                    if case .control(let file) = fs.ids.owner(of: node) {
                        let o = try fs.control.open(file, flags: flags, caller: caller)
                        _ = try fs.control.read(handle: o.handle, offset: v, size: rng.pick([0, 1, 4096, 1 << 20]))
                        fs.control.release(handle: o.handle)
                    } else {
                        let o = try fs.open(node: node, flags: flags)
                        handles.append((node, o.handle))
                    }
                case 12:
                    guard !handles.isEmpty else { continue }
                    let h = handles.remove(at: rng.below(handles.count))
                    if rng.below(2) == 0 { try fs.fsync(node: h.node, handle: h.handle, dataOnly: false) }
                    fs.release(node: h.node, handle: h.handle)
                case 13: fs.forget(node: node, count: UInt64(bitPattern: v))
                case 14: _ = try fs.symlink(target: Array(name.utf8), parent: node, name: rng.pick(Self.names), caller: caller)
                case 15: _ = try fs.link(node: node, newParent: rng.pick(nodes), newName: name)
                default: _ = try fs.getattr(node: node)
                }
            } catch {
                errnos += 1  // an errno is an answer too
            }
        }
        for h in handles { fs.release(node: h.node, handle: h.handle) }
        #expect(errnos > steps / 10 && errnos < steps, "a mix of values and errnos: \(errnos) of \(steps)")
        // The tree is consistent: every linked node is in its folder under its name, and a
        // remount from what was saved shows the same tree.
        let before = Self.tree(fs)
        try fs.lock.withLock { () throws(Errno) in
            // `.nimbus/status`'s counts, kept as nodes changed, are what a look at every node finds.
            var walked = TreeCounts.Share()
            for n in fs.t.nodes.values where n.linked {
                if n.isDir { walked.folders += 1 } else if n.rec.kind == .file && !n.rec.isSpecial { walked.files += 1; walked.bytes += n.rec.size }
            }
            let c = fs.t.nodes.counts
            #expect(TreeCounts.Share(files: c.files, folders: c.folders, bytes: c.bytes) == walked, "the status counts (seed \(seed))")
            for n in fs.t.nodes.values where n.linked && n.node != NodeID.root {
                let p = try fs.node(n.parentNode)
                #expect(p.children[n.rec.name] == n.node, "\(n.rec.name) is in its folder")
                for l in n.links {
                    let lp = try fs.node(l.parentNode)
                    #expect(fs.t.byID[l.id] == n.node && lp.children[l.name] == n.node, "link \(l.name) is in its folder")
                }
            }
        }
        #expect(store.sync() == nil)
        store.close()
        let again = try LocalStore(directory: dir)
        defer { again.close() }
        let after = Self.tree(try ContainerFS(store: again))
        let differ = Set(before.keys).union(after.keys).filter { before[$0] != after[$0] }.sorted { $0.lexicographicallyPrecedes($1) }
        #expect(differ.isEmpty, "the remounted tree is the same (seed \(seed)): \(differ.prefix(5).map { "\(String(decoding: $0, as: UTF8.self).debugDescription): \(before[$0] ?? "-") → \(after[$0] ?? "-")" })")
    }

    /// Path (its bytes: NFC and NFD spellings are two paths) → (kind, size, mode) of every
    /// linked item.
    static func tree(_ fs: ContainerFS) -> [[UInt8]: String] {
        fs.lock.withLock {
            var out: [[UInt8]: String] = [:]
            for n in fs.t.nodes.values where n.linked && n.node != NodeID.root {
                for id in n.itemIDs {
                    out[Array(fs.pathLocked(n, id).utf8)] = "\(n.rec.kind) \(n.rec.size) \(String(n.rec.mode, radix: 8)) \(n.node) \(n.nameCount)"
                }
            }
            return out
        }
    }
}

extension Array {
    fileprivate func randomElement(using rng: inout SyscallFuzzTests.Rng) -> Element? {
        isEmpty ? nil : self[rng.below(count)]
    }
}
