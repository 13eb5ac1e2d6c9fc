import Foundation
import Testing

/// What a fixed workload costs in FUSE requests, counted by the mount itself (`.nimbus/requests`),
/// not timed: a change that adds a request per file (a lookup the kernel could have cached, a
/// getxattr per write, an open that drops the page cache) fails here with the counts, whatever
/// the machine's speed.
@Suite("Mount: requests per operation", .enabled(if: MountEnv.usable, "skipped: \(MountEnv.problem ?? "")"))
struct RequestBudgetTests {
    static let files = 200

    /// The mount's counts by kind.
    static func counts(_ m: Mounted) throws -> [String: Int] {
        var out: [String: Int] = [:]
        for line in try sh("cat \(q(m.mp))/.nimbus/requests").split(separator: "\n") {
            let parts = line.split(separator: " ")
            guard parts.count == 2, let n = Int(parts[1]) else { throw CommandFailed(description: "bad line in .nimbus/requests: \(line)") }
            out[String(parts[0])] = n
        }
        return out
    }

    /// Runs `script` in the mount and returns the requests it cost, by kind (zero counts left out).
    /// The reads of `.nimbus/requests` around it cost a few requests of their own, the same every time.
    static func cost(_ m: Mounted, _ script: String) throws -> [String: Int] {
        let before = try counts(m)
        try sh("set -e; cd \(q(m.mp)); \(script)")
        let after = try counts(m)
        return after.compactMapValues { $0 }.reduce(into: [:]) { d, kv in
            let n = kv.value - (before[kv.key] ?? 0)
            if n > 0 { d[kv.key] = n }
        }
    }

    /// Every kind within its budget (kinds not named: at most `other` each).
    static func check(_ what: String, _ cost: [String: Int], _ budget: [String: Int], other: Int) {
        for (kind, n) in cost.sorted(by: { $0.key < $1.key }) {
            let limit = budget[kind] ?? other
            #expect(n <= limit, "\(what): \(n) \(kind) requests, budget \(limit); all: \(cost.sorted { $0.key < $1.key })")
        }
    }

    @Test func smallFilesCostAFixedNumberOfRequestsEach() throws {
        try withMount("budget") { m in
            let n = Self.files
            try sh("mkdir \(q(m.mp))/small")
            let create = try Self.cost(m, "cd small; for i in $(seq 1 \(n)); do echo $i > f$i; done")
            let stat = try Self.cost(m, "stat -c %s small/* > /dev/null")
            let list = try Self.cost(m, "ls -l small > /dev/null")
            let read = try Self.cost(m, "cat small/* > /dev/null")
            let remove = try Self.cost(m, "rm -r small")
            for (what, cost) in [("create", create), ("stat", stat), ("ls -l", list), ("cat", read), ("rm -r", remove)] {
                print("requests of \(what) for \(n) files: \(cost.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))")
            }
            // Per file, what the kernel must ask: a create is a negative lookup, the create, one
            // write with its security.capability check, the shell's two closes (flush) and one
            // release, and one getattr after the write (write-through). A stat after readdirplus
            // asks nothing; `ls -l` asks two xattrs per file (an ACL and a label); cat asks open,
            // flush and release, and no read (the last close after the write gave the kernel the
            // file's partly written page); rm asks an unlink (and a forget) per file. The reads
            // of `.nimbus/requests` around each step cost a few requests: `slack`.
            let slack = 5
            Self.check("create", create, ["lookup": n + slack, "create": n, "write": n + slack, "getxattr": n + slack,
                                          "flush": 2 * n + slack, "release": n + slack, "getattr": n + slack], other: slack)
            Self.check("stat", stat, [:], other: slack)
            Self.check("ls -l", list, ["getxattr": 2 * n + slack], other: slack)
            Self.check("cat", read, ["open": n + slack, "read": slack, "flush": n + slack, "release": n + slack], other: slack)
            Self.check("rm -r", remove, ["unlink": n, "forget": n + slack, "getattr": n + slack], other: slack)
        }
    }

    /// The daemon's system calls during `script`, by name (`strace -c -f` attached to it), and
    /// the FUSE requests it answered meanwhile.
    static func syscalls(_ m: Mounted, _ script: String) throws -> (calls: [String: Int], requests: Int) {
        let pid = try m.daemonPID()
        let out = m.base + "/strace.txt"
        try sh("strace -c -f -q -p \(pid) -o \(q(out)) > /dev/null 2>&1 & echo $! > \(q(m.base))/strace.pid")
        defer { _ = shStatus("kill -INT $(cat \(q(m.base))/strace.pid) 2>/dev/null") }
        // Attached once every thread of the daemon has a tracer.
        try sh("for i in $(seq 1 100); do grep -q '^TracerPid:[[:space:]]*0$' /proc/\(pid)/task/*/status || exit 0; sleep 0.05; done; echo 'strace did not attach' >&2; exit 1")
        let cost = try Self.cost(m, script)
        try sh("kill -INT $(cat \(q(m.base))/strace.pid); for i in $(seq 1 100); do test -s \(q(out)) && grep -q total \(q(out)) && exit 0; sleep 0.05; done; exit 1")
        var calls: [String: Int] = [:]
        for line in try sh("cat \(q(out))").split(separator: "\n") {
            let f = line.split(separator: " ")
            // "% time  seconds  usecs/call  calls  [errors]  syscall"
            guard f.count >= 5, let n = Int(f[3]), let name = f.last, name != "total" else { continue }
            calls[String(name)] = n
        }
        return (calls, cost.values.reduce(0, +))
    }

