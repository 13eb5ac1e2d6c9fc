import Foundation
import Glibc
import NimbusTesting
import Testing

/// A remote version replacing a file that programs have open here (docs/sync.md "Open files and
/// remote versions"): readers keep reading the old bytes until they reopen — never a mix, never
/// holes read as zeros — and a file open for writing is not replaced until the writer is done.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct ReplaceTests {
    /// Opens PATH, reads HALF bytes, announces it, waits for GO, reads the rest through the same
    /// descriptor, then reads the file again through a new one. Prints what each read saw.
    static let reader = #"""
    import os, sys, time
    path, half, marker, go = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    fd = os.open(path, os.O_RDONLY)
    first = os.pread(fd, half, 0)
    open(marker, "w").close()
    while not os.path.exists(go): time.sleep(0.02)
    out = []
    try:
        rest, off = b"", half
        while True:
            piece = os.pread(fd, 1 << 20, off)
            if not piece: break
            rest += piece; off += len(piece)
        out.append("old:" + "".join(sorted(set(chr(b) for b in first + rest))) + ":%d" % (len(first) + len(rest)))
    except OSError as e:
        out.append("old:errno%d" % e.errno)
    try:
        again = os.pread(fd, half, 0)
        out.append("again:" + "".join(sorted(set(chr(b) for b in again))))
    except OSError as e:
        out.append("again:errno%d" % e.errno)
    os.close(fd)
    with open(path, "rb") as f: new = f.read()
    out.append("new:" + "".join(sorted(set(chr(b) if b else "0" for b in new))) + ":%d" % len(new))
    if 0 in new: out.append("zeros-from:%d" % new.index(0))
    print(" ".join(out))
    """#

    static func version(_ path: String) -> String {
        shStatus("getfattr --absolute-names --only-values -n user.nimbus.version \(q(path))").1
    }

    @Test func readersKeepTheOldBytesAndWritersKeepTheirFile() async throws {
        try await SyncWorld.run("replace") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try Self.reader.write(toFile: w.base + "/reader.py", atomically: true, encoding: .utf8)
            let mib = 1 << 20

            // 1. A fully downloaded file: the reader sees only old bytes, then the new ones.
            try sh("python3 -c 'import sys; open(sys.argv[1], \"wb\").write(b\"a\" * (8 << 20))' \(q(a))/f.bin")
            try await eventually("f on B", seconds: 30, "test \"$(stat -c %s \(q(b))/f.bin)\" = \(8 * mib)")
            try sh("cat \(q(b))/f.bin > /dev/null")
            let v1 = Self.version(b + "/f.bin")
            let r1 = try Background("python3 \(q(w.base))/reader.py \(q(b))/f.bin \(4 * mib) \(q(w.base))/half1 \(q(w.base))/go1")
            defer { r1.stop() }
            try await eventually("reader 1 half way", "test -e \(q(w.base))/half1")
            try sh("python3 -c 'import sys; open(sys.argv[1], \"wb\").write(b\"b\" * (6 << 20))' \(q(a))/f.bin")
            try await eventually("new version on B", seconds: 30, "test \"$(getfattr --absolute-names --only-values -n user.nimbus.version \(q(b))/f.bin)\" != \(q(v1))")
            try sh("touch \(q(w.base))/go1")
            r1.wait()
            // Only old bytes through the old descriptor (the kernel may end it at the new size:
            // one inode per path), only new ones after reopening.
            #expect(r1.output.contains("old:a:") && r1.output.contains(" again:a new:b:\(6 * mib)"), "\(r1.output)")

            // 2. A partly downloaded file: what was here reads old; the rest fails (EIO), never
            //    zeros or new bytes.
            try sh("python3 -c 'import sys; open(sys.argv[1], \"wb\").write(b\"c\" * (24 << 20))' \(q(a))/g.bin")
            try await eventually("g on B", seconds: 30, "test \"$(stat -c %s \(q(b))/g.bin)\" = \(24 * mib)")
            let v2 = Self.version(b + "/g.bin")
            let r2 = try Background("python3 \(q(w.base))/reader.py \(q(b))/g.bin 65536 \(q(w.base))/half2 \(q(w.base))/go2")
            defer { r2.stop() }
            try await eventually("reader 2 half way", "test -e \(q(w.base))/half2")
            try sh("python3 -c 'import sys; open(sys.argv[1], \"wb\").write(b\"d\" * (2 << 20))' \(q(a))/g.bin")
            try await eventually("new version of g on B", seconds: 30, "test \"$(getfattr --absolute-names --only-values -n user.nimbus.version \(q(b))/g.bin)\" != \(q(v2))")
            try sh("touch \(q(w.base))/go2")
            r2.wait()
            #expect(r2.output.contains("old:errno5 again:c new:d:\(2 * mib)"), "\(r2.output)")

            // 3. Open for writing here (no write yet): the new version waits, then arrives.
            try sh("printf one > \(q(a))/h.txt")
            try await eventually("h on B", "test \"$(cat \(q(b))/h.txt)\" = one")
            let holder = try Background("exec 3>> \(q(b))/h.txt; touch \(q(w.base))/open3; exec sleep 4")
            defer { holder.stop() }
            try await eventually("writer open on B", "test -e \(q(w.base))/open3")
            try sh("printf two > \(q(a))/h.txt")
            try await eventually("the new version waits on B", "test \"$(getfattr --absolute-names --only-values -n user.nimbus.status \(q(b))/h.txt)\" = downloaded")
            #expect(try sh("cat \(q(b))/h.txt") == "one", "not replaced under an open writer")
            holder.wait()
            try await eventually("the waiting version after the writer closed", "test \"$(cat \(q(b))/h.txt)\" = two")
        }
    }
}
