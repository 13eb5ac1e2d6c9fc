import ContainerFS
import Foundation
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Synchronization
import Testing

/// The filesystem driven directly, without a kernel: fast checks of the semantics the mount tests
/// then confirm with real tools.
@Suite struct ContainerFSTests {
    final class Fixture {
        let dir: URL
        var store: LocalStore
        var fs: ContainerFS
        init(options: ContainerFS.Options = ContainerFS.Options()) throws {
            dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-cfs-\(UUID().uuidString)")
            store = try LocalStore(directory: dir)
            fs = try ContainerFS(store: store, options: options)
        }
        func reopen() throws {
            store.close()
            store = try LocalStore(directory: dir)
            fs = try ContainerFS(store: store)
        }
        deinit { store.close(); try? FileManager.default.removeItem(at: dir) }
    }
    let me = Caller.process
    let root = NodeID.root

    @Test func createWriteReadBackAfterReopen() throws {
        let f = try Fixture()
        let (e, h) = try f.fs.create(parent: root, name: "a.txt", mode: 0o644, flags: O_RDWR, caller: me)
        let bytes: [UInt8] = Array("hello world".utf8)
        let n = try bytes.withUnsafeBytes { try f.fs.write(node: e.node, handle: h.handle, offset: 0, data: $0) }
        #expect(n == bytes.count)
        f.fs.release(node: e.node, handle: h.handle)
        #expect(try f.fs.getattr(node: e.node).st_size == 11)
        try f.reopen()
        let again = try f.fs.lookup(parent: root, name: "a.txt")
        #expect(again.node == e.node)  // node ids are stable across remounts
        #expect(again.attr.st_size == 11)
        #expect(again.attr.st_mode == S_IFREG | 0o644)
    }

    @Test func namesAreValidatedAndControlNameIsReserved() throws {
        let f = try Fixture()
        #expect(throws: Errno.ENAMETOOLONG) { try f.fs.mkdir(parent: root, name: String(repeating: "x", count: 256), mode: 0o755, caller: me) }
        #expect(throws: Errno.EEXIST) { try f.fs.mkdir(parent: root, name: ".nimbus", mode: 0o755, caller: me) }
        #expect(throws: Errno.EPERM) { try f.fs.rmdir(parent: root, name: ".nimbus") }
        _ = try f.fs.mkdir(parent: root, name: "d", mode: 0o755, caller: me)
        #expect(throws: Errno.EEXIST) { try f.fs.mkdir(parent: root, name: "d", mode: 0o755, caller: me) }
        // FIFOs, sockets and device nodes are local-only items (0x103: major 1, minor 3); other
        // types are no node at all.
        let fifo = try f.fs.mknod(parent: root, name: "fifo", mode: S_IFIFO | 0o644, caller: me)
        #expect(fifo.attr.st_mode == S_IFIFO | 0o644)
        let dev = try f.fs.mknod(parent: root, name: "dev", mode: S_IFCHR | 0o600, rdev: UInt64(0x103), caller: me)
        #expect(dev.attr.st_rdev == 0x103 && dev.attr.st_mode == S_IFCHR | 0o600)
        let devID = try #require(ItemID(String(decoding: try f.fs.getxattr(node: dev.node, name: "user.nimbus.itemid"), as: UTF8.self)))
        #expect(f.fs.localState(devID)?.isSpecial == true && f.fs.localState(devID)?.rdev == UInt64(0x103))
        #expect(throws: Errno.EEXIST) { try f.fs.mknod(parent: root, name: "fifo", mode: S_IFSOCK | 0o644, caller: me) }
        #expect(throws: Errno.EINVAL) { try f.fs.mknod(parent: root, name: "x", mode: S_IFDIR | 0o644, caller: me) }
    }

