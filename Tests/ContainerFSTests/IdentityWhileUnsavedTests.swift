import ContainerFS
import Foundation
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Testing

/// An editor's save renamed over a document takes the document's identity, exchanging the two
/// content files at once and the rows at the store's next commit. While the store cannot commit
/// (a full disk), a crash would leave each id naming the other's bytes: the save then stays an
/// item of its own, and nothing of it is lost.
@Suite struct IdentityWhileUnsavedTests {
    final class Fixture {
        let dir: URL
        let store: LocalStore
        let fs: ContainerFS
        init() throws {
            dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-identity-\(UUID().uuidString)")
            store = try LocalStore(directory: dir, writer: .caller)
            fs = try ContainerFS(store: store)
        }
        deinit { store.close(); try? FileManager.default.removeItem(at: dir) }

        func save(_ name: String, _ text: String) throws {
            let (e, h) = try fs.create(parent: .root, name: name, mode: 0o644, flags: O_RDWR, caller: .process)
            _ = try Array(text.utf8).withUnsafeBytes { try fs.write(node: e.node, handle: h.handle, offset: 0, data: $0) }
            try fs.fsync(node: e.node, handle: h.handle, dataOnly: false)
            fs.release(node: e.node, handle: h.handle)
        }

        func id(_ name: String) throws -> String {
            String(decoding: try fs.getxattr(node: try fs.lookup(parent: .root, name: name).node, name: "user.nimbus.itemid"), as: UTF8.self)
        }

        func read(_ name: String) throws -> String { try fs.readText(name) }
    }

    @Test func aSaveKeepsTheDocumentsIdentityOnlyWhileTheStoreCommits() throws {
        let f = try Fixture()
        try f.save("doc.txt", "first")
        f.store.writePending()
        let doc = try f.id("doc.txt")
        try f.save(".tmp1", "second")
        try f.fs.rename(parent: .root, name: ".tmp1", newParent: .root, newName: "doc.txt", flags: [])
        #expect(try f.id("doc.txt") == doc, "a save takes the document's identity")
        f.store.writePending()

        try f.save(".tmp2", "third")
        f.store.writePending()
        f.store.simulateFullDisk(true)
        // Any change now waits in the store's queue, and the commit of it fails.
        let (e, h) = try f.fs.create(parent: .root, name: "other.txt", mode: 0o644, flags: O_RDWR, caller: .process)
        f.fs.release(node: e.node, handle: h.handle)
        f.store.writePending()
        #expect(f.store.lastError != nil, "the store cannot commit")
        let save = try f.id(".tmp2")
        try f.fs.rename(parent: .root, name: ".tmp2", newParent: .root, newName: "doc.txt", flags: [])
        #expect(try f.id("doc.txt") == save, "while the store cannot commit, the save keeps its own identity")
        #expect(try f.read("doc.txt") == "third")
        f.store.simulateFullDisk(false)
        f.store.writePending()
        #expect(f.store.lastError == nil)
        #expect(try f.read("doc.txt") == "third" && f.id("doc.txt") == save)
    }
}
