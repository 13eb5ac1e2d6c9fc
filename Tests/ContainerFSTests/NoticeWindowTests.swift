import ContainerFS
import Foundation
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Synchronization
import Testing

/// A local change is made under the filesystem's lock and told to the sync engine after it is
/// released. A pull that shows a server state in between finds the item neither queued nor being
/// written; it must still leave the new bytes alone. The observer here shows a server state of
/// the item exactly in that window, as a pull on another thread can.
@Suite struct NoticeWindowTests {
    /// Shows `remote` (a new version of the item with other content) when the filesystem tells
    /// it a content change, before anything else hears of it; records what was skipped.
    final class PullInTheWindow: ChangeObserver {
        struct State {
            var fs: ContainerFS?
            var remote: RemoteState?
            var skipped: [ItemID] = []
            var applied = 0
        }
        let state = Mutex(State())

        func localChange(_ change: LocalChange) {
            guard case .contentChanged(let id) = change else { return }
            let (fs, remote) = state.withLock { s -> (ContainerFS?, RemoteState?) in
                guard let r = s.remote, r.id == id else { return (nil, nil) }
                s.remote = nil
                return (s.fs, r)
            }
            guard let fs, let remote else { return }
            let (_, skipped) = fs.applyRemote([remote])
            state.withLock { $0.skipped += skipped; $0.applied += 1 }
        }
    }

    final class Fixture {
        let dir: URL
        let store: LocalStore
        let fs: ContainerFS
        let observer = PullInTheWindow()
        init() throws {
            dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-notice-\(UUID().uuidString)")
            store = try LocalStore(directory: dir)
            fs = try ContainerFS(store: store, observer: observer)
            observer.state.withLock { $0.fs = fs }
        }
        deinit { store.close(); try? FileManager.default.removeItem(at: dir) }

        /// Creates (or truncates) `name` in the root with `text`, fsynced and closed.
        @discardableResult
        func save(_ name: String, _ text: String) throws -> NodeID {
            let (node, handle): (NodeID, HandleID)
            if let e = try? fs.lookup(parent: .root, name: name) {
                (node, handle) = (e.node, try fs.open(node: e.node, flags: O_RDWR | O_TRUNC).handle)
            } else {
                let (e, h) = try fs.create(parent: .root, name: name, mode: 0o644, flags: O_RDWR, caller: .process)
                (node, handle) = (e.node, h.handle)
            }
            _ = try Array(text.utf8).withUnsafeBytes { try fs.write(node: node, handle: handle, offset: 0, data: $0) }
            try fs.fsync(node: node, handle: handle, dataOnly: false)
            fs.release(node: node, handle: handle)
            return node
        }

        func read(_ name: String) throws -> String { try fs.readText(name) }

        /// The server's next version of `name`: other content of `size` bytes.
        func newVersion(of name: String, size: Int64, deleted: Bool = false) throws -> RemoteState {
            let node = try fs.lookup(parent: .root, name: name).node
            let id = try #require(ItemID(String(decoding: try fs.getxattr(node: node, name: "user.nimbus.itemid"), as: UTF8.self)))
            var s = RemoteState(id: id, parent: .root, name: name, kind: .file, perm: 0o644, size: size, mtime: 0,
                                target: nil, deleted: deleted, resetContent: true)
            s.version = 9
            return s
        }
    }

    /// An editor's save: a temporary file renamed over the document. The document keeps its
    /// identity and takes the new bytes; the server's version arriving in the window is skipped.
    @Test func aRenameOverKeepsTheSaveFromAPullInTheWindow() throws {
        let f = try Fixture()
        try f.save("e.txt", "from elsewhere")
        try f.save(".tmp1", "saved here")
        let remote = try f.newVersion(of: "e.txt", size: 14)
        f.observer.state.withLock { $0.remote = remote }
        try f.fs.rename(parent: .root, name: ".tmp1", newParent: .root, newName: "e.txt", flags: [])
        let seen = f.observer.state.withLock { $0 }
        #expect(seen.applied == 1, "the rename told the engine a content change")
        #expect(seen.skipped == [remote.id], "the server's state waits: the engine has not heard of the save yet")
        #expect(try f.read("e.txt") == "saved here")
    }

    /// A fsynced write is told while its writer is still open, which already holds remote
    /// content back; a truncate without an open handle is told after the lock, like a rename.
    @Test func writesAndTruncatesKeepTheirBytesFromAPullInTheWindow() throws {
        let f = try Fixture()
        try f.save("c.md", "one")
        let first = try f.newVersion(of: "c.md", size: 3)
        f.observer.state.withLock { $0.remote = first }
        try f.save("c.md", "two, longer")
        #expect(f.observer.state.withLock { $0.skipped } == [first.id])
        #expect(try f.read("c.md") == "two, longer")

        let second = try f.newVersion(of: "c.md", size: 11)
        f.observer.state.withLock { $0.remote = second; $0.skipped = [] }
        var cut = FuseSetAttr()
        cut.size = 3
        _ = try f.fs.setattr(node: try f.fs.lookup(parent: .root, name: "c.md").node, cut, handle: nil)
        #expect(f.observer.state.withLock { $0.skipped } == [second.id])
        #expect(try f.read("c.md") == "two")
    }

    /// A delete from elsewhere arriving in the window does not take the bytes either.
    @Test func aDeleteInTheWindowWaits() throws {
        let f = try Fixture()
        try f.save("e.txt", "from elsewhere")
        try f.save(".tmp1", "saved here")
        let remote = try f.newVersion(of: "e.txt", size: 0, deleted: true)
        f.observer.state.withLock { $0.remote = remote }
        try f.fs.rename(parent: .root, name: ".tmp1", newParent: .root, newName: "e.txt", flags: [])
        #expect(f.observer.state.withLock { $0.skipped } == [remote.id])
        #expect(try f.read("e.txt") == "saved here")
    }
}

