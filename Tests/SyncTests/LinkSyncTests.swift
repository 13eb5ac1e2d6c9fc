import Foundation
import Glibc
import NimbusTesting
import Testing

/// Hard links across devices (docs/posix.md "Hard links"): on the device that makes them, one
/// inode with several names; on the server and every other device, ordinary files with the same
/// content. A change another device makes to one of the names takes that name off the inode.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct LinkSyncTests {
    /// `ln a b` on A gives two files on B; a write through one name on A reaches both on B; an
    /// `rm` of one name on A leaves the other everywhere.
    @Test func linkedNamesArriveAsFilesAndFollowEveryChange() async throws {
        try await SyncWorld.run("links") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("mkdir \(q(a))/d && printf one > \(q(a))/f && ln \(q(a))/f \(q(a))/d/g")
            try await eventually("both names on B", "test \"$(cat \(q(b))/f)$(cat \(q(b))/d/g)\" = oneone")
            #expect(try sh("stat -c %h \(q(b))/f \(q(b))/d/g") == "1\n1\n")
            #expect(try sh("stat -c %h \(q(a))/f") == "2\n")
            try sh("printf two >> \(q(a))/d/g")
            try await eventually("the write through d/g under both names on B", "test \"$(cat \(q(b))/f)$(cat \(q(b))/d/g)\" = onetwoonetwo")
            try sh("rm \(q(a))/f")
            try await eventually("f gone on B", "! test -e \(q(b))/f")
            #expect(try sh("cat \(q(b))/d/g") == "onetwo")
            #expect(try sh("cat \(q(a))/d/g && stat -c %h \(q(a))/d/g") == "onetwo1\n")
        }
    }

    /// B edits one name and renames another: on A each leaves the inode with B's change, and the
    /// names B did not touch keep A's content and stay linked. Nothing written on A is lost.
    @Test func aChangeFromAnotherDeviceTakesThatNameOffTheInode() async throws {
        try await SyncWorld.run("links-split") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf base > \(q(a))/x && ln \(q(a))/x \(q(a))/y && ln \(q(a))/x \(q(a))/z")
            try await eventually("the names on B", "test \"$(cat \(q(b))/x)$(cat \(q(b))/y)$(cat \(q(b))/z)\" = basebasebase")
            try await eventually("A's uploads done", "grep -qx 'upload-queue: 0' \(q(a))/.nimbus/status")
            try sh("printf theirs > \(q(b))/y && mv \(q(b))/z \(q(b))/z2")
            try await eventually("B's edit of y on A", "test \"$(cat \(q(a))/y)\" = theirs")
            try await eventually("B's rename of z on A", "test -e \(q(a))/z2 && ! test -e \(q(a))/z")
            #expect(try sh("cat \(q(a))/x; echo; cat \(q(a))/z2") == "base\nbase")
            let ino = try sh("stat -c %i \(q(a))/x \(q(a))/y \(q(a))/z2").split(separator: "\n")
            #expect(ino.count == 3 && Set(ino).count == 3, "three inodes: \(ino)")
            #expect(try sh("stat -c %h \(q(a))/x \(q(a))/y \(q(a))/z2") == "1\n1\n1\n")
            // The names are independent files now: a write to x changes x alone, everywhere.
            try sh("printf mine > \(q(a))/x")
            try await eventually("x on B", "test \"$(cat \(q(b))/x)\" = mine")
            #expect(try sh("cat \(q(a))/z2; echo; cat \(q(b))/z2; echo; cat \(q(b))/y") == "base\nbase\ntheirs")
        }
    }

    /// `mv a b && ln b a` at once (pjdfstest's rename/00.t): the create of `a` drafted before the
    /// rename and the new name `a` go up in one batch; the new name waits a moment, as a new
    /// file at a name just renamed away does, so the server never finds `a` taken and moves the
    /// link beside it.
    @Test func aLinkAtANameJustRenamedAwayKeepsItsName() async throws {
        try await SyncWorld.run("links-rename") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            for i in 0..<5 { try sh("cd \(q(a)) && printf \(i) > f\(i) && mv f\(i) g\(i) && ln g\(i) f\(i)") }
            try await eventually("A's uploads done", "grep -qx 'upload-queue: 0' \(q(a))/.nimbus/status")
            try await eventually("every name on B", "for i in 0 1 2 3 4; do test \"$(cat \(q(b))/f$i)$(cat \(q(b))/g$i)\" = $i$i || exit 1; done")
            #expect(try sh("ls \(q(a)) | sort | tr '\\n' ' '") == "f0 f1 f2 f3 f4 g0 g1 g2 g3 g4 ")
            #expect(try sh("ls \(q(b)) | sort | tr '\\n' ' '") == "f0 f1 f2 f3 f4 g0 g1 g2 g3 g4 ")
            #expect(try sh("stat -c %h \(q(a))/f0 \(q(a))/g4") == "2\n2\n")
        }
    }

    /// A link of a placeholder downloads its content first; the new name reaches the other device.
    @Test func linkingAPlaceholderDownloadsItFirst() async throws {
        try await SyncWorld.run("links-placeholder") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("head -c 300000 /dev/urandom > \(q(b))/p")
            try await eventually("p on A", "test -e \(q(a))/p")
            #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.status \(q(a))/p") == "cloud")
            try sh("ln \(q(a))/p \(q(a))/q")
            #expect(try sh("cmp \(q(a))/q \(q(b))/p && stat -c %h \(q(a))/p") == "2\n")
            try await eventually("q on B", "cmp \(q(b))/q \(q(b))/p")
        }
    }
}
