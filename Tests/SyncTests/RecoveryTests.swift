import Foundation
import Glibc
import NimbusTesting
import Testing

/// Offline edits, conflicts and the upload queue across a crash (docs/sync.md).
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct RecoveryTests {
    @Test(arguments: SyncBackend.all) func editsOnBothDevicesWhileOfflineKeepBothOnTheServer(_ backend: SyncBackend) async throws {
        try await SyncWorld.run("conflict", backend) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf v1 > \(q(a))/doc.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/doc.txt)\" = v1")
            w.stopServer()
            try sh("printf 'from a' > \(q(a))/doc.txt")
            usleep(1_100_000)  // B's edit is later: it wins (later modified)
            try sh("printf 'from b, later' > \(q(b))/doc.txt")
            // Neither device lost its own edit while offline.
            #expect(try sh("cat \(q(a))/doc.txt") == "from a")
            #expect(try sh("cat \(q(b))/doc.txt") == "from b, later")
            try await w.restartServer()
            try await eventually("B's edit current on A", seconds: 60, "test \"$(cat \(q(a))/doc.txt)\" = 'from b, later'")
            try await eventually("B keeps its edit", "test \"$(cat \(q(b))/doc.txt)\" = 'from b, later'")
            // A's edit is kept on the server as a conflict version of the same item.
            let id = try sh("python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], \"user.nimbus.itemid\").decode())' \(q(a))/doc.txt")
                .trimmingCharacters(in: .whitespacesAndNewlines)
            let token = try String(contentsOfFile: w.base + "/a.token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            try await eventually("one conflict version on the server",
                                 "curl -s -H 'Authorization: Bearer \(token)' \(w.server.url)/v1/containers/docs/items/\(id) | grep -q '\"conflicts\":1'")
        }
    }

    @Test(arguments: SyncBackend.all) func aRemoteEditNeverReplacesAFileBeingWrittenHere(_ backend: SyncBackend) async throws {
        try await SyncWorld.run("writing", backend) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf v1 > \(q(a))/f.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/f.txt)\" = v1")
            // A keeps the file open with unsaved (not yet closed) writes while B's edit arrives.
            let writer = Process()
            // (Not a shell: `printf >&3` dups and closes the descriptor, which is a close to FUSE.)
            writer.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            let marker = w.base + "/written"
            // It holds the file until told (a fixed sleep was too short on a loaded machine).
            let release = w.base + "/release"
            writer.arguments = ["python3", "-c", "import os,sys,time\nfd=os.open(sys.argv[1], os.O_RDWR); os.write(fd, b'local'); open(sys.argv[2], 'w').close()\nfor _ in range(300):\n    if os.path.exists(sys.argv[3]): break\n    time.sleep(0.1)\nos.close(fd)",
                                a + "/f.txt", marker, release]
            try writer.run()
            defer { if writer.isRunning { writer.terminate() } }
            try await eventually("A's writer has written", "test -e \(q(marker))")
            try sh("printf remote > \(q(b))/f.txt")
            // A has received B's version (its journal cursor caught up with B's after B's upload)
            // and has not applied it.
            let cursor = { (mp: String) in "$(sed -n 's/^cursor: //p' \(q(mp))/.nimbus/status)" }
            try await eventually("B uploaded", seconds: 30, "grep -q '^upload-queue: 0' \(q(b))/.nimbus/status && test \(cursor(b)) -ge 2")
            try await eventually("A received B's version", seconds: 30, "test \(cursor(a)) -ge \(cursor(b))")
            let seen = try sh("cat \(q(a))/f.txt")
            #expect(seen == "local", "A's open file was replaced by B's edit: \(seen) \((try? sh("cat \(q(w.base))/a-state/mount.log")) ?? "")")
            FileManager.default.createFile(atPath: release, contents: nil)
            writer.waitUntilExit()
            // After A's close both devices agree, and the other content is a conflict version.
            try await eventually("devices agree", seconds: 30, "test \"$(cat \(q(a))/f.txt)\" = \"$(cat \(q(b))/f.txt)\"")
            let id = try sh("python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], \"user.nimbus.itemid\").decode())' \(q(a))/f.txt")
                .trimmingCharacters(in: .whitespacesAndNewlines)
            let token = try String(contentsOfFile: w.base + "/a.token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            try await eventually("one conflict version on the server",
                                 "curl -s -H 'Authorization: Bearer \(token)' \(w.server.url)/v1/containers/docs/items/\(id) | grep -q '\"conflicts\":1'")
        }
    }

    @Test(arguments: SyncBackend.all) func aFolderDeletedElsewhereKeepsWorkNotYetUploadedHere(_ backend: SyncBackend) async throws {
        try await SyncWorld.run("folder", backend) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("mkdir \(q(a))/t && printf old > \(q(a))/t/old.txt")
            try await eventually("t on B", "test \"$(cat \(q(b))/t/old.txt)\" = old")
            w.stopServer()
            try sh("printf new > \(q(b))/t/new.txt")
            try sh("rm -r \(q(a))/t")
            try await w.restartServer()
            // Whichever device reaches the server first, the new file and its folder survive on both.
            try await eventually("B's new file on A", seconds: 60, "test \"$(cat \(q(a))/t/new.txt)\" = new")
            try await eventually("B keeps its new file", "test \"$(cat \(q(b))/t/new.txt)\" = new")
        }
    }

    @Test(arguments: SyncBackend.all) func theUploadQueueSurvivesKill9(_ backend: SyncBackend) async throws {
        try await SyncWorld.run("queue", backend) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            w.stopServer()
            try sh("mkdir \(q(a))/offline && printf queued > \(q(a))/offline/q.txt && sync")
            try await eventually("queued on A", "grep -q 'upload-queue: [1-9]' \(q(a))/.nimbus/status")
            try w.crash(a)
            try await w.restartServer()
            try w.remount("a")
            try await eventually("A's queued upload on B", seconds: 60, "test \"$(cat \(q(b))/offline/q.txt)\" = queued")
            try await eventually("A's queue drained", "grep -q 'upload-queue: 0' \(q(a))/.nimbus/status")
        }
    }

    /// kill -9 right after a big file was written and fsynced: after the remount it reaches B
    /// intact, and every version the server ever got of it is the whole file (never a prefix).
    @Test func aBigFileFsyncedJustBeforeKill9ReachesBIntact() async throws {
        try await SyncWorld.run("kill9big") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            let size = 32 << 20
            try sh("head -c \(size) /dev/urandom > \(q(w.base))/src.bin")
            try sh("dd if=\(q(w.base))/src.bin of=\(q(a))/big.bin bs=1M conv=fsync status=none")
            try w.crash(a)
            try w.remount("a")
            try await eventually("the file on B", seconds: 60, "cmp \(q(w.base))/src.bin \(q(b))/big.bin")
            let id = try sh("getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(a))/big.bin")
            let json = try sh("curl -s --max-time 5 -H \"Authorization: Bearer $(cat \(q(w.base))/a.token)\" \(w.server.url)/v1/containers/docs/items/\(id)/versions")
            let obj = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any]
            let versions = obj?["versions"] as? [[String: Any]] ?? []
            #expect(!versions.isEmpty, "\(json.prefix(300))")
            for v in versions {
                let st = v["state"] as? [String: Any]
                let chunks = st?["chunks"] as? [[String: Any]] ?? []
                let total = chunks.reduce(0) { $0 + (($1["size"] as? Int) ?? 0) }
                #expect(total == size, "version \(v["version"] ?? "?") holds \(total) bytes, not the whole file")
            }
        }
    }
}
