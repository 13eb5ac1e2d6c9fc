@testable import ContainerFS
import Foundation
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Testing

/// Another local user on a shared mount (docs/security.md "Another local user"): any syscall
/// argument is survived, the control files show only what the modes let the user reach, names
/// are bytes. The mount tests (Tests/SyncTests/LocalUserMountTests.swift) confirm it through a
/// real kernel as a real other user.
@Suite struct LocalUserTests {
    typealias Fixture = ContainerFSTests.Fixture
    let me = Caller.process
    let alice = Caller(uid: 1000, gid: 1000)
    let bob = Caller(uid: 2000, gid: 2000)
    let root = NodeID.root

    @Test func extremeTimesFromAnyUserAreClampedNotACrash() throws {
        let f = try Fixture()
        let (e, h) = try f.fs.create(parent: root, name: "f", mode: 0o666, flags: O_RDWR, caller: bob)
        f.fs.release(node: e.node, handle: h.handle)
        let cases: [(Int, Int, Int64)] = [
            (10_000_000_000, 0, ItemLimits.time.upperBound),           // touch -d @10000000000 (year 2286)
            (-11_676_096_000, 0, ItemLimits.time.lowerBound),          // touch -d 1600-01-01
            (Int.max, 999_999_999, ItemLimits.time.upperBound),
            (Int.min, 0, ItemLimits.time.lowerBound),
            (Int.max / 1_000_000_000, 999_999_999, ItemLimits.time.upperBound),
            (-1, 500_000_000, -500_000_000),                           // half a second before 1970
            (1_700_000_000, 123, 1_700_000_000_000_000_123),
        ]
        for (sec, nsec, want) in cases {
            var c = FuseSetAttr()
            c.mtime = .at(timespec(tv_sec: sec, tv_nsec: nsec))
            c.atime = .at(timespec(tv_sec: sec, tv_nsec: nsec))
            let st = try f.fs.setattr(node: e.node, c, handle: nil)
            #expect(Int64(st.st_mtim.tv_sec) * 1_000_000_000 + Int64(st.st_mtim.tv_nsec) == want, "\(sec).\(nsec)")
            #expect((0..<1_000_000_000).contains(st.st_mtim.tv_nsec), "a valid timespec for \(sec).\(nsec): \(st.st_mtim)")
        }
        #expect(ItemLimits.time(seconds: .min, nanoseconds: .min) == ItemLimits.time.lowerBound)
        #expect(ItemLimits.time(seconds: .max, nanoseconds: .max) == ItemLimits.time.upperBound)
        #expect(ItemLimits.time(seconds: 0, nanoseconds: .max) == ItemLimits.time.upperBound)
    }

    @Test func nfcAndNfdNamesAreTwoFiles() throws {
        let f = try Fixture()
        let nfc = "caf\u{E9}", nfd = "cafe\u{301}"
        let (a, ha) = try f.fs.create(parent: root, name: nfc, mode: 0o644, flags: O_RDWR, caller: me)
        f.fs.release(node: a.node, handle: ha.handle)
        let (b, hb) = try f.fs.create(parent: root, name: nfd, mode: 0o644, flags: O_RDWR, caller: me)
        f.fs.release(node: b.node, handle: hb.handle)
        #expect(a.node != b.node)
        #expect(try f.fs.lookup(parent: root, name: nfc).node == a.node)
        #expect(try f.fs.lookup(parent: root, name: nfd).node == b.node)
        let names = try f.fs.lock.withLock { () throws(Errno) in try f.fs.snapshot(root).entries.map { Array($0.name.utf8) } }
        #expect(names.contains(Array(nfc.utf8)) && names.contains(Array(nfd.utf8)))
        try f.fs.unlink(parent: root, name: nfd)
        #expect(try f.fs.lookup(parent: root, name: nfc).node == a.node, "removing one spelling leaves the other")
        #expect(throws: Errno.ENOENT) { try f.fs.lookup(parent: root, name: nfd) }
        // A rename from one spelling to the other is a real rename.
        try f.fs.rename(parent: root, name: nfc, newParent: root, newName: nfd, flags: [])
        #expect(try f.fs.lookup(parent: root, name: nfd).node == a.node)
        #expect(throws: Errno.ENOENT) { try f.fs.lookup(parent: root, name: nfc) }
    }

