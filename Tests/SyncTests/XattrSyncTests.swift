import Foundation
import Glibc
import NimbusTesting
import Testing

/// User extended attributes sync (docs/mount.md "Extended attributes", docs/sync.md "Extended
/// attributes"): `user.*` but `user.nimbus.*`, at most 4 KiB of names and values per item, merged
/// name by name and with content edits made elsewhere.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct XattrSyncTests {
    @Test func attributesSetOnADeviceReadBackOnTheOther() async throws {
        try await SyncWorld.run("xattr-sync") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("mkdir \(q(a))/d && printf doc > \(q(a))/d/f && setfattr -n user.tag -v x \(q(a))/d/f && setfattr -n user.color -v blue \(q(a))/d")
            // Within 2 s of the set (the must-show of the issue): timed from the set on A.
            let started = ContinuousClock.now
            try await eventually("user.tag on B", "test \"$(getfattr --only-values -n user.tag \(q(b))/d/f 2>/dev/null)\" = x")
            let took = ContinuousClock.now - started
            print("xattr on B after \(took)")
            #expect(took < .seconds(2), "user.tag took \(took) to reach B")
            try await eventually("the folder's user.color on B", "test \"$(getfattr --only-values -n user.color \(q(b))/d 2>/dev/null)\" = blue")
            // Binary values, a change, a removal.
            try sh("setfattr -n user.bin -v 0x00ff10 \(q(a))/d/f && setfattr -n user.tag -v y \(q(a))/d/f && setfattr -x user.color \(q(a))/d")
            try await eventually("the change on B", "test \"$(getfattr --only-values -n user.tag \(q(b))/d/f 2>/dev/null)\" = y")
            #expect(try sh("getfattr --absolute-names -e hex --only-values -n user.bin \(q(b))/d/f | od -An -tx1 | tr -d ' \\n'") == "00ff10")
            try await eventually("the removal on B", "! getfattr -n user.color \(q(b))/d 2>/dev/null")
            // Over the budget: E2BIG on the device that tries; nothing changes anywhere.
            let big = String(repeating: "a", count: 4096)
            #expect(try sh("setfattr -n user.big -v \(big) \(q(a))/d/f 2>&1 || true").contains("Argument list too long"))
            #expect(try sh("getfattr --absolute-names -d \(q(a))/d/f | grep -c user.big || true").trimmingCharacters(in: .whitespacesAndNewlines) == "0")
            // user.nimbus.* are this device's: never synced, never settable as data.
            #expect(try sh("setfattr -n user.nimbus.mine -v 1 \(q(a))/d/f 2>&1 || true").contains("Operation not permitted"))
        }
    }

    /// A sets an attribute while B edits the content of the same file (and another attribute):
    /// both survive on both devices, with no conflict version.
    @Test func anAttributeAndAContentEditMadeAtOnceBothSurvive() async throws {
        try await SyncWorld.run("xattr-merge") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf v1 > \(q(a))/f")
            try await eventually("f on B", "test \"$(cat \(q(b))/f)\" = v1")
            let nimbus = q(NimbusBinary.path)
            try sh("\(nimbus) pause \(q(a)) && \(nimbus) pause \(q(b))")
            try sh("setfattr -n user.fromA -v 1 \(q(a))/f")
            try sh("printf v2 > \(q(b))/f && setfattr -n user.fromB -v 2 \(q(b))/f")
            try sh("\(nimbus) resume \(q(a)) && \(nimbus) resume \(q(b))")
            for (dev, m) in [("A", a), ("B", b)] {
                try await eventually("content v2 on \(dev)", "test \"$(cat \(q(m))/f)\" = v2")
                try await eventually("both attributes on \(dev)",
                                     "test \"$(getfattr --only-values -n user.fromA \(q(m))/f 2>/dev/null)$(getfattr --only-values -n user.fromB \(q(m))/f 2>/dev/null)\" = 12")
            }
            // Merged, not a conflict: no conflict version on either device.
            try await eventually("A's uploads done", "grep -qx 'upload-queue: 0' \(q(a))/.nimbus/status")
            try await eventually("B's uploads done", "grep -qx 'upload-queue: 0' \(q(b))/.nimbus/status")
            for m in [a, b] {
                #expect(try sh("cat \(q(m))/.nimbus/conflicts") == "")
                #expect(try sh("getfattr --only-values -n user.nimbus.status \(q(m))/f") != "conflict")
            }
        }
    }
}
