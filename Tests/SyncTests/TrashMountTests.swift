import Foundation
import Glibc
import NimbusTesting
import Testing

/// Recently Deleted with plain tools on real mounts (docs/trash.md): a tree removed on one
/// device is one entry on every device, and `nimbus trash restore` brings it back — same item
/// ids, history and conflict versions — under `NAME 2` when the name was taken meanwhile.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct TrashMountTests {
    static let nimbus = NimbusBinary.path

    static func itemID(_ path: String) -> String {
        shStatus("getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(path))").1
    }

    @Test func aRemovedTreeIsRestoredWithItsIDsHistoryAndConflictsUnderANewName() async throws {
        try await SyncWorld.run("trash") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("mkdir \(q(a))/dir && for i in 0 1 2 3 4 5 6 7 8 9; do printf \"file $i\" > \(q(a))/dir/f$i.txt; done")
            try await eventually("the tree on B", "test \"$(ls \(q(b))/dir | wc -l)\" = 10 && test \"$(cat \(q(b))/dir/f9.txt)\" = 'file 9'")
            // f0.txt gets an unresolved conflict version: both devices edit it offline.
            try sh("\(q(Self.nimbus)) pause \(q(a)) && \(q(Self.nimbus)) pause \(q(b))")
            try sh("printf 'edit on a' > \(q(a))/dir/f0.txt")
            usleep(1_100_000)
            try sh("printf 'edit on b, later' > \(q(b))/dir/f0.txt")
            try sh("\(q(Self.nimbus)) resume \(q(a)) && \(q(Self.nimbus)) resume \(q(b))")
            try await eventually("the conflict on A", seconds: 30,
                                 "test \"$(getfattr --absolute-names --only-values -n user.nimbus.conflicts \(q(a))/dir/f0.txt)\" = 1 && grep -q '^upload-queue: 0$' \(q(b))/.nimbus/status")
            var ids: [String: String] = [:]
            for i in 0..<10 { ids["f\(i).txt"] = Self.itemID("\(a)/dir/f\(i).txt") }
            let dirID = Self.itemID(a + "/dir")
            #expect(ids.values.allSatisfy { $0.count == 36 } && dirID.count == 36, "\(ids)")

            try sh("rm -r \(q(a))/dir")
            let removed = Date()
            try await eventually("the tree gone on B", "test ! -e \(q(b))/dir")
            try await eventually("one entry in Recently Deleted, seen from B", seconds: 5,
                                 "cd \(q(b)) && \(q(Self.nimbus)) trash list | grep -q '  /dir/$'")
            print("trash figures: the removal on A was listed on B after \(Date().timeIntervalSince(removed)) s")
            // With plain tools: .nimbus/trash/ shows it where it was, the deletion time in its name.
            try await eventually("dir in B's .nimbus/trash/", seconds: 2, "ls \(q(b))/.nimbus/trash/ | grep -qE '^dir [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}-[0-9]{2}-[0-9]{2}Z$'")
            let entryName = try sh("ls \(q(b))/.nimbus/trash/").trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(try sh("ls \(q(b))/.nimbus/trash/\(q(entryName)) | wc -l").trimmingCharacters(in: .whitespaces) == "10\n")
            #expect(try sh("cat \(q(b))/.nimbus/trash/\(q(entryName))/f9.txt") == "file 9", "cat streams a deleted file from the server")
            let copy = shStatus("cp -r \(q(b))/.nimbus/trash/\(q(entryName)) \(q(w.base))/copied && cat \(q(w.base))/copied/f3.txt")
            #expect(copy.0 == 0 && copy.1 == "file 3", "cp -r copies a deleted tree out: \(copy)")
            let entryPath = "\(b)/.nimbus/trash/\(entryName)"
            #expect(Self.itemID(entryPath) == dirID)
            #expect(shStatus("getfattr --absolute-names --only-values -n user.nimbus.trash.deleted-by \(q(entryPath))").1 == "a")
            let deletedAt = shStatus("getfattr --absolute-names --only-values -n user.nimbus.trash.deleted \(q(entryPath))").1
            let expires = shStatus("getfattr --absolute-names --only-values -n user.nimbus.trash.expires \(q(entryPath))").1
            #expect(deletedAt.hasSuffix("Z") && expires > deletedAt && expires.hasPrefix("20"), "kept 30 days: \(deletedAt) → \(expires)")
            #expect(Self.itemID("\(entryPath)/f3.txt") == ids["f3.txt"])
            let write = shStatus("echo x > \(q(b))/.nimbus/trash/\(q(entryName))/f9.txt")
            #expect(write.0 != 0, "read-only")
            let listed = try sh("cd \(q(b)) && \(q(Self.nimbus)) trash list --json")
            let entries = listed.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            #expect(entries.count == 1, "\(listed)")
            #expect(entries.first?["path"] as? String == "/dir" && entries.first?["items"] as? Int == 11 && entries.first?["deletedBy"] as? String == "a",
                    "\(listed)")
            #expect(entries.first?["id"] as? String == dirID)
            // .nimbus/status counts it, bytes apart.
            let bytes = entries.first?["bytes"] as? Int ?? -1
            #expect(bytes > 60)
            try await eventually("Recently Deleted in B's status", seconds: 2,
                                 "grep -qx 'recently-deleted: 1' \(q(b))/.nimbus/status && grep -qx 'recently-deleted-bytes: \(bytes)' \(q(b))/.nimbus/status")

            // B made a new dir meanwhile: the restore goes to "dir 2" and keeps both.
            try sh("mkdir \(q(b))/dir && printf new > \(q(b))/dir/new.txt")
            let out = try sh("cd \(q(b)) && \(q(Self.nimbus)) trash restore dir")
            #expect(out.contains("as /dir 2") && out.contains("11 items"), "\(out)")
            for mp in [a, b] {
                try await eventually("dir 2 on \(mp)", seconds: 10,
                                     "test \"$(ls \(q(mp))/'dir 2' | wc -l)\" = 10 && test \"$(cat \(q(mp))/'dir 2'/f9.txt)\" = 'file 9'")
            }
            #expect(try sh("cat \(q(b))/dir/new.txt") == "new", "the new dir is untouched")
            #expect(Self.itemID(b + "/dir 2") == dirID)
            for (name, id) in ids { #expect(Self.itemID("\(b)/dir 2/\(name)") == id, "\(name) keeps its id") }
            let versions = try sh("\(q(Self.nimbus)) versions \(q(b))/'dir 2'/f0.txt")
            #expect(versions.contains("conflict!") && versions.contains("current"), "the conflict version is still there: \(versions)")
            try await eventually("the conflict shows on A", "test \"$(getfattr --absolute-names --only-values -n user.nimbus.conflicts \(q(a))/'dir 2'/f0.txt)\" = 1")
            #expect(try sh("cd \(q(a)) && \(q(Self.nimbus)) trash list") == "Recently Deleted is empty\n")
            try await eventually("the restore in A's status", seconds: 2, "grep -qx 'recently-deleted: 0' \(q(a))/.nimbus/status")
            // .nimbus/events says what happened: the delete on A, the restore from B.
            let events = try sh("cat \(q(a))/.nimbus/events")
            #expect(events.contains(" deleted local /dir\n") && events.contains(" restored remote /dir 2 v")
                    && events.contains(" restored remote /dir 2/f9.txt v"), "\(events.suffix(2000))")

            // A purge is for good; naming something not there is a clear error.
            try sh("rm \(q(a))/'dir 2'/f5.txt")
            try await eventually("f5 listed", "cd \(q(b)) && \(q(Self.nimbus)) trash list | grep -q '/dir 2/f5.txt'")
            let purged = try sh("cd \(q(b)) && \(q(Self.nimbus)) trash purge 'dir 2/f5.txt'")
            #expect(purged.contains("purged /dir 2/f5.txt: 1 entry, 1 item"), "\(purged)")
            // A purge leaves no journal entry: a status read asks again when its figure is 10 s old.
            try await eventually("the purge in A's status", seconds: 15,
                                 "grep -qx 'recently-deleted: 0' \(q(a))/.nimbus/status && grep -qx 'recently-deleted-bytes: 0' \(q(a))/.nimbus/status")
            let missing = shStatus("cd \(q(b)) && \(q(Self.nimbus)) trash restore 'dir 2/f5.txt'")
            #expect(missing.0 == 2 && missing.1.contains("nothing in Recently Deleted was at /dir 2/f5.txt"), "\(missing)")
            // rm in .nimbus/trash/ purges too.
            try sh("rm \(q(a))/'dir 2'/f6.txt")
            try await eventually("f6 in the tree", "ls \(q(b))/.nimbus/trash/'dir 2'/ | grep -q '^f6 .*Z.txt$'")
            try sh("rm \(q(b))/.nimbus/trash/'dir 2'/f6\\ *.txt")
            #expect(try sh("cd \(q(b)) && \(q(Self.nimbus)) trash list") == "Recently Deleted is empty\n")
            _ = try await w.admin("check", [])
        }
    }

    /// A tiny retention: the entry leaves the list by itself, `nimbus admin gc` frees its bytes,
    /// `nimbus admin quota` shows them gone, and the store stays consistent.
    @Test func anExpiredEntryIsPurgedAndItsBytesFreed() async throws {
        // 0.00005 days: 4.3 s (the server looks every second).
        try await SyncWorld.run("trash-expiry", serve: ["--keep-deleted-days", "0.00005", "--gc-interval", "0"]) { w in
            let a = try await w.mount("a")
            func used() async throws -> (Int, String) {
                let line = try await w.admin("quota", ["--account", "alice"])
                return (line.split(separator: "\t").first { $0.hasPrefix("used ") }.flatMap { Int($0.dropFirst(5).split(separator: " ")[0]) } ?? -1, line)
            }
            try sh("head -c 300000 /dev/urandom > \(q(a))/big.bin")
            try await eventually("uploaded", seconds: 30,
                                 "grep -q '^upload-queue: 0$' \(q(a))/.nimbus/status && test \"$(getfattr --absolute-names --only-values -n user.nimbus.status \(q(a))/big.bin)\" = current")
            let (before, _) = try await used()
            try sh("rm \(q(a))/big.bin")
            try await eventually("listed", "cd \(q(a)) && \(q(Self.nimbus)) trash list | grep -q '/big.bin$'")
            let (listed, line) = try await used()
            #expect(line.contains("trash 300000"), "Recently Deleted's bytes shown apart: \(line)")
            #expect(listed >= before, "a deleted file still counts until purged")
            try await eventually("expired", seconds: 20, "cd \(q(a)) && test \"$(\(q(Self.nimbus)) trash list)\" = 'Recently Deleted is empty'")
            let gc = try await w.admin("gc", ["--grace", "0"])
            #expect(gc.contains("freed") && !gc.contains("freed 0 chunk"), "\(gc)")
            let (after, afterLine) = try await used()
            #expect(before - after >= 300_000 - 4_096 && afterLine.contains("trash 0 "), "the bytes are freed: \(before) → \(after): \(afterLine)")
            _ = try await w.admin("check", [])
        }
    }

    /// Three devices race on one entry: A restores it, B restores it too and purges it, while C,
    /// offline with an edit inside it, comes back. Whatever order the server takes them in, the
    /// devices end with one tree and C's edit is in it.
    @Test func aRestoreRacingAnEditASecondRestoreAndAPurgeEndsOneWayAndLosesNothing() async throws {
        try await SyncWorld.run("trash-race") { w in
            let a = try await w.mount("a"), b = try await w.mount("b"), c = try await w.mount("c")
            try sh("mkdir \(q(a))/dir && printf v1 > \(q(a))/dir/f.txt && printf other > \(q(a))/dir/g.txt")
            for mp in [b, c] { try await eventually("the tree on \(mp)", "test \"$(cat \(q(mp))/dir/f.txt)\" = v1 && test -f \(q(mp))/dir/g.txt") }
            try sh("\(q(Self.nimbus)) pause \(q(c))")
            try sh("rm -r \(q(a))/dir")
            try await eventually("the entry, seen from B", "cd \(q(b)) && \(q(Self.nimbus)) trash list | grep -q '/dir/$'")
            try sh("printf 'edit on c' > \(q(c))/dir/f.txt")
            // All at once.
            let race = "( cd \(q(a)) && \(q(Self.nimbus)) trash restore dir ) > \(q(w.base))/ra 2>&1 & "
                + "( cd \(q(b)) && \(q(Self.nimbus)) trash restore dir ) > \(q(w.base))/rb 2>&1 & "
                + "( cd \(q(b)) && \(q(Self.nimbus)) trash purge dir ) > \(q(w.base))/pb 2>&1 & "
                + "\(q(Self.nimbus)) resume \(q(c)) & wait"
            _ = shStatus(race)
            let outcomes = ["ra", "rb", "pb"].map { (try? String(contentsOfFile: w.base + "/" + $0, encoding: .utf8)) ?? "" }
            print("trash race: \(outcomes.map { $0.trimmingCharacters(in: .whitespacesAndNewlines) })")
            // Each either did it or said clearly why not.
            for o in outcomes { #expect(o.contains("restored") || o.contains("purged") || o.contains("nothing in Recently Deleted"), "\(o)") }
            let snapshot = "cd %@ && find . -path ./.nimbus -prune -o -type f -print0 | sort -z | xargs -0 -r sh -c 'for f; do printf \"%%s=%%s\\n\" \"$f\" \"$(cat \"$f\")\"; done' _"
            func tree(_ mp: String) -> String { shStatus(String(format: snapshot, q(mp))).1 }
            try await eventually("C's edit is up", seconds: 30, "grep -q '^upload-queue: 0$' \(q(c))/.nimbus/status")
            let deadline = Date().addingTimeInterval(30)
            while Date() < deadline, !(tree(a) == tree(b) && tree(b) == tree(c) && tree(a).contains("edit on c")) {
                try await Task.sleep(for: .milliseconds(200))
            }
            let (ta, tb, tc) = (tree(a), tree(b), tree(c))
            #expect(ta == tb && tb == tc, "one outcome everywhere:\na: \(ta)\nb: \(tb)\nc: \(tc)")
            #expect(ta.contains("=edit on c"), "C's edit survives: \(ta)")
            _ = try await w.admin("check", [])
        }
    }
}
