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
    # Held until told (MARKER.release) or for at most SECONDS: a loaded machine cannot make the
    # checks run after the lock went.
    deadline = time.time() + seconds
    while time.time() < deadline and not os.path.exists(marker + ".release"):
        time.sleep(0.02)
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

            let hold = try Background("python3 \(q(w.base))/holder.py \(q(b))/f.txt 60 \(q(w.base))/locked")
            defer { hold.stop() }
            try await eventually("B's program holds the lock", "test -e \(q(w.base))/locked")
            try sh("printf 'v2 from a' > \(q(a))/f.txt")
            // The new version reaches B's engine but waits: B still reads v1, status `downloaded`.
            try await eventually("B knows a newer version", "test \"$(python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], \"user.nimbus.status\").decode())' \(q(b))/f.txt)\" = downloaded")
            #expect(try sh("cat \(q(b))/f.txt") == "v1")
            let claims = try sh("cat \(q(b))/.nimbus/claims")
            #expect(claims.contains("flock") && claims.contains("/f.txt"), "\(claims)")
            FileManager.default.createFile(atPath: w.base + "/locked.release", contents: nil)
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

            // A's program saves under its exclusive lock and keeps holding it for 6 s (long
            // enough that the checks below run while it holds, even on a loaded machine).
            let hold = try Background("python3 \(q(w.base))/holder.py \(q(a))/doc.txt 60 \(q(w.base))/saved 'saved under lock'")
            defer { hold.stop() }
            try await eventually("A's program saved", "test -e \(q(w.base))/saved")
            try await Task.sleep(for: .milliseconds(1500))
            #expect(try sh("cat \(q(b))/doc.txt") == "v1", "B got A's file while A's program still held it")
            #expect(try w.chunkBytesIn() == inBefore, "content was uploaded during the lock")
            FileManager.default.createFile(atPath: w.base + "/saved.release", contents: nil)
            hold.wait()
            try await eventually("the saved content on B after the unlock", "test \"$(cat \(q(b))/doc.txt)\" = 'saved under lock'")
        }
    }

    /// `nimbus coordinate --write` holds an exclusive claim for the command's run: what it writes
    /// is uploaded only after it ends; `--read` keeps a remote version out until it ends; a claim
    /// that cannot be had fails after --timeout naming the holder; the command's exit status is
    /// passed on.
    @Test func nimbusCoordinateRunsACommandUnderAClaim() async throws {
        try await SyncWorld.run("coordinate") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            let nimbus = q(NimbusBinary.path)
            try sh("printf v1 > \(q(a))/f.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/f.txt)\" = v1")

            let save = try Background("\(nimbus) coordinate --write \(q(a))/f.txt -- sh -c 'printf v2 > \(q(a))/f.txt; touch \(q(w.base))/saved; sleep 5'")
            defer { save.stop() }
            try await eventually("saved under the claim", "test -e \(q(w.base))/saved")
            let claims = try sh("\(nimbus) debug claims \(q(a))")
            #expect(claims.contains("exclusive") && claims.contains("/f.txt"), "\(claims)")
            try await Task.sleep(for: .seconds(1))
            #expect(try sh("cat \(q(b))/f.txt") == "v1", "nothing uploaded while the command holds the claim")
            save.wait()
            try await eventually("v2 on B after the command", "test \"$(cat \(q(b))/f.txt)\" = v2")

            // Under --read on B, A's next version waits; it arrives when the command ends.
            let reader = try Background("\(nimbus) coordinate --read \(q(b))/f.txt -- sh -c 'touch \(q(w.base))/reading; sleep 4; cat \(q(b))/f.txt > \(q(w.base))/seen'")
            defer { reader.stop() }
            try await eventually("reading under the claim", "test -e \(q(w.base))/reading")
            try sh("printf v3 > \(q(a))/f.txt")
            reader.wait()
            #expect(try sh("cat \(q(w.base))/seen") == "v2", "the reader saw one consistent version")
            try await eventually("v3 on B after the reader", "test \"$(cat \(q(b))/f.txt)\" = v3")

            // Busy: a write claim against a held lock gives up after the timeout, naming the holder.
            let hold = try Background("exec flock -s \(q(b))/f.txt sleep 5")
            defer { hold.stop() }
            try await eventually("held", "\(nimbus) debug claims \(q(b)) | grep -q flock")
            let busy = shStatus("\(nimbus) coordinate --write --timeout 1 \(q(b))/f.txt -- true")
            #expect(busy.0 == 5 && busy.1.contains("stayed claimed") && busy.1.contains("flock"), "\(busy)")
            #expect(shStatus("\(nimbus) coordinate --read \(q(b))/f.txt -- sh -c 'exit 7'").0 == 7)
        }
    }
}
