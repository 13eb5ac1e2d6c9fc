import Foundation
import Glibc
import NimbusTesting
import Testing

/// The races of DESIGN §3 on two real mounts (issue 6): made deterministic by pausing both
/// devices, acting on each, then resuming A (and letting its queue drain) before B.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct RaceTests {
    static let nimbus = NimbusBinary.path

    /// Pauses both, runs `onA` and `onB`, resumes A, waits for its queue, resumes B, waits for B's.
    static func race(_ a: String, _ b: String, onA: String, onB: String) async throws {
        try sh("\(q(nimbus)) pause \(q(a)) && \(q(nimbus)) pause \(q(b))")
        try sh(onA)
        usleep(1_100_000)  // B acts later (modification times decide some rules)
        try sh(onB)
        try sh("\(q(nimbus)) resume \(q(a))")
        try await eventually("A's queue drained", seconds: 30, "grep -q '^upload-queue: 0' \(q(a))/.nimbus/status")
        try sh("\(q(nimbus)) resume \(q(b))")
        try await eventually("B's queue drained", seconds: 30, "grep -q '^upload-queue: 0' \(q(b))/.nimbus/status")
    }

    /// The same listing (names, types, contents) on both devices, eventually; returns it.
    @discardableResult
    static func converge(_ a: String, _ b: String, _ dir: String = "") async throws -> String {
        let list = { (mp: String) in
            "cd \(q(mp + dir)) && find . -mindepth 1 | LC_ALL=C sort | while read -r p; do if [ -f \"$p\" ]; then echo \"$p $(cat \"$p\")\"; else echo \"$p/\"; fi; done"
        }
        do {
            try await eventually("the devices agree", seconds: 30, "test \"$(\(list(a)))\" = \"$(\(list(b)))\"")
        } catch {
            Issue.record("A:\n\((try? sh(list(a))) ?? "?")B:\n\((try? sh(list(b))) ?? "?")B's log:\n\((try? sh("tail -8 \(q(b))-state/mount.log")) ?? "")")
            throw error
        }
        return try sh(list(a))
    }

    @Test func everyRaceSurfacesTheSameWayOnBothDevices() async throws {
        try await SyncWorld.run("races") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")

            // Same-name creates: both kept, the second as "NAME 2.EXT".
            try await Self.race(a, b, onA: "printf 'from a' > \(q(a))/report.txt", onB: "printf 'from b' > \(q(b))/report.txt")
            var tree = try await Self.converge(a, b)
            #expect(tree == "./report 2.txt from b\n./report.txt from a\n", "\(tree)")
            try sh("rm \(q(a))/report.txt \(q(a))/'report 2.txt'")

            // Edit vs delete: the edit wins and the item comes back where it was deleted.
            try sh("printf v1 > \(q(a))/doc.txt")
            try await eventually("doc on B", "test \"$(cat \(q(b))/doc.txt 2>/dev/null)\" = v1")
            let id = try sh("getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(a))/doc.txt")
            try await Self.race(a, b, onA: "rm \(q(a))/doc.txt", onB: "printf 'edited on b' > \(q(b))/doc.txt")
            tree = try await Self.converge(a, b)
            #expect(tree == "./doc.txt edited on b\n", "\(tree)")
            #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(a))/doc.txt") == id, "the same item came back")

            // Rename on one device, edit on the other: the edit follows the renamed item.
            try await Self.race(a, b, onA: "mv \(q(a))/doc.txt \(q(a))/renamed.txt", onB: "printf 'edited again' > \(q(b))/doc.txt")
            tree = try await Self.converge(a, b)
            #expect(tree == "./renamed.txt edited again\n", "\(tree)")
            try sh("rm \(q(a))/renamed.txt")

            // Move cycle: A moves X into Y, B moves Y into X; the later move is refused and B's
            // tree reverts to the server's.
            try sh("mkdir \(q(a))/X \(q(a))/Y && printf x > \(q(a))/X/x.txt && printf y > \(q(a))/Y/y.txt")
            try await eventually("X and Y on B", "test -f \(q(b))/X/x.txt && test -f \(q(b))/Y/y.txt")
            try await Self.race(a, b, onA: "mv \(q(a))/X \(q(a))/Y/X", onB: "mv \(q(b))/Y \(q(b))/X/Y")
            tree = try await Self.converge(a, b)
            #expect(tree == "./Y/\n./Y/X/\n./Y/X/x.txt x\n./Y/y.txt y\n", "\(tree)")
            try sh("rm -r \(q(a))/Y")

            // Folder deleted on one device while a file in it is edited on the other: the edited
            // file survives with its folder; what was not edited goes. In both orders: the delete
            // reaching the server first, then the edit first.
            for (deleter, editor, label) in [(a, b, "delete first"), (b, a, "edit first")] {
                try sh("mkdir \(q(a))/F && printf old > \(q(a))/F/old.txt && printf keep > \(q(a))/F/other.txt")
                try await eventually("F on B (\(label))", "test \"$(cat \(q(b))/F/old.txt 2>/dev/null)\" = old && test -f \(q(b))/F/other.txt")
                let before = try sh("getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(a))/F/old.txt")
                if label == "delete first" {
                    try await Self.race(deleter, editor, onA: "rm -r \(q(deleter))/F", onB: "printf edited > \(q(editor))/F/old.txt")
                } else {
                    try await Self.race(editor, deleter, onA: "printf edited > \(q(editor))/F/old.txt", onB: "rm -r \(q(deleter))/F")
                }
                tree = try await Self.converge(a, b)
                #expect(tree == "./F/\n./F/old.txt edited\n", "\(label): \(tree)")
                #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(a))/F/old.txt") == before, "\(label): the same item survived")
                try sh("rm -r \(q(a))/F")
                try await eventually("F gone on B (\(label))", "! test -e \(q(b))/F")
            }

            // Case-only rename: the other device shows the new case and not the old name.
            try sh("printf r > \(q(a))/Readme.md")
            try await eventually("Readme on B", "test -f \(q(b))/Readme.md")
            try sh("mv \(q(a))/Readme.md \(q(a))/README.md")
            tree = try await Self.converge(a, b)
            #expect(tree == "./README.md r\n", "\(tree)")
        }
    }
}