    @Test func renameRules() throws {
        let f = try Fixture()
        let a = try f.fs.mkdir(parent: root, name: "a", mode: 0o755, caller: me)
        let b = try f.fs.mkdir(parent: a.node, name: "b", mode: 0o755, caller: me)
        #expect(throws: Errno.EINVAL) { try f.fs.rename(parent: root, name: "a", newParent: b.node, newName: "x", flags: []) }
        _ = try f.fs.mkdir(parent: root, name: "c", mode: 0o755, caller: me)
        _ = try f.fs.mkdir(parent: root, name: "full", mode: 0o755, caller: me)
        let full = try f.fs.lookup(parent: root, name: "full")
        _ = try f.fs.mknod(parent: full.node, name: "x", mode: S_IFREG | 0o644, caller: me)
        #expect(throws: Errno.ENOTEMPTY) { try f.fs.rename(parent: root, name: "c", newParent: root, newName: "full", flags: []) }
        #expect(throws: Errno.EEXIST) { try f.fs.rename(parent: root, name: "c", newParent: root, newName: "a", flags: .noReplace) }
        try f.fs.rename(parent: a.node, name: "b", newParent: root, newName: "B", flags: [])
        #expect(try f.fs.getattr(node: root).st_nlink == 2 + 4)  // a, c, full, B
        #expect(try f.fs.getattr(node: a.node).st_nlink == 2)
        try f.fs.rename(parent: root, name: "a", newParent: root, newName: "c", flags: .exchange)
        #expect(try f.fs.lookup(parent: root, name: "c").node == a.node)
    }

    @Test func xattrsVirtualAndStored() throws {
        let f = try Fixture()
        let d = try f.fs.mkdir(parent: root, name: "d", mode: 0o755, caller: me)
        #expect(try f.fs.getxattr(node: d.node, name: "user.nimbus.status") == Array("current".utf8))
        #expect(throws: Errno.ENODATA) { try f.fs.getxattr(node: d.node, name: "security.capability") }
        #expect(throws: Errno.EPERM) { try f.fs.setxattr(node: d.node, name: "user.nimbus.status", value: [1], flags: 0) }
        try f.fs.setxattr(node: d.node, name: "user.k", value: [7], flags: 1)
        #expect(throws: Errno.EEXIST) { try f.fs.setxattr(node: d.node, name: "user.k", value: [8], flags: 1) }
        #expect(throws: Errno.ENODATA) { try f.fs.setxattr(node: d.node, name: "user.none", value: [8], flags: 2) }
        try f.reopen()
        #expect(try f.fs.getxattr(node: d.node, name: "user.k") == [7])
        let list = String(decoding: try f.fs.listxattr(node: d.node), as: UTF8.self).split(separator: "\0")
        #expect(list == ["user.nimbus.status", "user.nimbus.itemid", "user.k"])
    }

    @Test func sizeIsReconciledFromCacheAfterCrash() throws {
        let f = try Fixture()
        let (e, h) = try f.fs.create(parent: root, name: "f", mode: 0o644, flags: O_RDWR, caller: me)
        f.store.sync()
        // Bytes reach the cache file but the size is never recorded (as after kill -9).
        let s = "abcdef"
        let fd = try #require(f.fs.descriptor(h.handle))
        _ = pwrite(fd, s, 6, 0)
        close(fd)
        try f.reopen()
        #expect(try f.fs.getattr(node: e.node).st_size == 6)
    }