    /// What the daemon asks of the kernel per FUSE request and per file, counted: a change that
    /// adds a system call to every create, stat, read or remove (a `/dev/urandom` open per new id,
    /// a second open of a cache file, a `/proc` read per request) fails here with the counts.
    /// Waits and wake-ups (futex, epoll), memory mapping and SQLite's own I/O depend on timing
    /// and batching, not on the operation: they are left out.
    /// strace is installed and may attach to a process that is not its child (a container
    /// without CAP_SYS_PTRACE under Yama's ptrace_scope 1 may not).
    static let canTrace = shStatus("command -v strace >/dev/null && { sleep 0.2 & strace -q -p $! -o /dev/null 2>/dev/null; }").0 == 0

    @Test(.enabled(if: canTrace, "needs strace, allowed to attach to the daemon (scripts/setup installs it)"))
    func theDaemonMakesAFixedNumberOfSystemCallsPerRequest() throws {
        try withMount("syscalls") { m in
            let n = Self.files
            try sh("mkdir \(q(m.mp))/small")
            let (calls, requests) = try Self.syscalls(m, """
                cd small; for i in $(seq 1 \(n)); do echo $i > f$i; done; cd ..
                stat -c %s small/* > /dev/null; ls -l small > /dev/null; cat small/* > /dev/null; rm -r small
                """)
            let summary = calls.sorted { $0.value > $1.value }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
            print("system calls for \(requests) requests (\(n) files created, stat, listed, read, removed): \(summary)")
            // Each request is one read of /dev/fuse and one reply (writev). Per file the daemon
            // opens its cache file twice (create, cat) and closes it as often, reads it once at
            // its last close and gives the kernel its partly written page (a writev), and renames
            // it out of the way and unlinks it once each; a cache folder is made the first time a
            // file's id falls in it (an open that failed first).
            let made = calls["mkdir"] ?? 0
            let budget: [String: Int] = ["read": requests + 30, "writev": requests + n + 10, "mkdir": n + 5,
                                         "openat": 2 * n + made + 10, "close": 2 * n + 10, "rename": n + 5, "unlink": n + 5]
            for (name, limit) in budget.sorted(by: { $0.key < $1.key }) {
                #expect(calls[name] ?? 0 <= limit, "\(name): \(calls[name] ?? 0) calls, budget \(limit) (\(n) files, \(requests) requests); all: \(summary)")
            }
            let timing: Set<String> = ["futex", "epoll_wait", "epoll_ctl", "madvise", "mprotect", "mmap", "munmap", "brk", "restart_syscall",
                                       "pwrite64", "pread64", "fcntl", "fdatasync", "fsync", "nanosleep", "clock_nanosleep",
                                       // a new worker thread of libfuse or of the runtime's pool
                                       "clone3", "set_robust_list", "rseq", "gettid", "rt_sigprocmask", "sigaltstack", "prctl"]
            for (name, count) in calls.sorted(by: { $0.key < $1.key }) where budget[name] == nil && !timing.contains(name) {
                #expect(count <= 30, "\(name): \(count) calls (\(n) files, \(requests) requests), none expected per file or request; all: \(summary)")
            }
        }
    }

    /// A file just written and fsynced is read back from the kernel's page cache: its pages stay
    /// when the kernel sees the new size and time (no `auto_inval_data`), and a second open keeps
    /// them (`keep_cache`): no read request reaches the daemon.
    @Test func aFileJustWrittenIsReadFromThePageCache() throws {
        try withMount("pages") { m in
            _ = try Self.cost(m, "dd if=/dev/urandom of=big bs=1M count=8 conv=fsync status=none")
            let first = try Self.cost(m, "cat big > /dev/null")
            let again = try Self.cost(m, "cat big > /dev/null")
            print("requests of reading 8 MiB just written: \(first.sorted { $0.key < $1.key }), again: \(again.sorted { $0.key < $1.key })")
            Self.check("first read", first, [:], other: 5)
            Self.check("second read", again, [:], other: 5)
        }
    }

    /// A folder listed once is listed again from the kernel's cache (`FOPEN_CACHE_DIR`): a second
    /// `find`, `du` or `ls` of an unchanged tree sends no readdir; a change through the kernel
    /// resets the folder's cached listing, so the next listing shows it.
    @Test func aTreeListedAgainIsServedFromTheKernel() throws {
        try withMount("listing") { m in
            try sh("cd \(q(m.mp)) && mkdir -p t/a/b t/c && for d in t t/a t/a/b t/c; do for i in $(seq 1 30); do echo $i > $d/f$i; done; done")
            let first = try Self.cost(m, "find t > /dev/null")
            let again = try Self.cost(m, "find t > /dev/null; du -s t > /dev/null; ls -l t/a > /dev/null")
            print("requests of listing a tree of 4 folders: \(first.sorted { $0.key < $1.key }), again: \(again.sorted { $0.key < $1.key })")
            #expect((first["readdirplus"] ?? 0) + (first["readdir"] ?? 0) >= 4, "the first listing reaches the daemon: \(first)")
            Self.check("listed again", again, ["readdirplus": 0, "readdir": 0, "opendir": 12, "releasedir": 12, "getxattr": 70], other: 5)
            // Changes through the kernel are in the next listing.
            try sh("cd \(q(m.mp)) && touch t/a/new && rm t/c/f1 && mv t/a/f2 t/c/moved")
            let inA = try sh("ls \(q(m.mp))/t/a").split(separator: "\n"), inC = try sh("ls \(q(m.mp))/t/c").split(separator: "\n")
            #expect(inA.contains("new") && !inA.contains("f2") && inA.count == 31, "t/a after the changes: \(inA)")
            #expect(inC.contains("moved") && !inC.contains("f1") && inC.count == 30, "t/c after the changes: \(inC)")
        }
    }
}
