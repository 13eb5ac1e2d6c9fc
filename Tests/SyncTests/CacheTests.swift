import Foundation
import Glibc
import NimbusTesting
import Testing

/// The cache and its controls (evict, pin, download, --cache-size), offline and pause, and
/// uploads of files kept open — through xattrs and the CLI, on real mounts (docs/sync.md).
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct CacheTests {
    static func xattr(_ path: String, _ name: String) throws -> String {
        try sh("getfattr --absolute-names --only-values -n user.nimbus.\(name) \(q(path)) 2>&1")
    }

    static func statusLine(_ mp: String, _ key: String) throws -> String {
        let text = try sh("cat \(q(mp))/.nimbus/status")
        for line in text.split(separator: "\n") where line.hasPrefix(key + ": ") {
            return String(line.dropFirst(key.count + 2))
        }
        Issue.record("no \(key) in .nimbus/status: \(text)")
        return ""
    }

    @Test func evictPinDownloadAndTheCacheLimit() async throws {
        try await SyncWorld.run("cache") { w in
            let a = try await w.mount("a")
            let b = try await w.mount("b", options: ["--cache-size", "7M"])
            let nimbus = q(NimbusBinary.path)
            try sh("mkdir \(q(a))/big && for i in 1 2 3 4; do head -c 3145728 /dev/urandom > \(q(a))/big/f$i; done; head -c 3145728 /dev/urandom > \(q(a))/keep.bin")
            try await eventually("files listed on B", seconds: 60,
                                 "for f in big/f1 big/f2 big/f3 big/f4 keep.bin; do test \"$(stat -c %s \(q(b))/$f)\" = 3145728 || exit 1; done")
            #expect(try Self.xattr(b + "/big/f1", "status") == "cloud")
            #expect(try Self.xattr(b + "/big/f1", "progress") == "0% 0/3145728")
            #expect(try Self.xattr(b + "/big/f1", "pinned") == "0")
            #expect(Int(try Self.xattr(b + "/big/f1", "version")) ?? 0 > 0)
            #expect(try Self.statusLine(b, "cache-limit") == "7340032")

            // A read downloads; evict makes it cloud again and a later read downloads again.
            try sh("cmp \(q(a))/big/f1 \(q(b))/big/f1")
            #expect(try Self.xattr(b + "/big/f1", "status") == "current")
            #expect(try Self.xattr(b + "/big/f1", "progress") == "100% 3145728/3145728")
            try sh("setfattr -n user.nimbus.evict -v 1 \(q(b))/big/f1")
            #expect(try Self.xattr(b + "/big/f1", "status") == "cloud")
            let before = try w.chunkBytesOut()
            try sh("cmp \(q(a))/big/f1 \(q(b))/big/f1")
            #expect(try w.chunkBytesOut() - before >= 3145728, "the read after evict downloaded again")

            // An open file is not evicted (EBUSY); the CLI says so and exits non-zero.
            let busy = shStatus("exec 3< \(q(b))/big/f1; \(nimbus) evict \(q(b))/big/f1; rc=$?; exec 3<&-; exit $rc")
            #expect(busy.0 != 0 && busy.1.contains("kept"), "\(busy)")
            #expect(try Self.xattr(b + "/big/f1", "status") == "current")

            // Pin: downloaded without a read, and kept under cache pressure.
            try sh("\(nimbus) pin \(q(b))/keep.bin")
            try await eventually("pinned file downloaded", "test \"$(getfattr --only-values -n user.nimbus.status \(q(b))/keep.bin)\" = current")
            #expect(try Self.xattr(b + "/keep.bin", "pinned") == "1")
            for i in 1...4 { try sh("cmp \(q(a))/big/f\(i) \(q(b))/big/f\(i)") }
            // 3 MiB pinned + 12 MiB read > 7 MiB: the least recently read unpinned files go.
            try await eventually("cache under its limit", "test $(sed -n 's/^cache-used: //p' \(q(b))/.nimbus/status) -le 7340032")
            #expect(try Self.xattr(b + "/keep.bin", "status") == "current")
            #expect(try Self.xattr(b + "/big/f1", "status") == "cloud", "the least recently read file was evicted")
            #expect(try Self.xattr(b + "/big/f4", "status") == "current", "the most recently read file stays")
            let du = Int(try sh("du -sk \(q(w.base))/b-state/cache | cut -f1").trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
            #expect(du > 0 && du <= 7 * 1024 + 256, "cache files hold \(du) KiB on disk")

            // nimbus download of a folder: every file was complete at some point; the limit holds.
            let dl = try sh("\(nimbus) download \(q(b))/big")
            #expect(dl.contains("downloaded 4 file(s)"), "\(dl)")
            try await eventually("cache under its limit after download", "test $(sed -n 's/^cache-used: //p' \(q(b))/.nimbus/status) -le 7340032")

            // Status through the CLI, as JSON.
            let json = try sh("\(nimbus) status --json \(q(b))/keep.bin")
            let obj = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: String]
            #expect(obj?["status"] == "current" && obj?["pinned"] == "1", "\(json)")
            // Unpin: the file may be evicted again.
            try sh("\(nimbus) unpin \(q(b))/keep.bin && \(nimbus) evict \(q(b))/keep.bin")
            #expect(try Self.xattr(b + "/keep.bin", "status") == "cloud")
            // Hostile values are refused.
            #expect(shStatus("setfattr -n user.nimbus.pinned -v maybe \(q(b))/keep.bin").0 != 0)
            #expect(shStatus("setfattr -n user.nimbus.paused -v 1 \(q(b))/keep.bin").0 != 0)
        }
    }

    @Test func offlineServesWhatIsHereAndPauseIsOfflineOnPurpose() async throws {
        try await SyncWorld.run("offline") { w in
            let a = try await w.mount("a", options: ["--read-timeout", "2"])
            let b = try await w.mount("b")
            let nimbus = q(NimbusBinary.path)
            try sh("printf local > \(q(a))/local.txt")
            try sh("head -c 2000000 /dev/urandom > \(q(b))/remote.bin")
            try await eventually("B's file listed on A", "test \"$(stat -c %s \(q(a))/remote.bin)\" = 2000000")
            try await eventually("A's file on B", "test \"$(cat \(q(b))/local.txt)\" = local")
            // A file made on B and downloaded on A before the server goes.
            try sh("head -c 300000 /dev/urandom > \(q(b))/fetched.bin")
            try await eventually("B's second file on A", "test \"$(stat -c %s \(q(a))/fetched.bin)\" = 300000")
            try sh("cmp \(q(a))/fetched.bin \(q(b))/fetched.bin")

            // Server gone: local files stay readable and writable; a placeholder read fails
            // with EIO within the bound; status says offline.
            w.stopServer()
            try sh("test \"$(cat \(q(a))/local.txt)\" = local && printf ' more' >> \(q(a))/local.txt && printf new > \(q(a))/offline.txt")
            // What was downloaded stays readable, and writable, offline.
            try sh("cmp \(q(a))/fetched.bin \(q(b))/fetched.bin && printf tail >> \(q(a))/fetched.bin")
            let t0 = Date()
            let read = shStatus("cat \(q(a))/remote.bin > /dev/null")
            let waited = Date().timeIntervalSince(t0)
            #expect(read.0 != 0 && read.1.contains("Input/output error"), "\(read)")
            #expect(waited < 4, "the read failed after \(waited) s (bound 2 s)")
            print("sync figures: offline placeholder read failed after \(waited) s (--read-timeout 2)")
            try await eventually("status offline", seconds: 40, "grep -q '^connection: offline' \(q(a))/.nimbus/status")
            #expect(try Self.xattr(a + "/offline.txt", "status") == "uploading")

            // Server back: A's queue drains and B converges.
            try await w.restartServer()
            try await eventually("queue drained", seconds: 60, "grep -q '^upload-queue: 0' \(q(a))/.nimbus/status && grep -q '^connection: online' \(q(a))/.nimbus/status")
            try await eventually("B converged", seconds: 30, "test \"$(cat \(q(b))/local.txt)\" = 'local more' && test \"$(cat \(q(b))/offline.txt)\" = new && cmp \(q(a))/fetched.bin \(q(b))/fetched.bin")
            #expect(try sh("tail -c 4 \(q(b))/fetched.bin") == "tail")

            // Pause: nothing goes out or comes in; placeholder reads fail at once; resume syncs.
            try sh("\(nimbus) pause \(q(a))")
            #expect(try Self.statusLine(a, "connection").hasPrefix("paused"))
            try sh("printf p > \(q(a))/paused.txt && printf fromb > \(q(b))/b.txt")
            let t1 = Date()
            #expect(shStatus("cat \(q(a))/remote.bin > /dev/null").0 != 0)
            #expect(Date().timeIntervalSince(t1) < 1, "a paused mount fails placeholder reads at once")
            try await Task.sleep(for: .seconds(2))
            #expect(shStatus("test -e \(q(b))/paused.txt").0 != 0, "nothing uploaded while paused")
            #expect(shStatus("test -e \(q(a))/b.txt").0 != 0, "nothing applied while paused")
            try sh("\(nimbus) resume \(q(a))")
            try await eventually("upload after resume", "test \"$(cat \(q(b))/paused.txt)\" = p")
            try await eventually("download after resume", "test \"$(cat \(q(a))/b.txt)\" = fromb")
            try sh("cmp \(q(a))/remote.bin \(q(b))/remote.bin")
        }
    }

    @Test func aFileKeptOpenIsUploadedAfterAQuietPeriodAndAnUnclosedEditSurvivesKill9() async throws {
        try await SyncWorld.run("quiet") { w in
            let a = try await w.mount("a", options: ["--quiet-period", "1"])
            let b = try await w.mount("b")
            let c = try await w.mount("c", options: ["--quiet-period", "0"])
            // A writer keeps the file open: the first content reaches B while it is still open.
            let writer = try Background("exec 3> \(q(a))/log.txt; printf 'one\\n' >&3; sleep 4; printf 'two\\n' >&3; exec sleep 30")
            defer { writer.stop() }
            try await eventually("snapshot of an open file on B", seconds: 4, "test \"$(cat \(q(b))/log.txt)\" = one")
            try await eventually("next snapshot on B", seconds: 8, "printf 'one\\ntwo\\n' | cmp -s - \(q(b))/log.txt")
            writer.stop()

            // C (no quiet period) rewrites a synced file in place, never closes it, and dies.
            try await eventually("file on C", "test \"$(cat \(q(c))/log.txt)\" = \"$(printf 'one\\ntwo')\"")
            let holder = try Background("exec 3<> \(q(c))/log.txt; printf 'ONE\\n' >&3; exec sleep 60")
            defer { holder.stop() }
            try await eventually("written on C", "head -c 4 \(q(c))/log.txt | grep -q ONE")
            try await Task.sleep(for: .milliseconds(300))  // the write-behind commit of the note
            #expect(shStatus("head -c 3 \(q(b))/log.txt | grep -q ONE").0 != 0, "not uploaded while open without a quiet period")
            try w.crash(c)
            holder.stop()
            try w.remount("c")
            try await eventually("the unclosed edit reached B after the restart", seconds: 20, "printf 'ONE\\ntwo\\n' | cmp -s - \(q(b))/log.txt")
        }
    }
}