    /// A deletion lost in a crash (still in the write-behind queue) brings the file back with its
    /// bytes — never as an empty file whose content the sync engine thinks it has; a deletion
    /// that was committed leaves no cache file behind.
    @Test func aDeletionLostInACrashKeepsTheBytes() throws {
        let f = try Fixture()
        var nodes: [String: NodeID] = [:]
        for name in ["lost", "gone"] {
            let (e, h) = try f.fs.create(parent: root, name: name, mode: 0o644, flags: O_RDWR, caller: me)
            let bytes = Array("content of \(name)".utf8)
            _ = try bytes.withUnsafeBytes { try f.fs.write(node: e.node, handle: h.handle, offset: 0, data: $0) }
            f.fs.release(node: e.node, handle: h.handle)
            f.fs.forget(node: e.node, count: 1)
            nodes[name] = e.node
        }
        try f.fs.unlink(parent: root, name: "gone")
        f.store.sync()  // committed: its cache file is removed
        let lostID = try #require(f.store.load().items.first { $0.name == "lost" }).id
        try f.fs.unlink(parent: root, name: "lost")
        f.store.abandon()  // kill -9 before the deletion was committed
        f.store = try LocalStore(directory: f.dir)
        f.fs = try ContainerFS(store: f.store)
        let back = try f.fs.lookup(parent: root, name: "lost")
        #expect(back.attr.st_size == Int64("content of lost".utf8.count))
        let h = try f.fs.open(node: back.node, flags: O_RDONLY)
        var buf = [UInt8](repeating: 0, count: 64)
        let n = pread(try #require(f.fs.descriptor(h.handle)), &buf, buf.count, 0)
        f.fs.release(node: back.node, handle: h.handle)
        #expect(String(decoding: buf.prefix(max(n, 0)), as: UTF8.self) == "content of lost")
        #expect(throws: Errno.ENOENT) { try f.fs.lookup(parent: root, name: "gone") }
        let cached = try FileManager.default.subpathsOfDirectory(atPath: f.store.cache.directory.path)
            .filter { !$0.hasSuffix("/") && $0.contains("-") }
        #expect(cached.count == 1 && cached[0].hasSuffix(lostID.description), "\(cached)")
    }
}

extension ContainerFSTests {
    /// A removed file's cache file goes to the trash right after the request that reaped its node
    /// released the tree's lock, and leaves the disk once the deletion is committed.
    @Test func aRemovedFilesCacheFileGoesOnceTheLockIsReleased() throws {
        let f = try Fixture()
        let (e, h) = try f.fs.create(parent: root, name: "a", mode: 0o644, flags: O_RDWR, caller: me)
        _ = try Array("bytes".utf8).withUnsafeBytes { try f.fs.write(node: e.node, handle: h.handle, offset: 0, data: $0) }
        f.fs.release(node: e.node, handle: h.handle)
        let id = try #require(ItemID(String(decoding: try f.fs.getxattr(node: e.node, name: "user.nimbus.itemid"), as: UTF8.self)))
        let place = f.store.cache.path(for: id)
        try f.fs.unlink(parent: root, name: "a")
        #expect(access(place, F_OK) == 0, "the kernel still knows the node: nothing moves yet")
        f.fs.forget(node: e.node, count: 1)
        #expect(access(place, F_OK) != 0, "the forget that reaped the node moved its file")
        f.store.sync()
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: f.store.cache.trashDirectory)) ?? []).isEmpty)
    }

    /// An item shown again under its id (a restore, a delete undone by an edit elsewhere) while
    /// the move of its old cache file to the trash is still owed: the move is done first, so the
    /// bytes the new node gets stay, and the old file still leaves the disk.
    @Test func anItemShownAgainBeforeItsOldFileMovedKeepsItsNewFile() throws {
        let held = Mutex<[@Sendable () -> Void]>([])
        var options = ContainerFS.Options()
        options.holdRetiredFiles = { move in held.withLock { $0.append(move) } }
        let f = try Fixture(options: options)
        let (e, h) = try f.fs.create(parent: root, name: "a", mode: 0o644, flags: O_RDWR, caller: me)
        _ = try Array("old bytes".utf8).withUnsafeBytes { try f.fs.write(node: e.node, handle: h.handle, offset: 0, data: $0) }
        f.fs.release(node: e.node, handle: h.handle)
        let id = try #require(ItemID(String(decoding: try f.fs.getxattr(node: e.node, name: "user.nimbus.itemid"), as: UTF8.self)))
        try f.fs.unlink(parent: root, name: "a")
        f.fs.forget(node: e.node, count: 1)
        let place = f.store.cache.path(for: id)
        #expect(access(place, F_OK) == 0, "the move is held")
        var s = Self.state(id, in: .root, "a")
        s.size = 3
        _ = f.fs.applyRemote([s])
        // Its content arrives (a download writes the cache file).
        let fd = f.store.cache.open(id, create: true, truncate: true, size: 3)
        #expect(fd >= 0)
        _ = pwrite(fd, "new", 3, 0)
        close(fd)
        for work in held.withLock({ w in defer { w = [] }; return w }) { work() }
        f.store.sync()
        var buf = [UInt8](repeating: 0, count: 16)
        let g = open(place, O_RDONLY)
        let n = g >= 0 ? read(g, &buf, buf.count) : -1
        if g >= 0 { close(g) }
        #expect(String(decoding: buf.prefix(max(n, 0)), as: UTF8.self) == "new", "the new node's file was moved away")
        #expect(((try? FileManager.default.contentsOfDirectory(atPath: f.store.cache.trashDirectory)) ?? []).isEmpty)
        let back = try f.fs.lookup(parent: root, name: "a")
        #expect(back.attr.st_size == 3)
    }
}

