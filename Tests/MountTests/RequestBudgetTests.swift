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
            // one read, flush and release; rm asks an unlink (and a forget) per file. The reads
            // of `.nimbus/requests` around each step cost a few requests: `slack`.
            let slack = 5
            Self.check("create", create, ["lookup": n + slack, "create": n, "write": n + slack, "getxattr": n + slack,
                                          "flush": 2 * n + slack, "release": n + slack, "getattr": n + slack], other: slack)
            Self.check("stat", stat, [:], other: slack)
            Self.check("ls -l", list, ["getxattr": 2 * n + slack], other: slack)
            Self.check("cat", read, ["open": n + slack, "read": n + slack, "flush": n + slack, "release": n + slack], other: slack)
            Self.check("rm -r", remove, ["unlink": n, "forget": n + slack, "getattr": n + slack], other: slack)
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
}
