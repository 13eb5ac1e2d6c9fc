import Foundation
import Glibc
import NimbusTesting
import Testing

/// `.nimbusignore` (docs/ignore.md): gitignore rules that sync like any file; what they match
/// stays on the device that has it, and what stops matching goes up.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct IgnoreSyncTests {
    /// Rules with a negation and a folder pattern hold on both devices, and say which rule
    /// matched; an ignored file survives a remount.
    @Test func ignoredItemsStayOnTheirDeviceAndTheRulesSync() async throws {
        try await SyncWorld.run("ignore-rules") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf '*.log\\n!keep.log\\nbuild/\\n' > \(q(a))/.nimbusignore")
            try await eventually("the rules on B", "grep -qx 'build/' \(q(b))/.nimbusignore")
            try sh("mkdir -p \(q(a))/build/obj \(q(a))/src && printf x > \(q(a))/build/obj/x.o && printf a > \(q(a))/a.log"
                   + " && printf k > \(q(a))/keep.log && printf s > \(q(a))/src/main.c && printf l > \(q(a))/src/deep.log")
            try sh("printf b > \(q(b))/b.log")
            try await eventually("keep.log and src/main.c on B", "test \"$(cat \(q(b))/keep.log)$(cat \(q(b))/src/main.c)\" = ks")
            try await eventually("A's uploads done", "grep -qx 'upload-queue: 0' \(q(a))/.nimbus/status")
            try await eventually("B's uploads done", "grep -qx 'upload-queue: 0' \(q(b))/.nimbus/status")
            // A round trip after them: a later file reaches the other device, the ignored ones never.
            try sh("printf late > \(q(a))/late.txt && printf late > \(q(b))/lateB.txt")
            try await eventually("late.txt on B", "test -e \(q(b))/late.txt")
            try await eventually("lateB.txt on A", "test -e \(q(a))/lateB.txt")
            for p in ["build", "a.log", "src/deep.log"] { #expect(!FileManager.default.fileExists(atPath: "\(b)/\(p)"), "\(p) reached B") }
            #expect(!FileManager.default.fileExists(atPath: "\(a)/b.log"), "b.log reached A")
            // Each device says so, and names the rule.
            #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.status \(q(a))/a.log") == "local-only")
            #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.status \(q(a))/build/obj/x.o") == "local-only")
            #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.ignored \(q(a))/src/deep.log") == "*.log (/.nimbusignore line 1)")
            #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.ignored \(q(a))/build/obj/x.o") == "build/ (/.nimbusignore line 3)")
            #expect(try sh("getfattr -n user.nimbus.ignored \(q(a))/keep.log 2>&1 || true").contains("No such attribute"))
            #expect(try sh("\(q(NimbusBinary.path)) status \(q(a))/a.log").contains("ignored by *.log (/.nimbusignore line 1)"))
            // The ignored file survives a remount, still ignored.
            try sh("\(q(NimbusBinary.path)) unmount \(q(a))")
            try w.remount("a")
            #expect(try sh("cat \(q(a))/a.log") == "a")
            try sh("printf after > \(q(a))/after.txt")
            try await eventually("after.txt on B", "test -e \(q(b))/after.txt")
            #expect(!FileManager.default.fileExists(atPath: "\(b)/a.log"))
        }
    }

    /// A rule added later: a synced file it matches stays on the server as it was, and edits of
    /// it stay on the device that makes them — a pull never overwrites them. When the rule goes,
    /// the edit goes up (on its base: no conflict), and a file created meanwhile goes up new.
    @Test func aRuleAddedLaterKeepsEditsHereAndItsRemovalSendsThem() async throws {
        try await SyncWorld.run("ignore-later") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf v1 > \(q(a))/t.tmp")
            try await eventually("t.tmp on B", "test \"$(cat \(q(b))/t.tmp)\" = v1")
            try sh("printf '*.tmp\\n' > \(q(a))/.nimbusignore")
            try await eventually("the rule on B", "grep -qx '\\*.tmp' \(q(b))/.nimbusignore")
            try sh("printf v2-a > \(q(a))/t.tmp && printf new > \(q(a))/n.tmp && printf v2-b > \(q(b))/t.tmp")
            try sh("printf mark > \(q(a))/mark.txt && printf mark > \(q(b))/markB.txt")
            try await eventually("mark.txt on B", "test -e \(q(b))/mark.txt")
            try await eventually("markB.txt on A", "test -e \(q(a))/markB.txt")
            // Each device keeps its own edit; the server still has v1.
            #expect(try sh("cat \(q(a))/t.tmp") == "v2-a")
            #expect(try sh("cat \(q(b))/t.tmp") == "v2-b")
            #expect(!FileManager.default.fileExists(atPath: "\(b)/n.tmp"))
            // The rule goes (on A): A's edit and its new file go up; B, whose edit is still
            // its own until B hears the rule went, then sends its edit on the same base: the
            // server keeps both (a conflict), nothing is lost.
            try sh("rm \(q(a))/.nimbusignore")
            try await eventually("n.tmp on B", "test \"$(cat \(q(b))/n.tmp)\" = new")
            try await eventually("no rules on B", "! test -e \(q(b))/.nimbusignore")
            try await eventually("A's uploads done", "grep -qx 'upload-queue: 0' \(q(a))/.nimbus/status")
            try await eventually("B's uploads done", "grep -qx 'upload-queue: 0' \(q(b))/.nimbus/status")
            try await eventually("both edits on both devices",
                                 "test \"$(cat \(q(a))/t.tmp)\" = \"$(cat \(q(b))/t.tmp)\" && test \"$(getfattr --only-values -n user.nimbus.conflicts \(q(a))/t.tmp)\" = 1")
            let current = try sh("cat \(q(a))/t.tmp")
            #expect(current == "v2-a" || current == "v2-b")
            let other = current == "v2-a" ? "v2-b" : "v2-a"
            #expect(try sh("cat \(q(a))/.nimbus/versions/t.tmp/* ").contains(other))
        }
    }
}