extension ContainerFSTests {
    static func state(_ id: ItemID, in parent: ItemID, _ name: String, _ kind: ItemKind = .file) -> RemoteState {
        RemoteState(id: id, parent: parent, name: name, kind: kind, perm: kind == .folder ? 0o755 : 0o644, size: 0, mtime: 0,
                    target: nil, deleted: false, resetContent: false)
    }

    /// States whose places form a cycle through a folder not here yet: the new folder F wants
    /// the name X holds, X wants the name Y holds, and Y moves into F. One of them is set aside
    /// and all three are shown in one batch (none waits for a relist that could never help).
    @Test func aCycleOfPlacesThroughANewFolderIsShown() throws {
        let f = try Fixture()
        let x = ItemID(UUID()), y = ItemID(UUID()), folder = ItemID(UUID())
        let (_, first) = f.fs.applyRemote([Self.state(x, in: .root, "f"), Self.state(y, in: .root, "x")])
        #expect(first.isEmpty)
        let (_, skipped) = f.fs.applyRemote([Self.state(folder, in: .root, "f", .folder), Self.state(x, in: .root, "x"), Self.state(y, in: folder, "y")])
        #expect(skipped.isEmpty)
        #expect(f.fs.localState(folder).map { [$0.parent, $0.name] as [AnyHashable?] } == [ItemID.root, "f"])
        #expect(f.fs.localState(x).map { [$0.parent, $0.name] as [AnyHashable?] } == [ItemID.root, "x"])
        #expect(f.fs.localState(y).map { [$0.parent, $0.name] as [AnyHashable?] } == [folder, "y"])
        #expect(try f.fs.lookup(parent: root, name: "f").attr.st_mode & S_IFMT == S_IFDIR)
    }

    /// Places that wait on each other without a cycle of names (Y waits for a folder that is
    /// nowhere): nothing is set aside, and the states wait.
    @Test func statesWaitingForAFolderNowhereWait() throws {
        let f = try Fixture()
        let x = ItemID(UUID()), y = ItemID(UUID()), nowhere = ItemID(UUID())
        _ = f.fs.applyRemote([Self.state(x, in: .root, "a"), Self.state(y, in: .root, "b")])
        let (_, skipped) = f.fs.applyRemote([Self.state(x, in: .root, "b"), Self.state(y, in: nowhere, "y")])
        #expect(Set(skipped) == [x, y])
        #expect(f.fs.localState(x)?.name == "a")
        #expect(f.fs.localState(y)?.name == "b")
    }
}

