import Foundation
import Glibc
import NimbusTesting
import Testing

/// Programs' locks are claims the sync engine respects (docs/coordination.md): a file a program
/// holds exclusively is not uploaded, and a file any program holds is not replaced by a remote
/// version, until the lock goes — and then the right content syncs, nothing lost.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct ClaimSyncTests {
    /// Holds `flock -x` on FILE for SECONDS through one descriptor; with WRITE, writes TEXT through
    /// a second descriptor (closed at once) while holding, like a program saving under its lock.
    static let holder = #"""
    import fcntl, os, sys, time
    path, seconds, marker = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    text = sys.argv[4] if len(sys.argv) > 4 else None
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if text is not None:
        w = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.write(w, text.encode()); os.close(w)
    open(marker, "w").close()
    time.sleep(seconds)
    os.close(fd)
    """#

    func status(_ path: String) -> String {
        let (_, out) = shStatus("python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], \"user.nimbus.status\").decode())' \(q(path))")
        return out.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test func aRemoteChangeWaitsForAProgramsLockAndIsNotLost() async throws {
        try await SyncWorld.run("lock-remote") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try Self.holder.write(toFile: w.base + "/holder.py", atomically: true, encoding: .utf8)
            try sh("printf v1 > \(q(a))/f.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/f.txt)\" = v1")

            let hold = try Background("python3 \(q(w.base))/holder.py \(q(b))/f.txt 3 \(q(w.base))/locked")
            defer { hold.stop() }
            try await eventually("B's program holds the lock", "test -e \(q(w.base))/locked")
            try sh("printf 'v2 from a' > \(q(a))/f.txt")
            // The new version reaches B's engine but waits: B still reads v1, status `downloaded`.
            try await eventually("B knows a newer version", "test \"$(python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], \"user.nimbus.status\").decode())' \(q(b))/f.txt)\" = downloaded")
            #expect(try sh("cat \(q(b))/f.txt") == "v1")
            let claims = try sh("cat \(q(b))/.nimbus/claims")
            #expect(claims.contains("flock") && claims.contains("/f.txt"), "\(claims)")
            hold.wait()
            try await eventually("v2 on B after the unlock", "test \"$(cat \(q(b))/f.txt)\" = 'v2 from a'")
            #expect(status(b + "/f.txt") != "downloaded")
        }
    }

    @Test func noUploadWhileAProgramHoldsTheFileExclusively() async throws {
        try await SyncWorld.run("lock-upload") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try Self.holder.write(toFile: w.base + "/holder.py", atomically: true, encoding: .utf8)
            try sh("printf v1 > \(q(a))/doc.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/doc.txt)\" = v1")
            let inBefore = try w.chunkBytesIn()

            // A's program saves under its exclusive lock and keeps holding it for 2.5 s.
            let hold = try Background("python3 \(q(w.base))/holder.py \(q(a))/doc.txt 2.5 \(q(w.base))/saved 'saved under lock'")
            defer { hold.stop() }
            try await eventually("A's program saved", "test -e \(q(w.base))/saved")
            try await Task.sleep(for: .milliseconds(1500))
            #expect(try sh("cat \(q(b))/doc.txt") == "v1", "B got A's file while A's program still held it")
            #expect(try w.chunkBytesIn() == inBefore, "content was uploaded during the lock")
            hold.wait()
            try await eventually("the saved content on B after the unlock", "test \"$(cat \(q(b))/doc.txt)\" = 'saved under lock'")
        }
    }
}
