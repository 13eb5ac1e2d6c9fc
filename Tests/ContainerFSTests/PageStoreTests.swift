import ContainerFS
import Dispatch
import Foundation
import FuseKit
import Glibc
import NimbusCore
import Synchronization
import Testing

/// The last close of a file written in part pages fills the kernel's pages from the cache file
/// (`KernelCache.storePages`), so its next read asks nothing; a writer or a truncation never
/// overlaps a store, and a remote version during one drops the pages again.
@Suite struct PageStoreTests {
    /// Records what the filesystem tells the kernel; a store can be held until `proceed`.
    final class Recorder: KernelCache {
        enum Event: Equatable { case store(NodeID, offset: Int64, bytes: [UInt8]), stored, invalidate(NodeID), other }
        let events = Mutex<[Event]>([])
        let holdStores = Atomic<Bool>(false)
        let entered = DispatchSemaphore(value: 0)
        let proceed = DispatchSemaphore(value: 0)
        func invalidateNode(_ node: NodeID) { events.withLock { $0.append(.invalidate(node)) } }
        func invalidateEntry(parent: NodeID, name: String) { events.withLock { $0.append(.other) } }
        func notifyDelete(parent: NodeID, child: NodeID, name: String) { events.withLock { $0.append(.other) } }
        func storePages(_ node: NodeID, fd: Int32, offset: Int64, length: Int) {
            // What the kernel would be given: the descriptor's bytes at this moment.
            var bytes = [UInt8](repeating: 0, count: length)
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, length, off_t(offset)) }
            events.withLock { $0.append(.store(node, offset: offset, bytes: Array(bytes.prefix(max(n, 0))))) }
            if holdStores.load(ordering: .relaxed) {
                entered.signal()
                proceed.wait()
            }
            events.withLock { $0.append(.stored) }
        }
        var stores: [Event] { events.withLock { $0.filter { if case .store = $0 { true } else { false } } } }
    }

    let me = Caller.process
    let root = NodeID.root

    func write(_ fs: ContainerFS, _ node: NodeID, _ h: HandleID, _ text: String, at offset: Int64 = 0) throws {
        let bytes = Array(text.utf8)
        _ = try bytes.withUnsafeBytes { try fs.write(node: node, handle: h, offset: offset, data: $0) }
    }

    @Test func theLastCloseOfAFileWrittenInPartStoresItsPages() throws {
        let f = try ContainerFSTests.Fixture()
        let k = Recorder()
        f.fs.setKernel(k)
        let (e, h) = try f.fs.create(parent: root, name: "a.txt", mode: 0o644, flags: O_RDWR, caller: me)
        try write(f.fs, e.node, h.handle, "hello")
        let reader = try f.fs.open(node: e.node, flags: O_RDONLY)
        f.fs.release(node: e.node, handle: h.handle)
        #expect(k.stores.isEmpty, "stored while a handle is still open")
        f.fs.release(node: e.node, handle: reader.handle)
        #expect(k.stores == [.store(e.node, offset: 0, bytes: Array("hello".utf8))])

        // Closed again with no write since: nothing owed.
        let again = try f.fs.open(node: e.node, flags: O_RDONLY)
        f.fs.release(node: e.node, handle: again.handle)
        #expect(k.stores.count == 1)

        // Whole pages only: the kernel holds them already.
        let (w, wh) = try f.fs.create(parent: root, name: "whole", mode: 0o644, flags: O_RDWR, caller: me)
        try write(f.fs, w.node, wh.handle, String(repeating: "x", count: 8192))
        f.fs.release(node: w.node, handle: wh.handle)
        #expect(k.stores.count == 1)

        // Two writes that meet inside a page (tar's 10 KiB blocks): the whole file, from its start.
        let (t, th) = try f.fs.create(parent: root, name: "tar", mode: 0o644, flags: O_RDWR, caller: me)
        try write(f.fs, t.node, th.handle, String(repeating: "a", count: 10240))
        try write(f.fs, t.node, th.handle, String(repeating: "b", count: 10240), at: 10240)
        f.fs.release(node: t.node, handle: th.handle)
        #expect(k.stores.last == .store(t.node, offset: 0, bytes: Array((String(repeating: "a", count: 10240) + String(repeating: "b", count: 10240)).utf8)))
    }

    /// A writer's open and a truncation wait for a store under way: if either went first, the
    /// kernel would keep the store's older bytes over the new ones.
    @Test func writersAndTruncationsWaitForAStore() throws {
        let f = try ContainerFSTests.Fixture()
        let k = Recorder()
        f.fs.setKernel(k)
        let (e, h) = try f.fs.create(parent: root, name: "a.txt", mode: 0o644, flags: O_RDWR, caller: me)
        let fs = f.fs
        fs.release(node: e.node, handle: h.handle)
        for change in ["open for writing", "truncate", "open with O_TRUNC"] {
            let w = try fs.open(node: e.node, flags: O_WRONLY)
            try write(fs, e.node, w.handle, "abc")
            k.holdStores.store(true, ordering: .relaxed)
            let closing = Thread { fs.release(node: e.node, handle: w.handle) }
            closing.start()
            k.entered.wait()
            let done = Atomic<Bool>(false)
            let node = e.node
            let changing = Thread {
                switch change {
                case "truncate":
                    var c = FuseSetAttr()
                    c.size = 1
                    _ = try? fs.setattr(node: node, c, handle: nil)
                case "open with O_TRUNC":
                    if let o = try? fs.open(node: node, flags: O_WRONLY | O_TRUNC) { fs.release(node: node, handle: o.handle) }
                default:
                    if let o = try? fs.open(node: node, flags: O_WRONLY) { fs.release(node: node, handle: o.handle) }
                }
                done.store(true, ordering: .relaxed)
            }
            changing.start()
            usleep(100_000)
            let early = done.load(ordering: .relaxed)
            #expect(!early, "\(change) went on during a store")
            // A reader does not wait.
            let r = try fs.open(node: e.node, flags: O_RDONLY)
            k.holdStores.store(false, ordering: .relaxed)
            k.proceed.signal()
            for _ in 0..<500 where !done.load(ordering: .relaxed) { usleep(10_000) }
            let finished = done.load(ordering: .relaxed)
            #expect(finished, "\(change) still waits after the store")
            fs.release(node: e.node, handle: r.handle)
        }
    }

    /// A remote version shown while the kernel's pages are being stored: they are dropped again
    /// once the store is done, so the kernel keeps none of the older bytes.
    @Test func aRemoteVersionDuringAStoreDropsThePages() throws {
        var options = ContainerFS.Options()
        options.deliverNotice = { $0() }
        let f = try ContainerFSTests.Fixture(options: options)
        let k = Recorder()
        f.fs.setKernel(k)
        let (e, h) = try f.fs.create(parent: root, name: "a.txt", mode: 0o644, flags: O_RDWR, caller: me)
        let id = try #require(ItemID(String(decoding: try f.fs.getxattr(node: e.node, name: "user.nimbus.itemid"), as: UTF8.self)))
        try write(f.fs, e.node, h.handle, "local")
        k.holdStores.store(true, ordering: .relaxed)
        let fs = f.fs
        let closed = DispatchSemaphore(value: 0)
        let closing = Thread { fs.release(node: e.node, handle: h.handle); closed.signal() }
        closing.start()
        k.entered.wait()
        var s = ContainerFSTests.state(id, in: .root, "a.txt")
        s.resetContent = true
        s.size = 6
        let (actions, skipped) = f.fs.applyRemote([s])
        #expect(skipped.isEmpty && actions.contains(.node(e.node)), "the remote version was not shown: \(actions) \(skipped)")
        f.fs.drainKernel()
        k.holdStores.store(false, ordering: .relaxed)
        k.proceed.signal()
        #expect(closed.wait(timeout: .now() + 5) == .success, "the close never ended")
        f.fs.drainKernel()
        let events = k.events.withLock { $0 }
        let stored = try #require(events.firstIndex(of: .stored))
        #expect(events[(stored + 1)...].contains(.invalidate(e.node)), "the stored pages stay after the remote version: \(events)")
    }
}