extension ContainerFSTests {
    /// A pull planned before a rename here (the engine had heard of no move: generation 0), shown
    /// after it, keeps the local place; so does one shown while the rename's notice is on its way
    /// (`deliverNotice` holds it). A pull never undoes a local rename; without one it moves the item.
    @Test func aPullNeverUndoesALocalRename() throws {
        let f = try Fixture()
        let x = ItemID(UUID())
        _ = f.fs.applyRemote([Self.state(x, in: .root, "a")])
        let planned = try #require(f.fs.placeGeneration(x))
        try f.fs.rename(parent: root, name: "a", newParent: root, newName: "b", flags: [])
        var s = Self.state(x, in: .root, "a")
        s.unlessMovedSince = planned
        let (_, skipped) = f.fs.applyRemote([s])
        #expect(skipped.isEmpty)
        #expect(f.fs.localState(x)?.name == "b", "the pull undid the rename")
        // Planned after the engine heard of the rename: the server's place goes in.
        s.name = "c"
        s.unlessMovedSince = f.fs.placeGeneration(x)
        _ = f.fs.applyRemote([s])
        #expect(f.fs.localState(x)?.name == "c")

        // The rename's notice on its way: the engine cannot have planned with it.
        let held = Mutex<[@Sendable () -> Void]>([])
        var options = ContainerFS.Options()
        options.deliverNotice = { notice in held.withLock { $0.append(notice) } }
        let g = try Fixture(options: options)
        let y = ItemID(UUID())
        _ = g.fs.applyRemote([Self.state(y, in: .root, "a")])
        try g.fs.rename(parent: root, name: "a", newParent: root, newName: "b", flags: [])
        var t = Self.state(y, in: .root, "z")
        t.unlessMovedSince = g.fs.placeGeneration(y)
        _ = g.fs.applyRemote([t])
        #expect(g.fs.localState(y)?.name == "b", "a pull shown while the rename's notice was on its way undid it")
        for notice in held.withLock({ $0 }) { notice() }
        t.unlessMovedSince = g.fs.placeGeneration(y)
        _ = g.fs.applyRemote([t])
        #expect(g.fs.localState(y)?.name == "z")
    }
    /// User attributes sync (docs/mount.md "Extended attributes"): a remote state brings its
    /// attributes, name by name, except over a change made here that the engine has not heard of
    /// yet (it is pushed next and merged name by name), or over one made since the commit it
    /// answers.
    @Test func aPullBringsXattrsButNeverOverwritesOnesChangedHere() throws {
        let held = Mutex<[@Sendable () -> Void]>([])
        var options = ContainerFS.Options()
        options.deliverNotice = { notice in held.withLock { $0.append(notice) } }
        let f = try Fixture(options: options)
        let x = ItemID(UUID())
        var s = Self.state(x, in: .root, "a")
        s.xattrs = ["user.tag": Array("red".utf8)]
        _ = f.fs.applyRemote([s])
        let node = try #require(f.fs.snapshot(x).local?.node)
        #expect(try f.fs.getxattr(node: node, name: "user.tag") == Array("red".utf8))
        // A state that says nothing of attributes leaves them.
        _ = f.fs.applyRemote([Self.state(x, in: .root, "a")])
        #expect(f.fs.snapshot(x).xattrs == ["user.tag": Array("red".utf8)])

        // Set here, its notice on its way: that name waits, the others come (the item's base
        // moves to this state: one left behind would go up as removed).
        try f.fs.setxattr(node: node, name: "user.tag", value: Array("blue".utf8), flags: 0)
        s.xattrs = ["user.tag": Array("green".utf8), "user.other": [1]]
        _ = f.fs.applyRemote([s])
        #expect(f.fs.snapshot(x).xattrs == ["user.tag": Array("blue".utf8), "user.other": [1]],
                "a pull overwrote an attribute set here, or left out one set elsewhere")
        for notice in held.withLock({ $0 }) { notice() }
        held.withLock { $0.removeAll() }
        _ = f.fs.applyRemote([s])
        #expect(f.fs.snapshot(x).xattrs == ["user.tag": Array("green".utf8), "user.other": [1]])

