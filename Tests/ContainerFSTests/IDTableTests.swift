@testable import ContainerFS
import Foundation
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Testing

/// Node and handle ids resolve through the mount's `IDTable` to what they name: every id is
/// given out once, keeps its meaning for the mount's life, and says who answers for it.
@Suite struct IDTableTests {
    let me = Caller.process

    func withFS(_ body: (ContainerFS) throws -> Void) throws {
        let dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-ids-\(UUID().uuidString)")
        let store = try LocalStore(directory: dir)
        defer { store.close(); try? FileManager.default.removeItem(at: dir) }
        try body(try ContainerFS(store: store))
    }

    @Test func nodesOfTheTreeAndOfNimbusNeverShareAnID() throws {
        try withFS { fs in
            let folder = try fs.mkdir(parent: .root, name: "d", mode: 0o755, caller: me)
            let id = try fs.lock.withLock { () throws(Errno) in try fs.node(folder.node).rec.id }
            // A versions node numbered between two items: each id names one thing.
            let mirror = fs.versions.node(.mirror(id))
            let (file, h) = try fs.create(parent: folder.node, name: "f", mode: 0o644, flags: O_RDWR, caller: me)
            fs.release(node: file.node, handle: h.handle)
            #expect(Set([folder.node, mirror, file.node]).count == 3)
            #expect(fs.ids.owner(of: folder.node) == .item && fs.ids.owner(of: file.node) == .item)
            #expect(fs.ids.owner(of: mirror) == .versions(.mirror(id)))
            #expect(fs.versions.node(.mirror(id)) == mirror, "a versions node keeps its id")
            // `.nimbus/` and `.nimbus/versions` are found by name and resolve to their owners.
            let control = try fs.lookup(parent: .root, name: ".nimbus")
            #expect(fs.ids.owner(of: control.node) == .control(.folder))
            let status = try fs.control.lookup(in: .folder, name: "status")
            #expect(fs.ids.owner(of: status.node) == .control(.status))
            let versions = try fs.control.lookup(in: .folder, name: "versions")
            #expect(fs.ids.owner(of: versions.node) == .versions(.mirror(.root)))
            #expect(try fs.versions.attr(.mirror(.root)).node == versions.node)
        }
    }

    @Test func handlesNameTheirOwnerUntilReleased() throws {
        try withFS { fs in
            let (file, h) = try fs.create(parent: .root, name: "f", mode: 0o644, flags: O_RDWR, caller: me)
            let listing = try fs.opendir(node: .root)
            let status = try fs.control.open(.status, flags: O_RDONLY, caller: me)
            let controlListing = try fs.control.opendir(.folder)
            #expect(Set([h.handle, listing, status.handle, controlListing]).count == 4)
            guard case .file(let fd)? = fs.ids.owner(ofHandle: h.handle) else { Issue.record("not a file handle"); return }
            #expect(fs.descriptor(h.handle) == fd && fd >= 0)
            #expect(fs.descriptor(status.handle) == nil && fs.descriptor(listing) == nil)
            if case .listing? = fs.ids.owner(ofHandle: listing) {} else { Issue.record("not a listing") }
            if case .control? = fs.ids.owner(ofHandle: status.handle) {} else { Issue.record("not a control handle") }
            #expect(try fs.control.read(handle: status.handle, offset: 0, size: 1 << 16).starts(with: Array("connection:".utf8)))
            fs.release(node: file.node, handle: h.handle)
            fs.releasedir(handle: listing)
            fs.control.release(handle: status.handle)
            fs.control.release(handle: controlListing)
            for released in [h.handle, listing, status.handle, controlListing] { #expect(fs.ids.owner(ofHandle: released) == nil) }
            #expect(throws: Errno.EBADF) { try fs.control.read(handle: status.handle, offset: 0, size: 1) }
            #expect(throws: Errno.EBADF) { try fs.control.readdir(handle: controlListing, offset: 0, plus: false, room: 4096) }
        }
    }

    @Test func itemIDsAfterARemountStartAboveEveryStoredOne() throws {
        let dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-ids-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: dir) }
        var store = try LocalStore(directory: dir)
        var fs = try ContainerFS(store: store)
        var seen: Set<NodeID> = []
        for name in ["a", "b", "c"] { seen.insert(try fs.mkdir(parent: .root, name: name, mode: 0o755, caller: me).node) }
        #expect(store.sync() == nil)
        store.close()
        store = try LocalStore(directory: dir)
        defer { store.close() }
        fs = try ContainerFS(store: store)
        let next = try fs.mkdir(parent: .root, name: "d", mode: 0o755, caller: me).node
        #expect(seen.allSatisfy { $0 < next }, "\(next) after \(seen.sorted())")
        #expect(try fs.lookup(parent: .root, name: "a").node == seen.min())
    }
}
