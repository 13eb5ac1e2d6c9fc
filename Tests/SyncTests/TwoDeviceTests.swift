import Foundation
import Glibc
import NimbusTesting
import Testing

/// Device A changes things through its mount; device B sees them through its own mount, with
/// the same bytes and metadata, without remounting (docs/sync.md).
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct TwoDeviceTests {
    @Test(arguments: SyncBackend.all + [.tls, .nginx]) func everyKindOfChangeOnAAppearsOnB(_ backend: SyncBackend) async throws {
        try await SyncWorld.run("ops", backend) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")

            try sh("cd \(q(a)) && printf 'hello\\n' > f.txt && mkdir d && printf abc > d/g && ln -s f.txt link && chmod 600 f.txt")
            try await eventually("file on B", "test \"$(cat \(q(b))/f.txt)\" = hello")
            try await eventually("nested file on B", "test \"$(cat \(q(b))/d/g)\" = abc")
            try await eventually("symlink on B", "test \"$(readlink \(q(b))/link)\" = f.txt")
            try await eventually("mode on B", "test \"$(stat -c %a \(q(b))/f.txt)\" = 600")
            // Same mtime (to the second as stat prints it) on both devices.
            try await eventually("mtime on B", "test \"$(stat -c %Y \(q(a))/f.txt)\" = \"$(stat -c %Y \(q(b))/f.txt)\"")

            // Size, permissions and mtime (to the nanosecond the server keeps) the same on both.
            let meta = { (p: String) in "test \"$(stat -c '%s %a %y' \(q(a))/\(p))\" = \"$(stat -c '%s %a %y' \(q(b))/\(p))\"" }
            try sh("printf 'more\\n' >> \(q(a))/f.txt")
            try await eventually("append on B", "printf 'hello\\nmore\\n' | cmp - \(q(b))/f.txt")
            try await eventually("metadata after append on B", meta("f.txt"))
            try sh("truncate -s 3 \(q(a))/f.txt")
            try await eventually("truncate on B", "test \"$(cat \(q(b))/f.txt)\" = hel")
            try await eventually("metadata after truncate on B", meta("f.txt"))
            // chmod of a synced file and of a folder, and touch -d, each on their own.
            try sh("chmod 640 \(q(a))/f.txt")
            try await eventually("chmod on B", "test \"$(stat -c %a \(q(b))/f.txt)\" = 640")
            try sh("chmod 750 \(q(a))/d")
            try await eventually("folder chmod on B", "test \"$(stat -c %a \(q(b))/d)\" = 750")
            try sh("touch -d '2001-02-03 04:05:06.789' \(q(a))/f.txt")
            try await eventually("touch -d on B", "test \"$(stat -c %Y \(q(b))/f.txt)\" = \"$(date -d '2001-02-03 04:05:06' +%s)\"")
            try await eventually("metadata after chmod and touch on B", meta("f.txt"))
            try sh("mv \(q(a))/f.txt \(q(a))/d/h.txt")
            try await eventually("move on B", "test \"$(cat \(q(b))/d/h.txt)\" = hel && ! test -e \(q(b))/f.txt")
            try sh("mv \(q(a))/d/h.txt \(q(a))/d/renamed.txt")
            try await eventually("rename on B", "test -f \(q(b))/d/renamed.txt && ! test -e \(q(b))/d/h.txt")
            try sh("rm \(q(a))/d/g && mkdir \(q(a))/e")
            try await eventually("delete and mkdir on B", "! test -e \(q(b))/d/g && test -d \(q(b))/e")
            try sh("rmdir \(q(a))/e")
            try await eventually("rmdir on B", "! test -e \(q(b))/e")

            try sh("mkdir -p \(q(a))/t/u && printf x > \(q(a))/t/u/x && printf y > \(q(a))/t/y")
            try await eventually("tree on B", "test \"$(cat \(q(b))/t/u/x)\" = x")
            try sh("rm -r \(q(a))/t")
            try await eventually("rm -r on B", "! test -e \(q(b))/t")

            // And back: B's edit reaches A.
            try sh("printf 'from b' > \(q(b))/d/renamed.txt")
            try await eventually("B's edit on A", "test \"$(cat \(q(a))/d/renamed.txt)\" = 'from b'")
            try sh("ls -la \(q(a)) \(q(b)) > /dev/null")
        }
    }

    /// B's kernel keeps a folder's listing (`FOPEN_CACHE_DIR`); A's creates, renames, moves and
    /// deletes in that folder reach B behind its kernel's back, and each must drop the listing
    /// kept, so `ls` on B shows exactly A's folder.
    @Test func listingsOnBFollowAsChanges() async throws {
        try await SyncWorld.run("listing") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("mkdir -p \(q(a))/d/e && for i in 1 2 3; do echo $i > \(q(a))/d/f$i; done")
            try await eventually("files on B", "test -f \(q(b))/d/f3 && test -d \(q(b))/d/e")
            let same = "test \"$(ls -A \(q(a))/d | tr '\\n' ' ')\" = \"$(ls -A \(q(b))/d | tr '\\n' ' ')\" && test \"$(ls -A \(q(a))/d/e | tr '\\n' ' ')\" = \"$(ls -A \(q(b))/d/e | tr '\\n' ' ')\""
            try await eventually("same listing", same)
            // Listed on B (kept by its kernel), then changed on A, one kind of change at a time.
            for change in ["echo 4 > d/f4", "mv d/f1 d/g1", "mv d/f2 d/e/f2", "rm d/f3", "mkdir d/h", "rmdir d/h", "mv d/e d/e2", "mv d/e2 d/e"] {
                try sh("ls -A \(q(b))/d \(q(b))/d/e > /dev/null; ls -A \(q(b))/d > /dev/null")
                try sh("cd \(q(a)) && \(change)")
                try await eventually("listing on B after '\(change)'", same)
            }
            #expect(try sh("ls -A \(q(b))/d | tr '\\n' ' '") == "e f4 g1 ")
            #expect(try sh("ls -A \(q(b))/d/e | tr '\\n' ' '") == "f2 ")
        }
    }

    @Test(arguments: SyncBackend.all + [.tls, .nginx]) func placeholdersHaveRealSizesAndAReadDownloadsAboutOneChunk(_ backend: SyncBackend) async throws {
        try await SyncWorld.run("big", backend) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            let size = 24 << 20
            try sh("head -c \(size) /dev/urandom > \(q(a))/big.bin")
            // A small tree of files of several sizes, three folders deep.
            try sh("mkdir -p \(q(a))/t/u/v && for i in 1 2 3; do head -c $((i * 70001)) /dev/urandom > \(q(a))/t/f$i; head -c $((i * 3001)) /dev/urandom > \(q(a))/t/u/v/g$i; done")
            try await eventually("big file listed on B", seconds: 60, "test \"$(stat -c %s \(q(b))/big.bin)\" = \(size)")
            try await eventually("tree listed on B", seconds: 30, "test -e \(q(b))/t/u/v/g3")

            let status = "python3 -c 'import os,sys; print(os.getxattr(sys.argv[1], \"user.nimbus.status\").decode())' \(q(b))/big.bin"
            #expect(try sh(status) == "cloud\n")
            let control = try sh("cat \(q(b))/.nimbus/status")
            #expect(control.contains("connection: online") && control.contains("container: docs"), "\(control)")

            // ls -l, stat, find and du --apparent-size on B show the real sizes and download nothing.
            let before = try w.chunkBytesOut()
            let lsB = try sh("cd \(q(b)) && ls -lR --time-style=+ . | awk 'NF >= 6 && $1 !~ /^d/ {print $5, $NF}'")
            let lsA = try sh("cd \(q(a)) && ls -lR --time-style=+ . | awk 'NF >= 6 && $1 !~ /^d/ {print $5, $NF}'")
            #expect(lsB == lsA && lsB.contains("\(size) big.bin") && lsB.contains("210003 f3"), "ls -lR on B:\n\(lsB)\non A:\n\(lsA)")
            let findB = try sh("cd \(q(b)) && find . -path ./.nimbus -prune -o -type f -printf '%s %p\\n' | sort")
            #expect(findB == (try sh("cd \(q(a)) && find . -path ./.nimbus -prune -o -type f -printf '%s %p\\n' | sort")))
            let duB = try sh("du -s --apparent-size -B1 \(q(b))/t | cut -f1")
            #expect(duB == (try sh("du -s --apparent-size -B1 \(q(a))/t | cut -f1")), "du --apparent-size on B: \(duB)")
            try sh("stat \(q(b))/big.bin \(q(b))/t/u/v/* > /dev/null")
            let listed = try w.chunkBytesOut() - before
            #expect(listed == 0, "listing B's tree downloaded \(listed) bytes")
            // Files of at most 64 KiB (the g's) came with their bytes in the changes page, and
            // are filled without a chunk request; the others are placeholders.
            try await eventually("small files filled from the changes page",
                                 "test \"$(cd \(q(b)) && getfattr --absolute-names -n user.nimbus.status --only-values t/u/v/g1 t/u/v/g2 t/u/v/g3)\" = currentcurrentcurrent")
            #expect(try sh("cd \(q(b)) && getfattr --absolute-names -n user.nimbus.status --only-values t/f1 big.bin; echo") == "cloudcloud\n")
            #expect(try w.chunkBytesOut() - before == 0, "the small files came without a chunk request")
            // A placeholder has no cache file until its content is needed (a first sync of
            // 100,000 items spent most of its time creating empty files): only the small files'.
            #expect(try sh("find \(q(w.base))/b-state/cache -type f -not -path '*/trash/*' | wc -l") == "3\n")
            // ... and a restart keeps the real sizes (no file is not "size 0").
            try w.crash(b)
            try w.remount("b")
            #expect(try sh("cd \(q(b)) && ls -lR --time-style=+ . | awk 'NF >= 6 && $1 !~ /^d/ {print $5, $NF}'") == lsA, "sizes on B after a restart")

            // 4 KiB from the middle: about one chunk (≤ 4 MiB; kernel read-ahead may touch a second).
            let middle = try sh("dd if=\(q(b))/big.bin bs=4096 skip=2560 count=1 2>/dev/null | md5sum")
            let expected = try sh("dd if=\(q(a))/big.bin bs=4096 skip=2560 count=1 2>/dev/null | md5sum")
            #expect(middle == expected)
            let fetched = try w.chunkBytesOut() - before
            #expect(fetched > 0 && fetched <= 8 << 20, "a 4 KiB read downloaded \(fetched) bytes")
            print("sync figures: 4 KiB read of a 24 MiB placeholder downloaded \(fetched) bytes")
            #expect(try sh(status) == "partial\n")

            // The whole file, byte for byte.
            try sh("cmp \(q(a))/big.bin \(q(b))/big.bin")

            // A copy uploads nothing (every chunk is on the server already).
            let inBefore = try w.chunkBytesIn()
            try sh("cp \(q(a))/big.bin \(q(a))/copy.bin")
            try await eventually("copy on B", seconds: 60, "test \"$(stat -c %s \(q(b))/copy.bin)\" = \(size)")
            #expect(try w.chunkBytesIn() == inBefore)

            // One byte changed in the middle uploads about one chunk, and B sees the new bytes. The
            // byte is flipped, not set: a random file holds any given byte there once in 256 runs.
            try sh("python3 -c 'import sys; f = open(sys.argv[1], \"r+b\"); f.seek(\(12 << 20)); b = f.read(1)[0]; f.seek(\(12 << 20)); f.write(bytes([b ^ 0xFF])); f.close()' \(q(a))/big.bin")
            try await eventually("edit on B", seconds: 60, "cmp \(q(a))/big.bin \(q(b))/big.bin")
            let edited = try w.chunkBytesIn() - inBefore
            #expect(edited > 0 && edited <= 8 << 20, "a 1-byte edit uploaded \(edited) bytes")
            print("sync figures: a 1-byte edit in the middle of 24 MiB uploaded \(edited) bytes")
        }
    }

    /// A 1 GiB file (sparse, with random regions) made on A: on B, 1 MiB read at 512 MiB moves
    /// about one chunk, not the file, and two programs reading one region at once share one
    /// download. (Zero runs share one chunk hash on the server, so A uploads little; B still
    /// downloads per chunk position.)
    @Test func aGigabytePlaceholderReadsOnlyWhatItNeeds() async throws {
        try await SyncWorld.run("gig", .embedded) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            let gib = 1 << 30, mib = 1 << 20
            // Random MiBs at 0, 512 MiB and 700 MiB, zeros elsewhere; written in one go, closed.
            try sh("""
                python3 -c 'import os,sys
                fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                for off in (0, 512 << 20, 700 << 20): os.pwrite(fd, os.urandom(1 << 20), off)
                os.ftruncate(fd, 1 << 30); os.close(fd)' \(q(a))/huge.bin
                """)
            try await eventually("1 GiB placeholder on B", seconds: 120, "test \"$(stat -c %s \(q(b))/huge.bin)\" = \(gib)")
            let before = try w.chunkBytesOut()
            let read = "dd if=\(q(b))/huge.bin bs=\(mib) skip=512 count=1 2>/dev/null | md5sum"
            let want = "dd if=\(q(a))/huge.bin bs=\(mib) skip=512 count=1 2>/dev/null | md5sum"
            #expect(try sh(read) == (try sh(want)))
            let one = try w.chunkBytesOut() - before
            // One chunk is at most 4 MiB; the 1 MiB may straddle two, and read-ahead may touch a third.
            #expect(one > 0 && one <= 12 * mib, "1 MiB at 512 MiB of a 1 GiB placeholder downloaded \(one) bytes")
            print("sync figures: 1 MiB read at 512 MiB of a 1 GiB placeholder downloaded \(one) bytes")

            // Two readers of the same fresh region at the same moment: one download. Measured
            // against one reader of that region alone (then evicted), so a download per reader
            // (twice the bytes) cannot pass.
            let region = "dd if=\(q(b))/huge.bin bs=\(mib) skip=700 count=1 2>/dev/null | md5sum"
            let before1 = try w.chunkBytesOut()
            _ = try sh(region)
            let single = try w.chunkBytesOut() - before1
            try sh("\(q(NimbusBinary.path)) evict \(q(b))/huge.bin")
            let before2 = try w.chunkBytesOut()
            // (Two dd processes started by python: `&` + `wait` in sh hangs under Foundation's Process.)
            try sh("""
                python3 -c 'import subprocess,sys
                ps = [subprocess.Popen(sys.argv[1], shell=True, stdout=subprocess.PIPE) for _ in range(2)]
                outs = [p.communicate()[0] for p in ps]
                sys.exit(0 if outs[0] == outs[1] and all(p.returncode == 0 for p in ps) else 1)' \(q(region))
                test "$(\(region))" = "$(dd if=\(q(a))/huge.bin bs=\(mib) skip=700 count=1 2>/dev/null | md5sum)"
                """)
            let two = try w.chunkBytesOut() - before2
            #expect(two > 0 && two <= single + single / 2, "two concurrent 1 MiB reads downloaded \(two) bytes, one reader alone \(single)")
            print("sync figures: two concurrent readers of one 1 MiB region downloaded \(two) bytes (one reader alone: \(single))")
            // The sparse cache file holds what was read (since the evict), not a gigabyte.
            let kib = Int(try sh("du -sk \(q(w.base))/b-state/cache | cut -f1").trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
            #expect(kib >= 0 && kib < 64 << 10, "B's cache holds \(kib) KiB after two 1 MiB reads")
        }
    }

    @Test func aBadTokenFailsTheMountWithAMessage() async throws {
        let w = try await SyncWorld("token")
        defer { w.cleanup() }
        let mp = w.base + "/x"
        try FileManager.default.createDirectory(atPath: mp, withIntermediateDirectories: true)
        let (status, out) = shStatus("NIMBUS_TOKEN=not-a-token \(q(NimbusBinary.path)) mount \(q(mp)) --state \(q(w.base + "/x-state")) --server \(w.server.url) --container docs")
        #expect(status != 0)
        #expect(out.contains("unauthorized") && out.contains("add-device"), "\(out)")
        #expect(shStatus("grep -qF \(q(" " + mp + " ")) /proc/self/mountinfo").0 != 0, "left a mount behind")
        let (s2, out2) = shStatus("\(q(NimbusBinary.path)) mount \(q(mp)) --state \(q(w.base + "/x-state")) --server \(w.server.url)")
        #expect(s2 != 0 && out2.contains("--container"), "\(out2)")
    }

    @Test(arguments: SyncBackend.all) func aReadFailsWithEIOWhenTheServerIsGone(_ backend: SyncBackend) async throws {
        try await SyncWorld.run("offline", backend) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("head -c \(8 << 20) /dev/urandom > \(q(a))/x.bin")
            try await eventually("file listed on B", seconds: 30, "test \"$(stat -c %s \(q(b))/x.bin)\" = \(8 << 20)")
            w.stopServer()
            let start = Date()
            let (status, out) = shStatus("dd if=\(q(b))/x.bin bs=4096 count=1 of=/dev/null 2>&1")
            let took = Date().timeIntervalSince(start)
            #expect(status != 0, "the read succeeded without a server: \(out)")
            #expect(out.contains("Input/output error"), "\(out)")
            #expect(took < 7, "the read took \(took) s (the bound is 5 s)")
            print("sync figures: read of a placeholder with the server down failed after \(took) s")
        }
    }
}