    /// Alice's 0700 folder, a file inside it with a newline in its name, and a public file.
    func aliceTree(_ f: Fixture) throws -> (priv: FuseEntry, inner: FuseEntry, pub: FuseEntry) {
        let priv = try f.fs.mkdir(parent: root, name: "private", mode: 0o700, caller: alice)
        let (inner, h1) = try f.fs.create(parent: priv.node, name: "diary\nforged line", mode: 0o644, flags: O_RDWR, caller: alice)
        f.fs.release(node: inner.node, handle: h1.handle)
        let (pub, h2) = try f.fs.create(parent: root, name: "public.txt", mode: 0o644, flags: O_RDWR, caller: alice)
        f.fs.release(node: pub.node, handle: h2.handle)
        return (priv, inner, pub)
    }

    func readAll(_ f: Fixture, _ file: ControlFS.File, as caller: Caller, chunk: Int = 1 << 20) throws -> String {
        let o = try f.fs.control.open(file, flags: O_RDONLY, caller: caller)
        defer { f.fs.control.release(handle: o.handle) }
        var out: [UInt8] = []
        while true {
            let b = try f.fs.control.read(handle: o.handle, offset: Int64(out.count), size: chunk)
            if b.isEmpty { break }
            out += b
        }
        return String(decoding: out, as: UTF8.self)
    }

    @Test func eventsShowAnotherUserOnlyWhatItCanReach() throws {
        let f = try Fixture()
        _ = try aliceTree(f)
        for i in 0..<50 { _ = try f.fs.mkdir(parent: root, name: "open-\(i)", mode: 0o755, caller: alice) }
        let all = try readAll(f, .events, as: me)
        #expect(all.contains("/private/diary\\nforged line") && all.contains("/public.txt"))
        #expect(!all.contains("diary\nforged"), "a newline in a name is escaped")
        for chunk in [1 << 20, 7, 100] {
            let bobs = try readAll(f, .events, as: bob, chunk: chunk)
            #expect(!bobs.contains("diary"), "bob cannot enter /private (read \(chunk) bytes at a time): \(bobs)")
            #expect(bobs.contains("/public.txt") && bobs.contains("created local /private\n"), "bob sees what he can reach")
            #expect(bobs.contains("/open-49\n") && bobs.split(separator: "\n").count == all.split(separator: "\n").count - 1,
                    "only the one line is left out, none repeated")
        }
        #expect(try readAll(f, .events, as: alice).contains("diary"), "alice owns the folder")
    }

    @Test func claimsShowAnotherUserOnlyWhatItCanReach() async throws {
        let f = try Fixture()
        let t = try aliceTree(f)
        let inner = try f.fs.lock.withLock { () throws(Errno) in try f.fs.node(t.inner.node).rec.id }
        let claim = try await f.fs.coordinator.claim(inner, .shared, label: "test", timeout: .seconds(1)).get()
        defer { claim.release() }
        let mine = try readAll(f, .claims, as: me)
        #expect(mine.contains("/private/diary\\nforged line"), "\(mine)")
        let bobs = try readAll(f, .claims, as: bob)
        #expect(!bobs.contains("diary") && !bobs.contains("private"), "\(bobs)")
    }

    @Test func versionFoldersCarryTheItemsOwnerAndMode() throws {
        let f = try Fixture()
        let t = try aliceTree(f)
        let (secret, h) = try f.fs.create(parent: root, name: "secret", mode: 0o600, flags: O_RDWR, caller: alice)
        f.fs.release(node: secret.node, handle: h.handle)
        func id(_ n: NodeID) throws -> ItemID { try f.fs.lock.withLock { () throws(Errno) in try f.fs.node(n).rec.id } }
        let mirror = try f.fs.versions.attr(.mirror(try id(t.priv.node)))
        #expect(mirror.st_uid == 1000 && mirror.st_mode == S_IFDIR | 0o500, "a 0700 folder's mirror: \(String(mirror.st_mode, radix: 8))")
        let secretVersions = try f.fs.versions.attr(.versions(try id(secret.node)))
        #expect(secretVersions.st_uid == 1000 && secretVersions.st_mode == S_IFDIR | 0o700, "\(String(secretVersions.st_mode, radix: 8))")
        let pubVersions = try f.fs.versions.attr(.versions(try id(t.pub.node)))
        #expect(pubVersions.st_mode == S_IFDIR | 0o755, "\(String(pubVersions.st_mode, radix: 8))")
    }

    @Test func onlyAUserWhoMayWriteAFileHoldsItsSync() throws {
        let f = try Fixture()
        let t = try aliceTree(f)
        #expect(f.fs.mayWrite(node: t.pub.node, caller: alice))
        #expect(!f.fs.mayWrite(node: t.pub.node, caller: bob), "0644 of alice: bob may only read")
        #expect(f.fs.mayWrite(node: t.pub.node, caller: Caller(uid: 0, gid: 0)))
        #expect(!f.fs.mayWrite(node: t.pub.node, caller: Caller(uid: 3000, gid: 1000)), "group has no w")
    }
}
