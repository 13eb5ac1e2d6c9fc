@testable import ContainerFS
import Foundation
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Testing

/// `readdir` as plain values: the entries that fit the kernel's buffer, in order, resumable at
/// any offset, with readdirplus counting a lookup for exactly the entries handed over.
@Suite struct ReaddirTests {
    let me = Caller.process
    let root = NodeID.root

    final class Fixture {
        let dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-readdir-\(UUID().uuidString)")
        let store: LocalStore
        let fs: ContainerFS
        init() throws {
            store = try LocalStore(directory: dir)
            fs = try ContainerFS(store: store)
        }
        deinit { store.close(); try? FileManager.default.removeItem(at: dir) }
    }

    /// Creates `name` and drops the kernel's reference its creation took.
    func file(_ f: Fixture, _ name: String, in parent: NodeID? = nil) throws -> NodeID {
        let (e, o) = try f.fs.create(parent: parent ?? root, name: name, mode: 0o644, flags: O_RDWR, caller: me)
        f.fs.release(node: e.node, handle: o.handle)
        f.fs.forget(node: e.node, count: 1)
        return e.node
    }

    @Test(arguments: [false, true])
    func aListingComesInPiecesThatFitTheBuffer(plus: Bool) throws {
        let f = try Fixture()
        var names: Set<String> = []
        for i in 0..<60 {
            let name = "file \(i) " + String(repeating: "é", count: i % 17)  // 2-byte letters: sizes count bytes
            names.insert(name)
            _ = try file(f, name)
        }
        let h = try f.fs.opendir(node: root)
        defer { f.fs.releasedir(handle: h) }
        var seen: [String] = []
        var offset: Int64 = 0
        var calls = 0
        let room = 1024
        while true {
            let part = try f.fs.readdir(node: root, handle: h, offset: offset, plus: plus, room: room)
            if part.isEmpty { break }
            calls += 1
            let used = part.reduce(0) { $0 + DirectoryBuffer.entrySize(nameBytes: $1.name.utf8.count, plus: plus) }
            #expect(used <= room)
            for (k, e) in part.enumerated() {
                #expect(e.nextOffset == offset + Int64(k) + 1, "offsets count entries")
            }
            seen += part.map(\.name)
            offset = part.last!.nextOffset
        }
        #expect(seen.prefix(2) == [".", ".."])
        #expect(Set(seen.dropFirst(2)) == names && seen.count == names.count + 2, "every child once; .nimbus not listed")
        #expect(calls > 1, "1 KiB does not hold 62 entries")
        // "." and ".." carry no node (the kernel takes no reference for them); the rest do.
        let again = try f.fs.readdir(node: root, handle: h, offset: 0, plus: plus, room: 1 << 20)
        #expect(again.prefix(2).allSatisfy { $0.entry.node == .absent })
        #expect(again.dropFirst(2).allSatisfy { $0.entry.node >= IDTable.firstCountedNode && $0.entry.attr.st_mode & S_IFMT == S_IFREG })
    }

    @Test func aListingResumesPastAnEntryRemovedMeanwhile() throws {
        let f = try Fixture()
        for n in ["a", "b", "c"] { _ = try file(f, n) }
        let h = try f.fs.opendir(node: root)
        defer { f.fs.releasedir(handle: h) }
        let first = try f.fs.readdir(node: root, handle: h, offset: 0, plus: false, room: DirectoryBuffer.entrySize(nameBytes: 1, plus: false) * 3)
        #expect(first.map(\.name).count == 3)
        let listed = Set(first.dropFirst(2).map(\.name))
        let next = try #require(["a", "b", "c"].first { !listed.contains($0) })
        try f.fs.unlink(parent: root, name: next)
        let rest = try f.fs.readdir(node: root, handle: h, offset: first.last!.nextOffset, plus: false, room: 4096)
        #expect(!rest.map(\.name).contains(next), "an entry removed since the listing was taken is skipped")
        #expect(Set(rest.map(\.name)).union(listed).count == 2)
        #expect(throws: Errno.EBADF) { try f.fs.readdir(node: root, handle: .absent, offset: 2, plus: false, room: 4096) }
        #expect(throws: Errno.EINVAL) { try f.fs.readdir(node: root, handle: h, offset: -1, plus: false, room: 4096) }
    }

    /// readdirplus hands the kernel a reference per entry: a file listed that way and then
    /// removed lives on until the kernel forgets it; one that did not fit is gone at once.
    @Test func plusCountsALookupForEachEntryHandedOver() throws {
        let f = try Fixture()
        let a = try file(f, "a"), b = try file(f, "b")
        let h = try f.fs.opendir(node: root)
        defer { f.fs.releasedir(handle: h) }
        let fits = DirectoryBuffer.entrySize(nameBytes: 1, plus: true) + 2 * DirectoryBuffer.entrySize(nameBytes: 2, plus: true)
        let part = try f.fs.readdir(node: root, handle: h, offset: 0, plus: true, room: fits)
        #expect(part.count == 3, "., .. and one file")
        let (listed, unlisted) = part[2].name == "a" ? (a, b) : (b, a)
        try f.fs.unlink(parent: root, name: "a")
        try f.fs.unlink(parent: root, name: "b")
        #expect(throws: Never.self) { try f.fs.getattr(node: listed) }
        #expect(throws: Errno.ENOENT) { try f.fs.getattr(node: unlisted) }
        f.fs.forget(node: listed, count: 1)
        #expect(throws: Errno.ENOENT) { try f.fs.getattr(node: listed) }
    }

    @Test func theControlFolderListsItsFiles() throws {
        let f = try Fixture()
        let control = try f.fs.lookup(parent: root, name: ".nimbus")
        let folder = try #require({ if case .control(let x) = f.fs.ids.owner(of: control.node) { x } else { nil } }())
        let h = try f.fs.control.opendir(folder)
        defer { f.fs.control.release(handle: h) }
        let names = try f.fs.control.readdir(handle: h, offset: 0, plus: true, room: 1 << 16).map(\.name)
        #expect(names == [".", "..", "status", "claims", "events", "conflicts", "requests", "versions", "trash"])
    }
}
