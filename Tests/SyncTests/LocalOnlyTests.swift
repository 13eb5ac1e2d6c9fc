import Foundation
import Glibc
import NimbusTesting
import Testing

/// Local-only items (docs/posix.md "Local-only items"): FIFOs, sockets and device nodes made on
/// a synced mount work as on any Linux filesystem, survive remounts and crashes, say they are
/// local-only, and never reach the server or another device.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct LocalOnlyTests {
    @Test func fifosSocketsAndDevicesStayOnTheirDevice() async throws {
        try await SyncWorld.run("local-only") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            let nimbus = q(NimbusBinary.path)
            try sh("""
                cd \(q(a)) && mkdir d && mkfifo d/pipe && mknod d/tty c 5 0 && mknod d/loop b 7 0 && \
                python3 -c "import socket; socket.socket(socket.AF_UNIX).bind('d/sock')" && \
                chmod 640 d/pipe && chown 1000:1000 d/tty && touch -d '2001-02-03 04:05:06' d/loop && mv d/sock d/agent.sock
                """)
            // A FIFO carries bytes between two programs, through the kernel.
            #expect(try sh("cd \(q(a)) && (printf hello > d/pipe &) && cat d/pipe") == "hello")
            // Something synced after them: once it is on B, they would be too.
            try sh("printf x > \(q(a))/d/marker")
            try await eventually("marker on B", "test -f \(q(b))/d/marker")
            try await eventually("A's uploads done", "grep -qx 'upload-queue: 0' \(q(a))/.nimbus/status")
            #expect(try sh("ls -A \(q(b))/d") == "marker\n")
            let kinds = "stat -c '%n %F %t:%T %a %u %Y' d/agent.sock d/loop d/pipe d/tty"
            let before = try sh("cd \(q(a)) && \(kinds)")
            #expect(before == """
                d/agent.sock socket 0:0 755 0 \(try sh("cd \(q(a)) && stat -c %Y d/agent.sock").trimmingCharacters(in: .whitespacesAndNewlines))
                d/loop block special file 7:0 644 0 \(try sh("date -d '2001-02-03 04:05:06' +%s").trimmingCharacters(in: .whitespacesAndNewlines))
                d/pipe fifo 0:0 640 0 \(try sh("cd \(q(a)) && stat -c %Y d/pipe").trimmingCharacters(in: .whitespacesAndNewlines))
                d/tty character special file 5:0 644 1000 \(try sh("cd \(q(a)) && stat -c %Y d/tty").trimmingCharacters(in: .whitespacesAndNewlines))

                """)
            #expect(try CacheTests.statusLine(a, "local-only") == "4")
            #expect(try sh("\(nimbus) status \(q(a))/d/pipe").hasPrefix("local-only"))
            // A remount, then a crash: all four are still there, the same.
            try sh("\(nimbus) unmount \(q(a))")
            try w.remount("a")
            #expect(try sh("cd \(q(a)) && \(kinds)") == before)
            try w.crash(a)
            try w.remount("a")
            #expect(try sh("cd \(q(a)) && \(kinds)") == before)
            try await eventually("local-only counted after the restart", "grep -qx 'local-only: 4' \(q(a))/.nimbus/status")
            // Unlinked and renamed like any item; B never hears of them.
            try sh("cd \(q(a)) && rm d/tty && mv d/loop d/loop0 && printf y > d/marker2")
            try await eventually("second marker on B", "test -f \(q(b))/d/marker2")
            #expect(try sh("ls -A \(q(b))/d") == "marker\nmarker2\n")
            #expect(try sh("ls -A \(q(a))/d") == "agent.sock\nloop0\nmarker\nmarker2\npipe\n")
            try await eventually("three local-only", "grep -qx 'local-only: 3' \(q(a))/.nimbus/status")
            // mknod of a regular file still makes a synced file.
            try sh("mknod \(q(a))/d/plain p 2>/dev/null; rm -f \(q(a))/d/plain; python3 -c \"import os; os.mknod('\(a)/d/regular')\"")
            try await eventually("a regular file made by mknod on B", "test -f \(q(b))/d/regular")
        }
    }

    /// B makes a file under the name A's FIFO has: A shows it beside the FIFO, under the name the
    /// server gives a taken name, and that rename reaches B too; the FIFO keeps its name.
    @Test func aRemoteItemAtALocalOnlyNameTakesTheNameBesideIt() async throws {
        try await SyncWorld.run("local-only-name") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("mkdir \(q(a))/d && mkfifo \(q(a))/d/report.txt && mknod \(q(a))/d/report\\ 2.txt c 1 3")
            try await eventually("folder on B", "test -d \(q(b))/d")
            try sh("printf 'from b' > \(q(b))/d/report.txt")
            try await eventually("B's file beside A's FIFO and device", "test \"$(cat \(q(a))/d/report\\ 3.txt)\" = 'from b'")
            try await eventually("the new name on B", "test \"$(cat \(q(b))/d/report\\ 3.txt)\" = 'from b' && ! test -e \(q(b))/d/report.txt")
            #expect(try sh("stat -c '%n %F' \(q(a))/d/report.txt \(q(a))/d/report\\ 2.txt | sed 's|.*/||'") == "report.txt fifo\nreport 2.txt character special file\n")
            #expect(try sh("ls -A \(q(b))/d") == "report 3.txt\n")
            // A later edit on B reaches A under the new name.
            try sh("printf 'again' > \(q(b))/d/report\\ 3.txt")
            try await eventually("B's edit on A", "test \"$(cat \(q(a))/d/report\\ 3.txt)\" = again")
            // A moved file arriving at the FIFO's name does the same.
            try sh("printf m > \(q(b))/m.txt")
            try await eventually("m.txt on A", "test -f \(q(a))/m.txt")
            try sh("mkfifo \(q(a))/d/m.txt && mv \(q(b))/m.txt \(q(b))/d/m.txt")
            try await eventually("the moved file beside A's FIFO", "test \"$(cat \(q(a))/d/m\\ 2.txt)\" = m && test -p \(q(a))/d/m.txt")
            try await eventually("and on B", "test \"$(cat \(q(b))/d/m\\ 2.txt)\" = m")
        }
    }
}