        // A commit's answer over a change made since its draft: that change stays (user.other
        // removed here goes up next); a name unchanged here takes the answer's value.
        var answer = s
        answer.xattrs = ["user.tag": Array("merged".utf8), "user.other": [1]]
        answer.sentXattrs = ["user.tag": Array("green".utf8), "user.other": [1]]
        try f.fs.removexattr(node: node, name: "user.other")
        for notice in held.withLock({ $0 }) { notice() }
        _ = f.fs.applyRemote([answer])
        #expect(f.fs.snapshot(x).xattrs == ["user.tag": Array("merged".utf8)])
        answer.xattrs = ["user.tag": Array("merged".utf8)]
        answer.sentXattrs = ["user.tag": Array("green".utf8)]
        _ = f.fs.applyRemote([answer])
        #expect(f.fs.snapshot(x).xattrs == ["user.tag": Array("merged".utf8)])
    }

    /// An item's attributes: 4 KiB of names and values at most (`E2BIG`), on every mount.
    @Test func xattrsHaveABudgetPerItem() throws {
        let f = try Fixture()
        let (e, h) = try f.fs.create(parent: root, name: "f", mode: 0o644, flags: O_RDWR, caller: me)
        f.fs.release(node: e.node, handle: h.handle)
        let big = [UInt8](repeating: 7, count: UserXattrs.budget - "user.a".utf8.count)
        try f.fs.setxattr(node: e.node, name: "user.a", value: big, flags: 0)
        #expect(throws: Errno.E2BIG) { try f.fs.setxattr(node: e.node, name: "user.b", value: [1], flags: 0) }
        #expect(throws: Errno.E2BIG) { try f.fs.setxattr(node: e.node, name: "user.a", value: big + [1], flags: 0) }
        // Replacing a value counts the new one only.
        try f.fs.setxattr(node: e.node, name: "user.a", value: [1], flags: 0)
        try f.fs.setxattr(node: e.node, name: "user.b", value: [1], flags: 0)
    }

    /// `.nimbusignore` verdicts (docs/ignore.md): `user.nimbus.ignored` names the rule, a rules
    /// file says which lines it left out, a new content of it takes effect at once, and a rules
    /// file inside an ignored folder is ignored with it.
    @Test func ignoreRulesSayWhatTheyMatchAndWhatTheyLeftOut() throws {
        let f = try Fixture()
        func write(_ parent: NodeID, _ name: String, _ text: String) throws -> NodeID {
            let node: NodeID
            let handle: HandleID
            if let e = try? f.fs.lookup(parent: parent, name: name) {
                node = e.node
                handle = try f.fs.open(node: node, flags: O_WRONLY | O_TRUNC).handle
            } else {
                let (e, h) = try f.fs.create(parent: parent, name: name, mode: 0o644, flags: O_RDWR, caller: me)
                (node, handle) = (e.node, h.handle)
            }
            let bytes = Array(text.utf8)
            _ = try bytes.withUnsafeBytes { try f.fs.write(node: node, handle: handle, offset: 0, data: $0) }
            f.fs.release(node: node, handle: handle)
            return node
        }
        func ignored(_ node: NodeID) -> String? {
            (try? f.fs.getxattr(node: node, name: NimbusXattr.ignored.name)).map { String(decoding: $0, as: UTF8.self) }
        }
        let rules = try write(root, ".nimbusignore", "*.log\n[abc\nbuild/\n!keep.log\n")
        let log = try write(root, "a.log", "x")
        let keep = try write(root, "keep.log", "x")
        let txt = try write(root, "b.txt", "x")
        let build = try f.fs.mkdir(parent: root, name: "build", mode: 0o755, caller: me).node
        let obj = try write(build, "x.o", "x")
        let inner = try write(build, ".nimbusignore", "!x.o\n")
        #expect(ignored(log) == "*.log (/.nimbusignore line 1)")
        #expect(ignored(keep) == nil && ignored(txt) == nil && ignored(rules) == nil)
        #expect(ignored(obj) == "build/ (/.nimbusignore line 3)", "nothing inside an ignored folder is included again")
        #expect(ignored(inner) == "build/ (/.nimbusignore line 3)", "a rules file goes with its ignored folder")
        let problems = String(decoding: try f.fs.getxattr(node: rules, name: NimbusXattr.error.name), as: UTF8.self)
        #expect(problems.hasPrefix("rules left out: line 2"), "\(problems)")
        #expect(throws: Errno.ENODATA) { try f.fs.getxattr(node: txt, name: NimbusXattr.error.name) }
        // New rules apply at once.
        _ = try write(root, ".nimbusignore", "*.txt\n")
        #expect(ignored(log) == nil && ignored(obj) == nil && ignored(inner) == nil)
        #expect(ignored(txt) == "*.txt (/.nimbusignore line 1)")
        #expect(throws: Errno.ENODATA) { try f.fs.getxattr(node: rules, name: NimbusXattr.error.name) }
        #expect(throws: Errno.EPERM) { try f.fs.setxattr(node: txt, name: NimbusXattr.ignored.name, value: [49], flags: 0) }
    }
}
