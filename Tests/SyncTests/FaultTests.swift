import Foundation
import Glibc
import NimbusTesting
import Testing

/// Faults a program cannot see coming: a token revoked mid-use, a server that refuses one item.
/// Nothing a program was told is saved is dropped, and status says what is wrong
/// (docs/sync.md "Errors and status").
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct FaultTests {
    func xattr(_ path: String, _ name: String) -> String {
        (try? sh("getfattr --only-values -n user.nimbus.\(name) \(q(path)) 2>/dev/null")) ?? ""
    }

    @Test func aRevokedTokenKeepsEveryChangeQueuedAndANewTokenUploadsIt() async throws {
        try await SyncWorld.run("revoked") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf v1 > \(q(a))/notes.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/notes.txt)\" = v1")
            _ = try await w.admin("revoke-device", ["--account", "alice", "--device", "a"])
            usleep(1_200_000)  // every instance refuses the token within a second
            try sh("printf 'edit after the revoke' > \(q(a))/notes.txt && printf new > \(q(a))/new.txt && mkdir \(q(a))/folder && printf deep > \(q(a))/folder/deep.txt")
            try await eventually("A says it is unauthorized", seconds: 40, "grep -q '^connection: unauthorized' \(q(a))/.nimbus/status")
            #expect(xattr(a + "/new.txt", "status") == "error")
            #expect(xattr(a + "/new.txt", "error").contains("token"), "\(xattr(a + "/new.txt", "error"))")
            let status = try sh("cat \(q(a))/.nimbus/status")
            #expect(!status.contains("upload-queue: 0"), "the changes are still queued: \(status)")
            // The token never shows, in the status or the log.
            let token = try String(contentsOfFile: w.base + "/a.token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(!status.contains(token))
            #expect(!(try sh("cat \(q(w.base))/a-state/mount.log")).contains(token))
            // B never got the edits.
            #expect(try sh("cat \(q(b))/notes.txt") == "v1")
            #expect(!FileManager.default.fileExists(atPath: b + "/new.txt"))
            // A new token and a remount: everything goes up, nothing was lost.
            try sh("\(q(NimbusBinary.path)) unmount \(q(a))")
            try await w.newToken("a")
            try w.remount("a")
            try await eventually("the edit on B", seconds: 40, "test \"$(cat \(q(b))/notes.txt)\" = 'edit after the revoke'")
            try await eventually("the new files on B", seconds: 40, "test \"$(cat \(q(b))/new.txt)\" = new && test \"$(cat \(q(b))/folder/deep.txt)\" = deep")
            try await eventually("A online, nothing queued", seconds: 40, "grep -q '^connection: online' \(q(a))/.nimbus/status && grep -q '^upload-queue: 0' \(q(a))/.nimbus/status")
            #expect(xattr(a + "/new.txt", "status") == "current")
            let error = try sh("sed -n 's/^sync-error: //p' \(q(a))/.nimbus/status").trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(error == "none", "the error is over: \(error)")
        }
    }

    @Test func aTokenFileWithASecondLineUsesTheFirstAndAFileWithoutATokenIsRefused() async throws {
        try await SyncWorld.run("tokenfile") { w in
            let a = try await w.mount("a")
            try sh("printf one > \(q(a))/one.txt")
            try await eventually("uploaded", "grep -q '^upload-queue: 0' \(q(a))/.nimbus/status && grep -q '^connection: online' \(q(a))/.nimbus/status")
            try sh("\(q(NimbusBinary.path)) unmount \(q(a))")
            let token = try String(contentsOfFile: w.base + "/a.token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            try "\(token)\nsecond line: a comment\n".write(toFile: w.base + "/a.token", atomically: true, encoding: .utf8)
            try w.remount("a")
            try await eventually("online with the first line", "grep -q '^connection: online' \(q(a))/.nimbus/status")
            try sh("\(q(NimbusBinary.path)) unmount \(q(a))")
            // A first line that is not a token: refused before mounting, exit 2, the text not shown.
            try "\(token) and more words\n".write(toFile: w.base + "/a.token", atomically: true, encoding: .utf8)
            let (rc, out) = shStatus("\(q(NimbusBinary.path)) mount \(q(a)) --state \(q(w.base + "/a-state")) --server \(w.server.url) --container docs --token-file \(q(w.base + "/a.token")) 2>&1")
            #expect(rc == 2, "\(out)")
            #expect(out.contains("not a device token") && !out.contains(token), "\(out)")
            // A well-formed token the server does not know: the mount is refused with exit 2.
            try "nim_not-a-known-token\n".write(toFile: w.base + "/a.token", atomically: true, encoding: .utf8)
            let (rc2, out2) = shStatus("\(q(NimbusBinary.path)) mount \(q(a)) --state \(q(w.base + "/a-state")) --server \(w.server.url) --container docs --token-file \(q(w.base + "/a.token")) 2>&1")
            #expect(rc2 == 2, "\(out2)")
            #expect(!out2.contains("nim_not-a-known-token"), "\(out2)")
        }
    }
}
