import Foundation
import Glibc
import NimbusTesting
import Testing

/// Offline edits, conflicts and the upload queue across a crash (docs/sync.md).
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct RecoveryTests {
    @Test func editsOnBothDevicesWhileOfflineKeepBothOnTheServer() async throws {
        let w = try await SyncWorld("conflict")
        defer { w.cleanup() }
        let a = try await w.mount("a"), b = try await w.mount("b")
        try sh("printf v1 > \(q(a))/doc.txt")
        try await eventually("v1 on B", "test \"$(cat \(q(b))/doc.txt)\" = v1")
        w.server.stop()
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

    @Test func theUploadQueueSurvivesKill9() async throws {
        let w = try await SyncWorld("queue")
        defer { w.cleanup() }
        let a = try await w.mount("a"), b = try await w.mount("b")
        w.server.stop()
        try sh("mkdir \(q(a))/offline && printf queued > \(q(a))/offline/q.txt && sync")
        try await eventually("queued on A", "grep -q 'upload-queue: [1-9]' \(q(a))/.nimbus/status")
        try w.crash(a)
        try await w.restartServer()
        try w.remount("a")
        try await eventually("A's queued upload on B", seconds: 60, "test \"$(cat \(q(b))/offline/q.txt)\" = queued")
        try await eventually("A's queue drained", "grep -q 'upload-queue: 0' \(q(a))/.nimbus/status")
    }
}
