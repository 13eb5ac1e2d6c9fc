import Foundation
import NimbusTesting
import Testing

/// A file that keeps changing is not uploaded over and over (SyncCore `UploadPacing`,
/// docs/sync.md "Files that keep changing"): a burst, then at most one upload per quiet period,
/// bytes sent within about twice what the program wrote, and the last state always arrives.
@Suite(.serialized) struct PacingTests {
    @Test func aFileRewrittenAndFsyncedAgainAndAgainIsPacedAndItsLastStateArrives() async throws {
        try await SyncWorld.run("pacing") { w in
            let a = try await w.mount("a", options: ["--quiet-period", "2"])
            let b = try await w.mount("b")
            let before = try w.chunkBytesIn()
            // 60 rounds over about 6 s: append 4 KiB of fresh bytes, fsync (each fsync asks for
            // an upload), keep the file open; then close.
            let script = """
            import os, sys, time
            path = sys.argv[1]
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            for i in range(60):
                os.write(fd, os.urandom(4096))
                os.fsync(fd)
                time.sleep(0.1)
            os.close(fd)
            """
            try sh("python3 -c \(q(script)) \(q(a))/log.bin")
            let written: Int64 = 60 * 4096
            try await eventually("the last state on B", seconds: 30, "cmp -s \(q(a))/log.bin \(q(b))/log.bin")
            try await eventually("current on A", "test \"$(getfattr --only-values -n user.nimbus.status \(q(a))/log.bin)\" = current")
            let sent = try w.chunkBytesIn() - before
            let uploads = Int(try sh("grep -c 'uploaded.*log.bin' \(q(a))/.nimbus/events || true").trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
            print("pacing: \(uploads) uploads, \(sent) bytes sent for \(written) written")
            // Unpaced, every fsync uploaded the whole file again: ~60 uploads, ~30× the bytes.
            #expect(uploads >= 1 && uploads <= 12, "uploads of a file fsynced 60 times in 6 s: \(uploads)")
            #expect(sent <= 4 * written, "bytes sent \(sent) for \(written) written")
        }
    }

    @Test func aLogAppendedEverySecondKeepsReachingTheServer() async throws {
        try await SyncWorld.run("pacing-log") { w in
            let a = try await w.mount("a", options: ["--quiet-period", "1"])
            let b = try await w.mount("b")
            // Open, append a line, close: 12 times, 0.3 s apart (a log written by `>>`).
            try sh("for i in $(seq 1 12); do echo \"line $i $(head -c 60 /dev/urandom | base64 -w0)\" >> \(q(a))/app.log; sleep 0.3; done")
            try await eventually("the whole log on B", seconds: 20, "cmp -s \(q(a))/app.log \(q(b))/app.log")
        }
    }
}
