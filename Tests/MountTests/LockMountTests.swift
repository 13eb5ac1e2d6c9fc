import Foundation
import Glibc
import NimbusTesting
import Testing

/// fcntl and flock locks on a real mount go through the daemon (they are claims, DESIGN §4
/// "Coordination") and still behave as POSIX and Linux say between local programs.
@Suite(.serialized, .enabled(if: MountEnv.usable, "needs FUSE"))
struct LockMountTests {
    /// A python3 helper for lock scenarios: `locker.py FILE` reads commands from its argv.
    static let locker = #"""
    import fcntl, os, signal, struct, sys, time
    path, cmds = sys.argv[1], sys.argv[2:]
    fd = os.open(path, os.O_RDWR)
    def mark(name): open(name, "w").close()
    def wait_for(name):
        for _ in range(2000):
            if os.path.exists(name): return
            time.sleep(0.005)
        sys.exit("timed out waiting for " + name)
    for c in cmds:
        op, _, arg = c.partition("=")
        if op == "ex": fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, *map(int, arg.split(":")))
        elif op == "exw": fcntl.lockf(fd, fcntl.LOCK_EX, *map(int, arg.split(":")))
        elif op == "flockex": fcntl.flock(fd, fcntl.LOCK_EX)
        elif op == "mark": mark(arg)
        elif op == "wait": wait_for(arg)
        elif op == "sleep": time.sleep(float(arg))
        elif op == "closeother": os.close(os.open(path, os.O_RDONLY))
        elif op == "expect-deadlock":
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX, *map(int, arg.split(":")))
                sys.exit("no EDEADLK")
            except OSError as e:
                if e.errno != 35: raise  # EDEADLK
                print("EDEADLK")
        elif op == "expect-busy":
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, *map(int, arg.split(":")))
                sys.exit("locked a held range")
            except OSError as e:
                if e.errno not in (11, 13): raise  # EAGAIN / EACCES
                print("busy")
        elif op == "getlk":
            start, length = map(int, arg.split(":"))
            res = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, start, length, 0))
            t, _, s, l, pid = struct.unpack("hhqqi", res)
            print(f"getlk type={t} start={s} len={l} pid={pid}")
        elif op == "interrupted":
            def on_alarm(*_): raise TimeoutError()
            signal.signal(signal.SIGALRM, on_alarm)
            signal.alarm(1)
            t0 = time.time()
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX, *map(int, arg.split(":")))
                sys.exit("a blocking lock on a held range was granted")
            except TimeoutError:
                print(f"interrupted after {time.time() - t0:.1f} s")
        elif op == "pid": print(f"pid={os.getpid()}")
        else: sys.exit("unknown " + op)
        sys.stdout.flush()
    """#

    func writeLocker(_ m: Mounted) throws -> String {
        let p = m.base + "/locker.py"
        try Self.locker.write(toFile: p, atomically: true, encoding: .utf8)
        return "python3 \(q(p))"
    }

    @Test func flockExcludesAndWaitsAndIsSeenByTheDaemon() throws {
        try withMount("flock") { m in
            try sh("printf data > \(q(m.mp))/f.txt")
            let locker = try writeLocker(m)
            let holder = try Background("\(locker) \(q(m.mp))/f.txt flockex mark=\(q(m.base))/held sleep=1.5")
            defer { holder.stop() }
            try sh("for i in $(seq 1 400); do test -e \(q(m.base))/held && exit 0; sleep 0.01; done; exit 1")
            // Another open file description cannot take it without waiting…
            #expect(shStatus("flock -n \(q(m.mp))/f.txt true").0 != 0)
            // …the daemon lists it with its owner…
            let claims = try sh("cat \(q(m.mp))/.nimbus/claims")
            #expect(claims.contains("held") && claims.contains("exclusive") && claims.contains("flock")
                    && claims.contains("/f.txt") && claims.contains("python3"), "\(claims)")
            // …and a blocking flock gets it once the holder's process ends.
            let started = Date()
            try sh("flock -w 10 \(q(m.mp))/f.txt true")
            #expect(Date().timeIntervalSince(started) > 0.3)
            // The lock goes with the last close (the kernel's release may trail the command).
            try sh("for i in $(seq 1 200); do test \"$(cat \(q(m.mp))/.nimbus/claims)\" = 'no claims' && exit 0; sleep 0.01; done; cat \(q(m.mp))/.nimbus/claims; exit 1")
        }
    }

    @Test func fcntlRangesConflictOnlyWhereTheyOverlap() throws {
        try withMount("fcntl") { m in
            try sh("head -c 100 /dev/zero > \(q(m.mp))/db")
            let locker = try writeLocker(m)
            let holder = try Background("\(locker) \(q(m.mp))/db pid ex=10:0 mark=\(q(m.base))/held wait=\(q(m.base))/done")
            defer { holder.stop() }
            try sh("for i in $(seq 1 400); do test -e \(q(m.base))/held && exit 0; sleep 0.01; done; exit 1")
            let pid = holder.output.split(separator: "\n").first { $0.hasPrefix("pid=") }.map { String($0.dropFirst(4)) } ?? "?"
            // Bytes 0..<10 are held exclusively (lockf(fd, EX, 10, 0) locks 10 bytes from 0).
            #expect(try sh("\(locker) \(q(m.mp))/db expect-busy=5:0").contains("busy"))
            #expect(shStatus("\(locker) \(q(m.mp))/db ex=10:10").0 == 0, "a lock on bytes 10..<20 must not conflict")
            let getlk = try sh("\(locker) \(q(m.mp))/db getlk=0:0")
            #expect(getlk.contains("type=1") && getlk.contains("start=0") && getlk.contains("len=10") && getlk.contains("pid=\(pid)"), "\(getlk) (holder \(pid))")
            // A blocking request interrupted by a signal returns, it does not hang.
            let interrupted = try sh("\(locker) \(q(m.mp))/db interrupted=5:0")
            #expect(interrupted.contains("interrupted after 1."), "\(interrupted)")
            try sh("touch \(q(m.base))/done")
            holder.wait()
            #expect(shStatus("\(locker) \(q(m.mp))/db ex=10:0").0 == 0, "the holder's exit released its lock")
        }
    }

    @Test func aCloseReleasesTheProcessesPOSIXLocksAndDeadlocksAreRefused() throws {
        try withMount("deadlock") { m in
            try sh("head -c 100 /dev/zero > \(q(m.mp))/db")
            let locker = try writeLocker(m)
            // POSIX: closing ANY descriptor of the file drops the process's locks on it.
            let closer = try Background("\(locker) \(q(m.mp))/db ex=10:0 closeother mark=\(q(m.base))/closed wait=\(q(m.base))/end")
            defer { closer.stop() }
            try sh("for i in $(seq 1 400); do test -e \(q(m.base))/closed && exit 0; sleep 0.01; done; exit 1")
            #expect(shStatus("\(locker) \(q(m.mp))/db ex=10:0").0 == 0, "the lock survived a close of another descriptor")
            try sh("touch \(q(m.base))/end")
            closer.wait()

            // P1 holds 0..<1 and waits for 1..<2; P2 holds 1..<2 and asks for 0..<1: EDEADLK.
            let p1 = try Background("\(locker) \(q(m.mp))/db ex=1:0 mark=\(q(m.base))/p1 wait=\(q(m.base))/p2 exw=1:1 mark=\(q(m.base))/p1done")
            defer { p1.stop() }
            let p2 = try sh("""
                \(locker) \(q(m.mp))/db wait=\(q(m.base))/p1 ex=1:1 mark=\(q(m.base))/p2 sleep=0.5 expect-deadlock=1:0
                """)
            #expect(p2.contains("EDEADLK"), "\(p2)")
            // P2 has exited (its lock went with it): P1's wait is granted.
            try sh("for i in $(seq 1 500); do test -e \(q(m.base))/p1done && exit 0; sleep 0.01; done; exit 1")
            p1.wait()
        }
    }

    @Test func twoSQLiteWritersKeepTheDatabaseWhole() throws {
        try withMount("sqlite-locks") { m in
            try sh("cd \(q(m.mp)) && sqlite3 shared.db 'CREATE TABLE t(w INTEGER, i INTEGER)'")
            // Two processes insert concurrently; SQLite coordinates them with fcntl locks on the mount.
            try sh("""
                cd \(q(m.mp))
                python3 - <<'PY'
                import sqlite3, multiprocessing
                def writer(w):
                    db = sqlite3.connect("shared.db", timeout=30)
                    for i in range(100):
                        with db:
                            db.execute("INSERT INTO t VALUES (?, ?)", (w, i))
                    db.close()
                ps = [multiprocessing.Process(target=writer, args=(w,)) for w in (1, 2)]
                [p.start() for p in ps]; [p.join() for p in ps]
                assert all(p.exitcode == 0 for p in ps), [p.exitcode for p in ps]
                PY
                test "$(sqlite3 shared.db 'SELECT count(*) FROM t')" = 200
                test "$(sqlite3 shared.db 'PRAGMA integrity_check')" = ok
                """)
        }
    }
}
