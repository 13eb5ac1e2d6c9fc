import Foundation
import Glibc
import NimbusTesting
import Testing

/// Conflict versions reachable with ordinary tools (issue 6, docs/sync.md "Conflicts and
/// versions"): status and count xattrs, `.nimbus/conflicts`, `nimbus versions|resolve|restore`.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct ConflictTests {
    static let nimbus = NimbusBinary.path

    static func xattr(_ path: String, _ name: String) -> String {
        shStatus("getfattr --absolute-names --only-values -n user.nimbus.\(name) \(q(path))").1
    }

    /// `nimbus versions --json` rows.
    static func versions(_ path: String) throws -> [[String: Any]] {
        try sh("\(q(nimbus)) versions --json \(q(path))").split(separator: "\n").compactMap {
            try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// A device offline while its file's old version was pruned and its chunks collected: its
    /// edit on that old base (a chmod: the content is still the base's) gets `missing_chunks`.
    /// The device then asks which chunks the server lacks instead of trusting its base, uploads
    /// them, and the commit goes in as a conflict — nothing stays queued for ever, nothing lost.
    @Test func anEditOnABaseWhoseChunksWereCollectedUploadsThemAgain() async throws {
        try await SyncWorld.run("gc-base", serve: ["--keep-versions", "0", "--keep-days", "0", "--gc-interval", "0"]) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf 'first words' > \(q(a))/doc.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/doc.txt)\" = 'first words'")
            try sh("\(q(Self.nimbus)) pause \(q(a))")
            try sh("printf 'second words' > \(q(b))/doc.txt")
            try await eventually("B's edit uploaded", "test \"$(getfattr --absolute-names --only-values -n user.nimbus.status \(q(b))/doc.txt)\" = current")
            // v1 is pruned at once (no history kept); its chunk is referenced by nothing now.
            let gc = try await w.admin("gc", ["--grace", "0"])
            #expect(gc.contains("freed 1 chunk"), "\(gc)")
            try sh("chmod 600 \(q(a))/doc.txt")
            try sh("\(q(Self.nimbus)) resume \(q(a))")
            try await eventually("A's edit committed", seconds: 30,
                                 "grep -q '^upload-queue: 0$' \(q(a))/.nimbus/status && test \"$(getfattr --absolute-names --only-values -n user.nimbus.conflicts \(q(a))/doc.txt)\" = 1")
            try await eventually("the conflict on B", seconds: 30,
                                 "test \"$(getfattr --absolute-names --only-values -n user.nimbus.conflicts \(q(b))/doc.txt)\" = 1")
            // Both contents are kept: the current one and A's as the conflict version.
            let rows = try Self.versions(b + "/doc.txt")
            #expect(rows.count >= 2, "\(rows)")
            _ = try await w.admin("check", [])  // fails (non-zero exit) on any inconsistency
        }
    }

    @Test func airplaneModeEndsAsCurrentPlusAConflictVersionAndResolvesEverywhere() async throws {
        try await SyncWorld.run("airplane") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf v1 > \(q(a))/doc.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/doc.txt)\" = v1")
            try sh("\(q(Self.nimbus)) pause \(q(a)) && \(q(Self.nimbus)) pause \(q(b))")
            try sh("printf 'edit on a' > \(q(a))/doc.txt")
            usleep(1_100_000)  // B's edit is the later one: it becomes current
            try sh("printf 'edit on b, later' > \(q(b))/doc.txt")
            // While offline, versions cannot be listed: a clear error, not a hang.
            let offline = shStatus("\(q(Self.nimbus)) versions \(q(a))/doc.txt")
            #expect(offline.0 == 3 && offline.1.contains("cannot be reached"), "\(offline)")
            try sh("\(q(Self.nimbus)) resume \(q(a)) && \(q(Self.nimbus)) resume \(q(b))")

            // Both devices: the later edit is current, one conflict version holds the other.
            for mp in [a, b] {
                try await eventually("current content on \(mp)", seconds: 30, "test \"$(cat \(q(mp))/doc.txt)\" = 'edit on b, later'")
                try await eventually("conflict status on \(mp)", seconds: 30,
                                     "test \"$(getfattr --absolute-names --only-values -n user.nimbus.status \(q(mp))/doc.txt)\" = conflict")
                #expect(Self.xattr(mp + "/doc.txt", "conflicts") == "1")
                #expect(try sh("cat \(q(mp))/.nimbus/conflicts") == "1 /doc.txt\n")
                #expect(try sh("grep '^conflicts:' \(q(mp))/.nimbus/status") == "conflicts: 1\n")
            }
            let table = try sh("\(q(Self.nimbus)) versions \(q(b))/doc.txt")
            #expect(table.contains("conflict!") && table.contains("current") && table.contains("VERSION"), "\(table)")
            let rows = try Self.versions(b + "/doc.txt")
            let conflict = try #require(rows.first { ($0["role"] as? String) == "conflict" }, "\(rows)")
            #expect(conflict["device"] as? String == "a" && conflict["size"] as? Int == 9, "\(conflict)")
            let current = try #require(rows.first { ($0["role"] as? String) == "current" })
            #expect(current["device"] as? String == "b", "\(current)")

            // Resolve on B by keeping the conflict version: A shows it, no conflict anywhere.
            let resolvedAt = Date()
            try sh("\(q(Self.nimbus)) resolve \(q(b))/doc.txt --keep \(conflict["version"] as? Int ?? 0)")
            try await eventually("A shows the kept version", "test \"$(cat \(q(a))/doc.txt)\" = 'edit on a'")
            print("sync figures: a resolve on B reached A's files after \(Date().timeIntervalSince(resolvedAt)) s")
            for mp in [a, b] {
                try await eventually("no conflict left on \(mp)", "test \"$(getfattr --absolute-names --only-values -n user.nimbus.conflicts \(q(mp))/doc.txt)\" = 0")
                // `current`, or `cloud` where the kept version was not read yet.
                try await eventually("no conflict status on \(mp)",
                                     "s=$(getfattr --absolute-names --only-values -n user.nimbus.status \(q(mp))/doc.txt); echo \"status $s, "
                                     + "error $(getfattr --absolute-names --only-values -n user.nimbus.error \(q(mp))/doc.txt 2>&1)\"; "
                                     + "echo \"$s\" | grep -qxE 'current|cloud'")
                #expect(try sh("cat \(q(mp))/.nimbus/conflicts") == "")
                #expect(try sh("cat \(q(mp))/doc.txt") == "edit on a")
            }
            #expect(try Self.versions(a + "/doc.txt").allSatisfy { ($0["role"] as? String) != "conflict" })

            // Restore the first version: every device shows it; bad requests are clear errors.
            let first = try Self.versions(a + "/doc.txt").compactMap { $0["version"] as? Int }.min() ?? 0
            try sh("\(q(Self.nimbus)) restore \(q(a))/doc.txt --version \(first)")
            try await eventually("B shows the restored version", "test \"$(cat \(q(b))/doc.txt)\" = v1")
            let bad = shStatus("\(q(Self.nimbus)) resolve \(q(a))/doc.txt --keep 999999")
            #expect(bad.0 != 0 && bad.1.contains("refused"), "\(bad)")
        }
    }

    /// `mv A B` over a file when A has unresolved conflict versions (the other device's write):
    /// no identity transfer — B's item goes, A's item with its versions lives on under the name
    /// B, on every device: the conflict version stays in `.nimbus/versions/B.txt/` and
    /// `.nimbus/conflicts`.
    @Test func renamingAFileWithConflictVersionsOverAnotherKeepsThem() async throws {
        try await SyncWorld.run("rename-conflicted") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf v1 > \(q(a))/A.txt && printf target > \(q(a))/B.txt")
            try await eventually("both on B", "test \"$(cat \(q(b))/A.txt)\" = v1 && test \"$(cat \(q(b))/B.txt)\" = target")
            try sh("\(q(Self.nimbus)) pause \(q(a)) && \(q(Self.nimbus)) pause \(q(b))")
            try sh("printf 'edit on a' > \(q(a))/A.txt")
            usleep(1_100_000)  // B's edit is the later one: it becomes current
            try sh("printf 'edit on b, later' > \(q(b))/A.txt")
            try sh("\(q(Self.nimbus)) resume \(q(a)) && \(q(Self.nimbus)) resume \(q(b))")
            for mp in [a, b] {
                try await eventually("the conflict on \(mp)", seconds: 30, "test \"$(cat \(q(mp))/.nimbus/conflicts)\" = '1 /A.txt'")
            }
            let idA = Self.xattr(a + "/A.txt", "itemid")
            let idB = Self.xattr(a + "/B.txt", "itemid")
            #expect(!idA.isEmpty && idA != idB)
            // All of A's bytes here (only such a file can take over another item's identity).
            #expect(try sh("cat \(q(a))/A.txt") == "edit on b, later")

            try sh("mv \(q(a))/A.txt \(q(a))/B.txt")
            for mp in [a, b] {
                try await eventually("A.txt renamed over B.txt on \(mp)", seconds: 30,
                                     "test ! -e \(q(mp))/A.txt && test \"$(cat \(q(mp))/B.txt)\" = 'edit on b, later'")
                // A's item lives on under B.txt, with its conflict version.
                try await eventually("A's item and its conflict under the new name on \(mp)", seconds: 30,
                                     "test \"$(getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(mp))/B.txt)\" = \(q(idA)) "
                                     + "&& test \"$(cat \(q(mp))/.nimbus/conflicts)\" = '1 /B.txt'")
                #expect(Self.xattr(mp + "/B.txt", "conflicts") == "1")
                let dir = mp + "/.nimbus/versions/B.txt"
                let entries = try sh("ls \(q(dir))").split(separator: "\n").map(String.init)
                let conflict = try #require(entries.first { $0.hasSuffix(" conflict.txt") }, "\(entries)")
                #expect(try sh("cat \(q(dir + "/" + conflict))") == "edit on a", "a's write is still reachable on \(mp)")
            }
        }
    }

    /// Two devices edit one file while paused; `.nimbus/versions/` shows the conflict version as
    /// an ordinary read-only file. Resolving by `cp ENTRY file && rm ENTRY` works like
    /// `nimbus resolve`.
    @Test func resolvingWithCpAndRmThroughNimbusVersions() async throws {
        try await SyncWorld.run("versions-dir") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("mkdir \(q(a))/notes && printf v1 > \(q(a))/notes/todo.md")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/notes/todo.md)\" = v1")
            try sh("\(q(Self.nimbus)) pause \(q(a)) && \(q(Self.nimbus)) pause \(q(b))")
            try sh("printf 'from a' > \(q(a))/notes/todo.md")
            usleep(1_100_000)
            try sh("printf 'from b, later' > \(q(b))/notes/todo.md")
            try sh("\(q(Self.nimbus)) resume \(q(a)) && \(q(Self.nimbus)) resume \(q(b))")
            try await eventually("the conflict on B", seconds: 30, "grep -q '^1 /notes/todo.md$' \(q(b))/.nimbus/conflicts")

            // The mirror: folders are folders, a file is a folder of its other versions.
            let dir = b + "/.nimbus/versions/notes/todo.md"
            #expect(try sh("ls \(q(b))/.nimbus/versions") == "notes\n")
            #expect(try sh("ls \(q(b))/.nimbus/versions/notes") == "todo.md\n")
            let entries = try sh("ls \(q(dir))").split(separator: "\n").map(String.init)
            let conflict = try #require(entries.first { $0.hasSuffix(" conflict.md") }, "\(entries)")
            let earlier = try #require(entries.first { !$0.contains("conflict") }, "\(entries)")
            #expect(conflict.hasPrefix("todo v") && conflict.contains(" a "), "\(conflict)")
            #expect(try sh("cat \(q(dir + "/" + conflict))") == "from a")
            #expect(try sh("cat \(q(dir + "/" + earlier))") == "v1")
            #expect(try sh("stat -c '%s %A' \(q(dir + "/" + conflict))") == "6 -r--r--r--\n")
            // Read-only: no writing into versions, no removing history.
            #expect(shStatus("printf x > \(q(dir + "/" + conflict))").0 != 0)
            let rmEarlier = shStatus("rm -f \(q(dir + "/" + earlier))")
            #expect(rmEarlier.0 != 0 && rmEarlier.1.contains("Operation not permitted"), "\(rmEarlier)")

            // Keep A's edit with plain tools.
            try sh("cp \(q(dir + "/" + conflict)) \(q(b))/notes/todo.md && rm \(q(dir + "/" + conflict))")
            for mp in [a, b] {
                try await eventually("A's edit current on \(mp)", "test \"$(cat \(q(mp))/notes/todo.md)\" = 'from a'")
                try await eventually("no conflict left on \(mp)", "test -z \"$(cat \(q(mp))/.nimbus/conflicts)\"")
            }
            #expect(!(try sh("ls \(q(dir))")).contains("conflict"))
            // Offline, a file's versions cannot be listed: EIO at once, not a hang.
            try sh("\(q(Self.nimbus)) pause \(q(a))")
            let offline = shStatus("ls \(q(a))/.nimbus/versions/notes/todo.md/")
            #expect(offline.0 != 0 && offline.1.contains("Input/output error"), "\(offline)")
        }
    }
}
