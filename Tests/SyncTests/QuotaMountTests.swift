import Foundation
import Glibc
import NimbusTesting
import Testing

/// An account over its quota through real mounts and the built binary: nothing is lost, the mount
/// says why the file is not uploaded with the server's numbers, and once the admin raises the
/// quota the file uploads by itself and reaches the other device byte for byte (docs/sync.md
/// "What happens", docs/deploy.md "Quotas").
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct QuotaMountTests {
    @Test(arguments: SyncBackend.all) func aFileOverTheQuotaWaitsIntactAndUploadsOnceThereIsRoom(_ backend: SyncBackend) async throws {
        try await SyncWorld.run("quota", backend) { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf small > \(q(a))/small.txt")
            try await eventually("small file on B", "test \"$(cat \(q(b))/small.txt)\" = small")

            let set = try await w.admin("set-quota", ["--account", "alice", "100K"])
            let fields = set.split(separator: "\t").map(String.init)
            let usedNow = fields.first { $0.hasPrefix("used ") }.flatMap { Int64($0.dropFirst(5).split(separator: " ")[0]) } ?? -1
            let metadata = fields.first { $0.hasPrefix("metadata ") }.flatMap { Int64($0.dropFirst(9).trimmingCharacters(in: .whitespacesAndNewlines)) } ?? -1
            #expect(fields.count == 7 && fields[0] == "alice" && fields[2] == "quota 102400 (100.0 KiB)" && fields[3] == "free \(102_400 - usedNow)"
                    && fields[4] == "chunks 1" && usedNow == 5 + metadata && metadata > 0 && fields[6] == "trash 0 (0 B)\n",
                    "set-quota prints the usage, 5 bytes of content, the metadata and Recently Deleted's bytes: \(set)")

            // 3 MiB of random bytes: over the quota whatever the chunk boundaries.
            let source = w.base + "/big.src"
            try sh("head -c 3145728 /dev/urandom > \(q(source)) && cp \(q(source)) \(q(a))/big.bin")
            let attr = { (name: String) in "getfattr --absolute-names --only-values -n user.nimbus.\(name) \(q(a))/big.bin" }
            try await eventually("the item is refused for the quota", seconds: 60, "test \"$(\(attr("status")))\" = error")
            let error = try sh(attr("error"))
            #expect(error.contains("over its quota") && error.contains("of its quota of 102400 bytes") && error.contains("change is kept"),
                    "user.nimbus.error says the quota and its numbers: \(error)")
            let status = try sh("cat \(q(a))/.nimbus/status")
            #expect(status.contains("\nquota: over (uses ") && status.contains(" of 102400); 1 item(s) wait for room"), "status: \(status)")
            #expect(status.contains("sync-error: upload of ") && status.contains("of its quota of 102400 bytes"), "status: \(status)")
            #expect(try sh(attr("version")) == "none", "not on the server")
            try sh("cmp \(q(source)) \(q(a))/big.bin")  // intact here
            #expect(shStatus("test -e \(q(b))/big.bin").0 != 0, "B has no file the server refused")
            // A delete is never refused, also over the quota.
            try sh("rm \(q(a))/small.txt")
            try await eventually("delete on B while over the quota", "! test -e \(q(b))/small.txt")
            try sh("cmp \(q(source)) \(q(a))/big.bin")

            let raised = try await w.admin("set-quota", ["--account", "alice", "none"])
            #expect(raised.contains("\tquota none\tfree unlimited"), "set-quota none: \(raised)")
            // The item's back-off is a minute: it goes by itself within one more.
            try await eventually("uploaded by itself", seconds: 150, "test \"$(\(attr("status")))\" = current")
            try await eventually("on B byte for byte", seconds: 30, "cmp \(q(source)) \(q(b))/big.bin")
            try await eventually("status clear", "! grep -q '^quota:' \(q(a))/.nimbus/status && grep -q '^sync-error: none' \(q(a))/.nimbus/status")
            let usage = try await w.admin("quota", ["--account", "alice"])
            let used = usage.split(separator: "\t").first { $0.hasPrefix("used ") }.flatMap { Int($0.dropFirst(5).split(separator: " ")[0]) } ?? 0
            #expect(used >= 3_145_728, "the file counts: \(usage)")
        }
    }
}
