import Foundation
import Glibc
import NimbusTesting
import Testing

/// Programs that care about their files' integrity, on two devices (issue 5, docs/sync.md
/// "Files that never leave this device", docs/coordination.md): SQLite through its own fcntl
/// locks, and a program that rewrites and fsyncs checksummed generations.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct IntegrityTests {
    static func token(_ w: SyncWorld, _ device: String) throws -> String {
        try String(contentsOfFile: w.base + "/\(device).token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func itemID(_ path: String) throws -> String {
        try sh("getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(path))")
    }

    /// Every version the server keeps of item `id` (current, conflict, old), as JSON objects.
    static func versions(_ w: SyncWorld, _ id: String) throws -> [[String: Any]] {
        let json = try sh("curl -s --max-time 5 -H 'Authorization: Bearer \(try token(w, "a"))' \(w.server.url)/v1/containers/docs/items/\(id)/versions")
        let obj = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any]
        return obj?["versions"] as? [[String: Any]] ?? []
    }

    /// The bytes of a version, fetched chunk by chunk from the server.
    static func content(_ w: SyncWorld, _ version: [String: Any]) throws -> Data {
        let chunks = (version["state"] as? [String: Any])?["chunks"] as? [[String: Any]] ?? []
        var out = Data()
        for c in chunks {
            let hash = c["hash"] as? String ?? ""
            let file = w.base + "/chunk.bin"
            try sh("curl -s --fail --max-time 10 -o \(q(file)) -H 'Authorization: Bearer \(try token(w, "a"))' \(w.server.url)/v1/chunks/\(hash)")
            out.append(try Data(contentsOf: URL(fileURLWithPath: file)))
        }
        return out
    }

    @Test func twoDevicesWritingOneSQLiteDatabaseNeverSeeItCorrupt() async throws {
        try await SyncWorld.run("sqlite") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("sqlite3 \(q(a))/notes.db \"CREATE TABLE t(dev TEXT, i INTEGER); INSERT INTO t VALUES ('base', 0)\"")
            // (Read-only: the sqlite3 shell would create an empty notes.db on B before the real
            // one arrives, and two creates of one name keep both as "notes 2.db".)
            try await eventually("the database on B", "test \"$(sqlite3 'file:\(b)/notes.db?mode=ro' 'SELECT count(*) FROM t')\" = 1")

            // Both devices insert while checkers on both devices keep opening the database and
            // checking it. "database is locked" is SQLite waiting its turn; anything else fails.
            let live = """
                import sqlite3, multiprocessing, sys, time
                a, b = sys.argv[1], sys.argv[2]
                def writer(mp, dev):
                    for i in range(1, 41):
                        db = sqlite3.connect(mp + "/notes.db", timeout=20)
                        with db:
                            db.execute("INSERT INTO t VALUES (?, ?)", (dev, i))
                        db.close()
                        time.sleep(0.03)
                def checker(mp, stop):
                    checks = 0
                    while not stop.is_set() or checks < 5:
                        try:
                            db = sqlite3.connect("file:" + mp + "/notes.db?mode=ro", uri=True, timeout=20)
                            r = db.execute("PRAGMA integrity_check").fetchall()
                            n = db.execute("SELECT count(*) FROM t").fetchone()[0]
                            db.close()
                        except sqlite3.OperationalError as e:
                            if "locked" in str(e): continue
                            print("checker on", mp, "failed:", e); sys.exit(1)
                        except sqlite3.DatabaseError as e:
                            print("checker on", mp, "saw a corrupt database:", e); sys.exit(1)
                        if r != [("ok",)] or n < 1:
                            print("checker on", mp, "integrity:", r, "rows:", n); sys.exit(1)
                        checks += 1
                        time.sleep(0.02)
                    print("checker on", mp, "ran", checks, "checks")
                stop = multiprocessing.Event()
                ws = [multiprocessing.Process(target=writer, args=(a, "a")), multiprocessing.Process(target=writer, args=(b, "b"))]
                cs = [multiprocessing.Process(target=checker, args=(a, stop)), multiprocessing.Process(target=checker, args=(b, stop))]
                [p.start() for p in ws + cs]; [p.join() for p in ws]; stop.set(); [p.join() for p in cs]
                codes = [p.exitcode for p in ws + cs]
                assert codes == [0, 0, 0, 0], codes
                """
            try FileManager.default.createDirectory(atPath: w.base + "/py", withIntermediateDirectories: true)
            try live.write(toFile: w.base + "/py/live.py", atomically: true, encoding: .utf8)
            let out = try sh("python3 \(q(w.base))/py/live.py \(q(a)) \(q(b))")
            print("sqlite: \(out)")

            // Concurrent edits while both devices are offline: one becomes the current version,
            // the other a conflict version of the same item.
            let nimbus = NimbusBinary.path
            // Settled first, and read on both devices (`cmp`), so both hold the whole database:
            // offline, a database not downloaded here cannot be opened (EIO, docs/sync.md).
            try await eventually("the devices agree after the live phase", seconds: 60,
                                 "cmp \(q(a))/notes.db \(q(b))/notes.db && grep -q '^upload-queue: 0' \(q(a))/.nimbus/status && grep -q '^upload-queue: 0' \(q(b))/.nimbus/status && cmp \(q(a))/notes.db \(q(b))/notes.db")
            try sh("\(q(nimbus)) pause \(q(a)) && \(q(nimbus)) pause \(q(b))")
            try sh("sqlite3 \(q(a))/notes.db \"INSERT INTO t VALUES ('offline a', 1)\"")
            usleep(1_100_000)
            try sh("sqlite3 \(q(b))/notes.db \"INSERT INTO t VALUES ('offline b', 1)\"")
            try sh("\(q(nimbus)) resume \(q(a)) && \(q(nimbus)) resume \(q(b))")

            // Both devices end with the same whole database, and no journal ever left a device.
            try await eventually("the devices agree", seconds: 60,
                                 "cmp \(q(a))/notes.db \(q(b))/notes.db && grep -q '^upload-queue: 0' \(q(a))/.nimbus/status && grep -q '^upload-queue: 0' \(q(b))/.nimbus/status")
            for mp in [a, b] {
                #expect(try sh("sqlite3 \(q(mp))/notes.db 'PRAGMA integrity_check'") == "ok\n")
            }
            let rows = try sh("sqlite3 \(q(b))/notes.db \"SELECT dev FROM t WHERE dev LIKE 'offline%'\"")
            #expect(rows == "offline b\n", "the later offline edit is current: \(rows)")
            let id = try Self.itemID(a + "/notes.db")
            let conflicts = try Self.versions(w, id).filter { ($0["role"] as? String) == "conflict" }
            #expect(!conflicts.isEmpty, "the other device's edit is kept as a conflict version")
            // Every version the server holds is a whole database.
            for v in try Self.versions(w, id) {
                let file = w.base + "/version.db"
                try Self.content(w, v).write(to: URL(fileURLWithPath: file))
                #expect(try sh("sqlite3 \(q(file)) 'PRAGMA integrity_check'") == "ok\n", "version \(v["version"] ?? "?")")
            }
            let journal = try sh("curl -s --max-time 5 -H 'Authorization: Bearer \(try Self.token(w, "a"))' '\(w.server.url)/v1/containers/docs/changes?since=0&limit=1000'")
            #expect(!journal.contains("-journal"), "a SQLite journal was uploaded")
        }
    }

    @Test func aProgramRewritingGenerationsOnlyEverUploadsWholeGenerations() async throws {
        try await SyncWorld.run("generations") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            // Generation N: a header, N-dependent bytes of varying length (some over several
            // chunks), and the SHA-256 of all that. Rewritten in place through one descriptor
            // (pwrite, then ftruncate: in between the file is a mix), fsynced after each.
            let writer = """
                import hashlib, os, sys, time, random
                path, count = sys.argv[1], int(sys.argv[2])
                def generation(n):
                    rnd = random.Random(n)
                    size = rnd.choice([3000, 70000, 400000, 3000000])
                    body = ("gen %d\\n" % n).encode() + rnd.randbytes(size)
                    return body + ("sha256 %s\\n" % hashlib.sha256(body).hexdigest()).encode()
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                for n in range(1, count + 1):
                    data = generation(n)
                    os.pwrite(fd, data, 0)
                    os.ftruncate(fd, len(data))
                    os.fsync(fd)
                    time.sleep(random.Random(-n).uniform(0.02, 0.15))
                os.close(fd)
                """
            let check = """
                import hashlib, sys
                data = open(sys.argv[1], "rb").read()
                body, _, tail = data.rpartition(b"sha256 ")
                ok = data.startswith(b"gen ") and tail == ("%s\\n" % hashlib.sha256(body).hexdigest()).encode()
                print(data.split(b"\\n", 1)[0].decode(errors="replace") if ok else "TORN %d bytes" % len(data))
                """
            try FileManager.default.createDirectory(atPath: w.base + "/py", withIntermediateDirectories: true)
            try writer.write(toFile: w.base + "/py/writer.py", atomically: true, encoding: .utf8)
            try check.write(toFile: w.base + "/py/check.py", atomically: true, encoding: .utf8)
            let generations = 60
            // B reads the file over and over while A writes: every read is one whole generation.
            let reader = try Background("""
                while true; do
                  if cp \(q(b))/gen.bin \(q(w.base))/b-read.bin 2>/dev/null; then python3 \(q(w.base))/py/check.py \(q(w.base))/b-read.bin; fi
                  sleep 0.05
                done
                """)
            defer { reader.stop() }
            try sh("python3 \(q(w.base))/py/writer.py \(q(a))/gen.bin \(generations)")
            try await eventually("the last generation on B", seconds: 60,
                                 "cp \(q(b))/gen.bin \(q(w.base))/b-last.bin && test \"$(python3 \(q(w.base))/py/check.py \(q(w.base))/b-last.bin)\" = 'gen \(generations)'")
            reader.stop()
            let seenOnB = reader.output.split(separator: "\n")
            #expect(!seenOnB.contains { $0.hasPrefix("TORN") }, "B read a torn file: \(seenOnB.filter { $0.hasPrefix("TORN") })")

            // Every content the server ever received is one complete generation.
            let versions = try Self.versions(w, try Self.itemID(a + "/gen.bin"))
            var seen: [String] = []
            for v in versions {
                let file = w.base + "/version.bin"
                try Self.content(w, v).write(to: URL(fileURLWithPath: file))
                let verdict = try sh("python3 \(q(w.base))/py/check.py \(q(file))").trimmingCharacters(in: .whitespacesAndNewlines)
                #expect(verdict.hasPrefix("gen "), "server version \(v["version"] ?? "?") is not a whole generation: \(verdict)")
                seen.append(verdict)
            }
            print("sync figures: \(generations) generations written, the server received \(versions.count): \(seen.joined(separator: ", "))")
            #expect(versions.count >= 2, "sync ran while the program wrote")
        }
    }
}