/// A truncation changes the bytes outside the filesystem's lock, before its write generation
/// moves. An upload that chunks the file in that moment must learn that a change is under way,
/// or it would commit the empty middle state of `printf … > file` as a version. The content
/// provider is told just before the bytes change (`willTruncate`): it reads the write state there.
@Suite struct TruncationWindowTests {
    final class Probe: ContentProvider {
        let fs = Mutex<ContainerFS?>(nil)
        let seen = Mutex<[WriteState]>([])
        func isPresent(_ item: ItemID, range: Range<Int64>) -> Bool { true }
        func hydrate(_ item: ItemID, range: Range<Int64>, done: @escaping @Sendable (Errno?) -> Void) { done(nil) }
        func willTruncate(_ item: ItemID) {
            guard let fs = fs.withLock({ $0 }), let ws = fs.writeState(item) else { return }
            seen.withLock { $0.append(ws) }
        }
    }

    @Test func aTruncationIsUnderWayUntilItsGenerationMoves() throws {
        let dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-trunc-\(UUID().uuidString)")
        let store = try LocalStore(directory: dir)
        defer { store.close(); try? FileManager.default.removeItem(at: dir) }
        let probe = Probe()
        let fs = try ContainerFS(store: store, content: probe)
        probe.fs.withLock { $0 = fs }
        let (e, h) = try fs.create(parent: .root, name: "f", mode: 0o644, flags: O_RDWR, caller: .process)
        _ = try Array("saved".utf8).withUnsafeBytes { try fs.write(node: e.node, handle: h.handle, offset: 0, data: $0) }
        try fs.fsync(node: e.node, handle: h.handle, dataOnly: false)
        fs.release(node: e.node, handle: h.handle)
        let id = try #require(ItemID(String(decoding: try fs.getxattr(node: e.node, name: "user.nimbus.itemid"), as: UTF8.self)))
        let idle = try #require(fs.writeState(id))
        #expect(!idle.changing && !idle.unsynced)

        // `printf … > f`: open with O_TRUNC (after an fsync, so the file had no unsynced write).
        let o = try fs.open(node: e.node, flags: O_WRONLY | O_TRUNC)
        var cut = FuseSetAttr()
        cut.size = 2
        _ = try fs.setattr(node: e.node, cut, handle: nil)  // truncate(2) without a handle
        let during = probe.seen.withLock { $0 }
        #expect(during.count == 2)
        let allChanging = during.allSatisfy { $0.changing }
        let sameGeneration = during.first?.generation == idle.generation
        #expect(allChanging, "\(during)")
        #expect(sameGeneration, "the generation moves only once the bytes changed")
        #expect(during.first?.unsynced == true, "an O_TRUNC open is mid-save until its close")
        let done = try #require(fs.writeState(id))
        #expect(!done.changing && done.generation != idle.generation)
        fs.release(node: e.node, handle: o.handle)
    }

    /// The cache keeper and the engine's upload queue in one: each content change told is
    /// queued, and at that moment an eviction is tried, which the "engine" allows for an item it
    /// has not queued (uploaded already). Simulation seed 3117 with restores and purges.
    final class EvictInTheWindow: ChangeObserver {
        struct State {
            var fs: ContainerFS?
            var queued: Set<ItemID> = []
            var evicted: [Bool] = []
        }
        let state = Mutex(State())
        func localChange(_ change: LocalChange) {
            guard case .contentChanged(let id) = change, let fs = state.withLock({ $0.fs }) else { return }
            let evicted = (try? fs.evictContent(id) { self.state.withLock { !$0.queued.contains(id) } }) != nil
            state.withLock { $0.evicted.append(evicted); $0.queued.insert(id) }
        }
    }

    /// A file whose change has not reached the engine is unsynced although no queue holds it
    /// (its last version was uploaded; a save was just renamed over it): the cache keeper must
    /// not make its bytes holes, or they would be uploaded as zeros.
    @Test func aFileIsNeverEvictedWhileItsChangeIsOnItsWayToTheEngine() throws {
        let dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-evict-\(UUID().uuidString)")
        let store = try LocalStore(directory: dir)
        defer { store.close(); try? FileManager.default.removeItem(at: dir) }
        let observer = EvictInTheWindow()
        let fs = try ContainerFS(store: store, observer: observer)
        observer.state.withLock { $0.fs = fs }
        func save(_ name: String, _ text: String) throws {
            let (e, h) = try fs.create(parent: .root, name: name, mode: 0o644, flags: O_RDWR, caller: .process)
            _ = try Array(text.utf8).withUnsafeBytes { try fs.write(node: e.node, handle: h.handle, offset: 0, data: $0) }
            try fs.fsync(node: e.node, handle: h.handle, dataOnly: false)
            fs.release(node: e.node, handle: h.handle)
            fs.forget(node: e.node, count: 1)
        }
        try save("doc.txt", "first")
        #expect(try fs.readText("doc.txt") == "first")
        // Uploaded: the engine holds nothing of it any more.
        observer.state.withLock { $0.queued.removeAll(); $0.evicted.removeAll() }
        // An editor's save: a new file renamed over the document (which keeps its identity).
        try save(".doc.txt.tmp", "second, longer")
        try fs.rename(parent: .root, name: ".doc.txt.tmp", newParent: .root, newName: "doc.txt", flags: [])
        let tries = observer.state.withLock { $0.evicted }
        #expect(tries.count >= 3 && !tries.contains(true), "evicted while the change was on its way: \(tries)")
        #expect(try fs.readText("doc.txt") == "second, longer")
    }
}
