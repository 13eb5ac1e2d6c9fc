import Foundation
import Glibc
import NimbusTesting
import Testing

/// Another local user (`nobody`, through setpriv) on a mount run by root with allow_other
/// (docs/security.md "Another local user"): it cannot crash the daemon, read what the modes
/// forbid (also through `.nimbus/`), read the state, or hold the owner's sync back; set-id bits
/// never arrive from the server; names are bytes.
@Suite(.serialized, .enabled(if: SyncEnv.usable && getuid() == 0, "needs FUSE and root (to be another user)"))
struct LocalUserMountTests {
    /// Runs `script` as nobody (uid/gid 65534, no supplementary groups) in `dir`.
    func asNobody(_ dir: String, _ script: String) -> (Int32, String) {
        shStatus("cd \(q(dir)) && setpriv --reuid=65534 --regid=65534 --clear-groups sh -c \(q(script)) 2>&1")
    }

    @Test func anotherLocalUserCanNeitherCrashNorReadNorStallTheMount() async throws {
        try await SyncWorld.run("localuser") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("chmod 755 \(q(w.base))")  // nobody may reach the mountpoints (not the state dirs)
            try sh("cd \(q(a)) && mkdir -m 777 pub && printf v1 > secret.txt && chmod 600 secret.txt && mkdir -m 700 private && printf v1 > private/doc.txt && printf v1 > open.txt")
            try await eventually("the tree on B", "test \"$(cat \(q(b))/private/doc.txt)\" = v1 && test -f \(q(b))/secret.txt && test -f \(q(b))/open.txt")
            try sh("cd \(q(a)) && printf v2 > secret.txt && printf v2 > private/doc.txt && printf v2 > open.txt")
            try await eventually("v2 on B", "test \"$(cat \(q(b))/private/doc.txt)\" = v2 && test \"$(cat \(q(b))/secret.txt)\" = v2 && test \"$(cat \(q(b))/open.txt)\" = v2")

            // Times no Int64 of nanoseconds holds: clamped, the daemon lives, the file syncs.
            let (ts, tout) = asNobody(a, "touch pub/late pub/early && touch -d @10000000000 pub/late && touch -d 1600-01-01 pub/early")
            #expect(ts == 0, "\(tout)")
            #expect(try sh("stat -c %Y \(q(a))/pub/late").trimmingCharacters(in: .whitespacesAndNewlines) == "9223285636")
            try await eventually("the clamped files on B", "test -f \(q(b))/pub/late && test -f \(q(b))/pub/early && test \"$(stat -c %Y \(q(b))/pub/late)\" = 9223285636")

            // Earlier versions: as the item allows, and only through folders nobody may enter.
            let owners = try sh("ls \(q(a))/.nimbus/versions/secret.txt/ \(q(a))/.nimbus/versions/private/doc.txt/ \(q(a))/.nimbus/versions/open.txt/")
            #expect(owners.contains(" v"), "root lists the versions: \(owners)")
            let secretEntry = try sh("ls \(q(a))/.nimbus/versions/secret.txt/ | head -1").trimmingCharacters(in: .whitespacesAndNewlines)
            let docEntry = try sh("ls \(q(a))/.nimbus/versions/private/doc.txt/ | head -1").trimmingCharacters(in: .whitespacesAndNewlines)
            let openEntry = try sh("ls \(q(a))/.nimbus/versions/open.txt/ | head -1").trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(try sh("cat \(q(a + "/.nimbus/versions/secret.txt/" + secretEntry))") == "v1")
            for forbidden in ["ls .nimbus/versions/secret.txt/", "cat \(q(".nimbus/versions/secret.txt/" + secretEntry))",
                              "ls .nimbus/versions/private/", "cat \(q(".nimbus/versions/private/doc.txt/" + docEntry))",
                              "cat private/doc.txt", "cat secret.txt"] {
                let (s, out) = asNobody(a, forbidden)
                #expect(s != 0 && out.contains("ermission denied"), "nobody: \(forbidden) → \(s) \(out)")
            }
            let (os, oout) = asNobody(a, "cat \(q(".nimbus/versions/open.txt/" + openEntry))")
            #expect(os == 0 && oout == "v1", "a 0644 file's versions are readable: \(os) \(oout)")

            // The control files name only what nobody could reach in the tree.
            let (es, events) = asNobody(a, "cat .nimbus/events")
            #expect(es == 0 && events.contains("/open.txt") && events.contains("/private\n") && !events.contains("doc.txt"), "\(events)")
            #expect(try sh("cat \(q(a))/.nimbus/events").contains("/private/doc.txt"), "root sees all")
            try sh("(flock -s \(q(a))/private/doc.txt sleep 3 >/dev/null 2>&1 &) ; sleep 0.5")
            let (_, claims) = asNobody(a, "cat .nimbus/claims")
            #expect(!claims.contains("doc.txt"), "\(claims)")
            #expect(try sh("cat \(q(a))/.nimbus/claims").contains("/private/doc.txt"))

            // The state and the server's data are private.
            for (path, mode) in [(w.base + "/a-state", "700"), (w.base + "/a-state/state.sqlite", "600"), (w.base + "/a-state/mount.log", "600"),
                                 (w.base + "/a-state/cache", "700"), (w.base + "/server", "700"), (w.base + "/server/metadata.sqlite", "600")] {
                #expect(try sh("stat -c %a \(q(path))").trimmingCharacters(in: .whitespacesAndNewlines) == mode, "\(path)")
            }
            let wal = try sh("stat -c %a \(q(w.base))/a-state/state.sqlite-wal 2>/dev/null || echo 600").trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(wal == "600")

            // nobody may read open.txt, so may lock it, but that lock never holds root's upload back.
            // (Its pid is kept so that the lock goes before the world is cleaned up, also on failure.)
            let pidFile = w.base + "/nobody-flock.pid"
            _ = shStatus("cd \(q(a)) && { setpriv --reuid=65534 --regid=65534 --clear-groups flock -x open.txt sleep 20 >/dev/null 2>&1 & echo $! > \(q(pidFile)); }")
            defer { _ = shStatus("p=$(cat \(q(pidFile))); pkill -P $p; kill $p; true") }
            try await eventually("nobody holds the lock", "grep -q 'cannot write' \(q(a))/.nimbus/claims")
            try sh("printf v3 > \(q(a))/open.txt")
            try await eventually("root's edit reaches B while nobody holds an exclusive lock", seconds: 20, "test \"$(cat \(q(b))/open.txt)\" = v3")

            // Set-id bits stay on the device that set them.
            try sh("printf '#!/bin/sh\\necho hi\\n' > \(q(a))/tool && chmod 6755 \(q(a))/tool")
            try await eventually("the tool on B without set-id bits", "test -f \(q(b))/tool && test \"$(stat -c %a \(q(b))/tool)\" = 755")

            // NFC and NFD spellings: two files on every device.
            let nfc = "caf\u{E9}.txt", nfd = "cafe\u{301}.txt"
            try sh("printf nfc > \(q(a + "/" + nfc)) && printf nfd > \(q(a + "/" + nfd))")
            #expect(try sh("ls \(q(a)) | grep -c caf").trimmingCharacters(in: .whitespacesAndNewlines) == "2")
            try await eventually("both spellings on B", "test \"$(cat \(q(b + "/" + nfc)))\" = nfc && test \"$(cat \(q(b + "/" + nfd)))\" = nfd")
            #expect(try sh("stat -c %a \(q(a))/pub").trimmingCharacters(in: .whitespacesAndNewlines) == "777", "the daemon is alive")
        }
    }

    /// The mount clears set-ID bits itself (it asks the kernel for FUSE_HANDLE_KILLPRIV_V2, so
    /// the kernel no longer asks for `security.capability` before every write): as on ext4, a
    /// write, truncate or O_TRUNC by another user clears set-user-ID and a group-executable
    /// file's set-group-ID, root's keep them, a chown of a file clears them and of a folder does
    /// not; a stat right after shows it (the kernel's cached mode is dropped before the answer).
    @Test func setIDBitsGoOnWriteTruncateAndChownAsOnLinux() async throws {
        try await SyncWorld.run("setid") { w in
            let a = try await w.mount("a")
            try sh("chmod 755 \(q(w.base)) && chmod 777 \(q(a))")
            func mode(_ name: String) throws -> String {
                try sh("stat -c %a \(q(a + "/" + name))").trimmingCharacters(in: .whitespacesAndNewlines)
            }
            try sh("cd \(q(a)) && printf x > f && chmod 6777 f && printf y >> f")
            #expect(try mode("f") == "6777", "root's write keeps the bits")
            #expect(asNobody(a, "printf z >> f").0 == 0)
            #expect(try mode("f") == "777", "another user's write clears them")
            try sh("chmod 6777 \(q(a))/f")
            #expect(asNobody(a, "truncate -s 1 f").0 == 0)
            #expect(try mode("f") == "777", "another user's truncate clears them")
            try sh("chmod 6777 \(q(a))/f")
            #expect(asNobody(a, ": > f").0 == 0)
            #expect(try mode("f") == "777", "another user's open(O_TRUNC) clears them")
            try sh("chmod 6777 \(q(a))/f && : > \(q(a))/f")
            #expect(try mode("f") == "6777", "root's open(O_TRUNC) keeps them")
            try sh("chmod 2767 \(q(a))/f")
            #expect(asNobody(a, "printf z >> f").0 == 0)
            #expect(try mode("f") == "2767", "set-group-ID without group execute stays")
            try sh("cd \(q(a)) && chmod 6755 f && chown 65534 f && mkdir d && chmod 6755 d && chown 65534 d")
            #expect(try mode("f") == "755", "a chown of a file clears them")
            #expect(try mode("d") == "6755", "a chown of a folder keeps them")
            try sh("sync && echo 3 > /proc/sys/vm/drop_caches")
            #expect(try mode("f") == "755", "kept in the mount's own state")

            // The kernel asks no `security.capability` per write: 200 writes to one file cost
            // at most one getxattr (the file's first write).
            func getxattrs() throws -> Int {
                Int(try sh("awk '$1 == \"getxattr\" { print $2 }' \(q(a))/.nimbus/requests").trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
            }
            let before = try getxattrs()
            try sh("dd if=/dev/zero of=\(q(a))/big bs=4k count=200 status=none")
            let after = try getxattrs()
            #expect(after - before <= 1, "getxattr requests for 200 writes: \(after - before)")
        }
    }
}
