import Foundation
import Glibc
import Testing

@Suite("Mount: data integrity", .enabled(if: MountEnv.usable, "skipped: \(MountEnv.problem ?? "")"))
struct IntegrityMountTests {
    /// Random pwrite/pread/truncate/mmap/reopen sequences on several files, each checked byte for
    /// byte against a reference file on the native disk. Prints its seed; replay with
    /// NIMBUS_SEED=<seed>.
    @Test func randomReadWriteTruncateMatchesReference() throws {
        let seed = ProcessInfo.processInfo.environment["NIMBUS_SEED"].flatMap(Int.init) ?? Int.random(in: 1...1_000_000)
        try withMount("random") { m in
            let ref = m.base + "/ref"
            try FileManager.default.createDirectory(atPath: ref, withIntermediateDirectories: true)
            let out = try sh("""
                python3 - \(seed) \(q(m.mp)) \(q(ref)) <<'PY'
                import mmap, os, random, sys
                seed, mnt, ref = int(sys.argv[1]), sys.argv[2], sys.argv[3]
                rng = random.Random(seed)
                names = ["f%d" % i for i in range(4)]
                fds = {}
                def op_open(n):
                    for root in (mnt, ref):
                        fds[(root, n)] = os.open(os.path.join(root, n), os.O_RDWR | os.O_CREAT, 0o644)
                for n in names: op_open(n)
                for step in range(1500):
                    n = rng.choice(names); k = rng.random()
                    a, b = fds[(mnt, n)], fds[(ref, n)]
                    size = os.fstat(b).st_size
                    if k < 0.40:
                        off = rng.randrange(0, size + 200000); data = rng.randbytes(rng.choice([1, 17, 4096, 65536, 200000]))
                        assert os.pwrite(a, data, off) == os.pwrite(b, data, off) == len(data)
                    elif k < 0.70:
                        off = rng.randrange(0, size + 10); ln = rng.choice([1, 100, 4096, 131072, 500000])
                        x, y = os.pread(a, ln, off), os.pread(b, ln, off)
                        assert x == y, "step %d: read %s at %d+%d differs" % (step, n, off, ln)
                    elif k < 0.80:
                        ln = rng.randrange(0, size + 100000)
                        os.ftruncate(a, ln); os.ftruncate(b, ln)
                    elif k < 0.87 and size > 0:
                        with mmap.mmap(a, size) as mm:
                            off = rng.randrange(0, size); data = rng.randbytes(min(size - off, rng.choice([1, 4096, 10000])))
                            mm[off:off + len(data)] = data; mm.flush()
                        os.pwrite(b, data, off)
                    elif k < 0.93:
                        os.close(a); os.close(b); op_open(n)
                    elif k < 0.96:
                        os.fsync(a)
                    else:
                        assert os.fstat(a).st_size == os.fstat(b).st_size, "step %d: size of %s" % (step, n)
                for n in names:
                    os.close(fds[(mnt, n)]); os.close(fds[(ref, n)])
                    x = open(os.path.join(mnt, n), "rb").read(); y = open(os.path.join(ref, n), "rb").read()
                    assert x == y, "final content of %s differs (%d vs %d bytes)" % (n, len(x), len(y))
                print("ok")
                PY
                """, allowFailure: true)
            #expect(out.hasSuffix("ok\n"), "seed \(seed): \(out)")
            // And again after a remount (content comes from the cache files, sizes from the database).
            try m.unmount()
            try m.mount()
            try sh("set -e; for f in f0 f1 f2 f3; do cmp \(q(m.mp))/$f \(q(ref))/$f; done")
        }
    }

    /// kill -9 of the daemon: the mount turns ENOTCONN; `nimbus mount` clears it, and everything
    /// that was fsynced (files, renames, a SQLite database) is there and opens clean.
    /// A file's last close gives the kernel its partly written pages (`ContainerFS.storePages`)
    /// while the program goes on: a truncation, a rewrite or an append right after the close
    /// must never be undone by those older bytes, and a reader at once sees what was written.
    /// (The window is microseconds wide and a real mount seldom hits it: `PageStoreTests` holds
    /// a store open to prove the waits; this checks the ordinary path end to end.)
    @Test func aChangeRightAfterACloseIsNeverUndoneByThePagesItStored() throws {
        try withMount("store-race") { m in
            let out = try sh("""
                python3 - \(q(m.mp)) <<'PY'
                import os, random, sys
                mnt = sys.argv[1]
                rng = random.Random(7)
                bad = []
                for i in range(600):
                    p = os.path.join(mnt, "f%d" % (i % 7))
                    first = os.urandom(rng.randrange(1, 30000))
                    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    at = 0
                    while at < len(first):
                        n = rng.choice([1000, 4096, 10240, 3333])
                        os.write(fd, first[at:at + n]); at += n
                    os.close(fd)
                    k = rng.random()
                    if k < 0.3:
                        cut = rng.randrange(0, len(first) + 1)
                        os.truncate(p, cut); want = first[:cut]
                    elif k < 0.6:
                        want = os.urandom(rng.randrange(0, 9000))
                        fd = os.open(p, os.O_WRONLY | os.O_TRUNC); os.write(fd, want); os.close(fd)
                    elif k < 0.8:
                        more = os.urandom(rng.randrange(1, 5000))
                        fd = os.open(p, os.O_WRONLY | os.O_APPEND); os.write(fd, more); os.close(fd)
                        want = first + more
                    else:
                        want = first
                    with open(p, "rb") as f: got = f.read()
                    if got != want: bad.append("%d: %d bytes read, %d written (case %.2f)" % (i, len(got), len(want), k))
                print("bad %d %s" % (len(bad), bad[:5]))
                PY
                """)
            #expect(out.contains("bad 0 "), "\(out)")
        }
    }

    @Test func killDashNineThenRemountKeepsFsyncedData() throws {
        try withMount("kill9") { m in
            try sh("""
                set -e; cd \(q(m.mp)); mkdir -p keep/deep
                head -c 3000000 /dev/urandom > \(q(m.base))/big.ref
                cp \(q(m.base))/big.ref keep/big.bin; sync keep/big.bin
                python3 -c "
                import os
                fd = os.open('keep/deep/small', os.O_WRONLY | os.O_CREAT, 0o640); os.write(fd, b'fsynced'); os.fsync(fd); os.close(fd)
                os.rename('keep/deep/small', 'keep/deep/renamed'); d = os.open('keep/deep', os.O_RDONLY); os.fsync(d); os.close(d)
                "
                sqlite3 keep/db.sqlite 'PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (42);' > /dev/null
                setfattr -n user.k -v v keep/big.bin; sync keep/big.bin
                """)
            let pid = try m.daemonPID()
            kill(pid, SIGKILL)
            usleep(300_000)
            let (status, out) = shStatus("ls \(q(m.mp))")
            #expect(status != 0 && out.contains("not connected"), "after kill -9: \(out)")
            try m.mount()  // must clear the dead mount by itself
            try sh("""
                set -e; cd \(q(m.mp))
                cmp keep/big.bin \(q(m.base))/big.ref
                test "$(cat keep/deep/renamed)" = fsynced; test ! -e keep/deep/small
                test "$(stat -c %a keep/deep/renamed)" = 640
                test "$(sqlite3 keep/db.sqlite 'PRAGMA integrity_check')" = ok
                test "$(sqlite3 keep/db.sqlite 'SELECT x FROM t')" = 42
                test "$(getfattr --only-values -n user.k keep/big.bin)" = v
                """)
        }
    }
}
