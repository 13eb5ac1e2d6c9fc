import Foundation
import Glibc
import NimbusTesting
import Testing

/// Indexers, thumbnailers and scanners never download (docs/mount.md "Indexers, thumbnailers and
/// scanners"): on a mount of 10,000 placeholders, a program on the deny list reading every file
/// gets `EACCES` at once and nothing is downloaded; `stat`, listings, xattrs and `updatedb`
/// download nothing either; a shell's `cat` still downloads; `nimbus policy` changes the lists
/// of a running mount.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct IndexerTests {
    /// Reads the first byte of every file below ROOT, named NAME (`prctl(PR_SET_NAME)`: the
    /// kernel keeps 15 bytes, so `tracker-extract-3` is `tracker-extract` in `comm`, and the
    /// executable is python's: only the cut name can match). Prints: read, refused (EACCES),
    /// other errors, and the p50, p99 and largest time of one read in nanoseconds.
    static let reader = """
    import ctypes, errno, os, sys, time
    ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)
    ok = refused = other = 0
    times = []
    for d, dirs, files in os.walk(sys.argv[2]):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            t = time.monotonic_ns()
            try:
                os.pread(fd, 1, 0)
                ok += 1
            except OSError as e:
                if e.errno == errno.EACCES:
                    refused += 1
                else:
                    other += 1
            times.append(time.monotonic_ns() - t)
            os.close(fd)
    times.sort()
    n = len(times)
    print(ok, refused, other, times[n // 2] if n else 0, times[min(n - 1, n * 99 // 100)] if n else 0, times[-1] if n else 0)
    """

    struct Reads { var ok, refused, other: Int; var p50, p99, max: Double }

    static func read(as name: String, _ root: String, script: String) throws -> Reads {
        let f = try sh("python3 \(q(script)) \(q(name)) \(q(root))").split(separator: " ").map { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1 }
        guard f.count == 6 else { throw ShellFailed(description: "reader printed \(f)") }
        return Reads(ok: f[0], refused: f[1], other: f[2], p50: Double(f[3]) / 1e6, p99: Double(f[4]) / 1e6, max: Double(f[5]) / 1e6)
    }

    @Test func indexersNeverDownloadAndAShellStillDoes() async throws {
        try await SyncWorld.run("indexers") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            let nimbus = q(NimbusBinary.path)
            let script = w.base + "/reader.py"
            try Self.reader.write(toFile: script, atomically: true, encoding: .utf8)
            // 10,000 small files in 100 folders, made on A: placeholders on B.
            try sh("cd \(q(a)) && for d in $(seq 0 99); do mkdir d$d; for i in $(seq 0 99); do echo $d.$i > d$d/f$i; done; done")
            try await eventually("10,000 files on B", seconds: 240, "grep -qx 'files: 10000' \(q(b))/.nimbus/status")
            // Small files come with the journal's pages (some bytes inline): evicted, all are placeholders.
            try sh("cd \(q(b)) && \(nimbus) evict d* > /dev/null")
            try await eventually("10,000 placeholders on B", seconds: 60, "grep -qx 'placeholders: 10000' \(q(b))/.nimbus/status")
            let downloaded = { try CacheTests.statusLine(b, "bytes-downloaded") }
            let before = try downloaded()

            // stat, listings and xattr reads of every file fetch no content.
            try sh("ls -lR \(q(b)) > /dev/null && find \(q(b)) -type f -exec stat -c %s {} + > /dev/null && getfattr -R -d \(q(b)) > /dev/null 2>&1")
            #expect(try downloaded() == before, "stat, ls -lR and getfattr downloaded content")

            // A desktop indexer's extractor reading the first byte of every file.
            let r = try Self.read(as: "tracker-extract-3", b, script: script)
            print("tracker-extract-3 over 10,000 placeholders: \(r.ok) read, \(r.refused) refused, \(r.other) other errors; one refused read: p50 \(r.p50) ms, p99 \(r.p99) ms, max \(r.max) ms")
            #expect(r.ok == 0 && r.refused == 10_000 && r.other == 0)
            #expect(r.p99 <= 50, "a refused read returns at once (no network): p99 \(r.p99) ms")
            #expect(try downloaded() == before, "an indexer downloaded content")

            // A thumbnailer, known by its executable's name (`comm` cuts it to gdk-pixbuf-thum).
            try sh("mkdir -p \(q(w.base))/bin && cp /usr/bin/head \(q(w.base))/bin/gdk-pixbuf-thumbnailer")
            let thumb = shStatus("\(q(w.base))/bin/gdk-pixbuf-thumbnailer -c 1 \(q(b))/d3/f3 2>&1")
            #expect(thumb.0 != 0 && thumb.1.contains("Permission denied"), "a thumbnailer read a placeholder: \(thumb)")

            // updatedb walking the whole mount (not pruned here, to show the walk is harmless).
            if shStatus("command -v updatedb").0 == 0 {
                try sh("updatedb -U \(q(b)) -o \(q(w.base))/locate.db --prunefs '' --prunepaths '' --prunenames '' -l no")
                #expect(try sh("locate -d \(q(w.base))/locate.db -c d99/f99").trimmingCharacters(in: .whitespacesAndNewlines) == "1", "updatedb walked the mount")
            }
            #expect(try downloaded() == before, "updatedb or a thumbnailer downloaded content")

            // Each refused program once in the events and in the status, with the command that allows it.
            let events = try sh("cat \(q(b))/.nimbus/events")
            let refusedLines = events.split(separator: "\n").filter { $0.contains(" refused local ") }
            #expect(refusedLines.count == 2, "refused lines: \(refusedLines)")
            #expect(refusedLines.contains { $0.contains("tracker-extract-3 may not download (allow it: nimbus policy allow tracker-extract-3)") })
            #expect(refusedLines.contains { $0.contains("gdk-pixbuf-thumbnailer may not download") })
            #expect(try CacheTests.statusLine(b, "refused-programs") == "tracker-extract-3 gdk-pixbuf-thumbnailer")
            #expect(try sh("\(nimbus) status \(q(b))").contains("nimbus policy allow PROGRAM"))

            // A shell's cat still downloads.
            #expect(try sh("cat \(q(b))/d1/f1") == "1.1\n")
            #expect(Int(try downloaded())! > Int(before)!)

            // The user allows the indexer: the running mount follows; then back to the shipped list.
            try sh("\(nimbus) policy allow tracker-extract-3 --mount \(q(b))")
            #expect(try sh("\(nimbus) policy list --mount \(q(b))").contains("allowed (yours):  tracker-extract-3"))
            try await eventually("the indexer allowed", "test \"$(python3 \(q(script)) tracker-extract-3 \(q(b))/d2 | cut -d' ' -f1-3)\" = '100 0 0'")
            try sh("\(nimbus) policy default tracker-extract-3 --mount \(q(b)) && \(nimbus) policy deny my-scanner --state \(q(w.base))/b-state")
            // The mount looks at the file once a second at most (a read allowed meanwhile
            // downloads, and the file then reads for anyone: wait, then read once).
            try sh("sleep 1.5")
            #expect(try sh("python3 \(q(script)) tracker-extract-3 \(q(b))/d4 | cut -d' ' -f1-3") == "0 100 0\n", "the indexer refused again")
            #expect(try sh("python3 \(q(script)) my-scanner \(q(b))/d5 | cut -d' ' -f1-3") == "0 100 0\n", "a program the user denied")
            let bad = shStatus("\(nimbus) policy deny 'a/b' --mount \(q(b)) 2>&1")
            #expect(bad.0 != 0 && bad.1.contains("not a path"))
        }
    }
}
