import Foundation
import Glibc
import NimbusTesting
import Testing

/// `.nimbus/events` and `nimbus watch` (docs/mount.md "Events"): `tail -f` on B shows A's
/// changes as they arrive, every line with an increasing sequence number and the current path.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct EventsTests {
    /// The sequence numbers of event lines, in order.
    static func sequences(_ text: String) -> [UInt64] {
        text.split(separator: "\n").compactMap { UInt64($0.split(separator: " ").first ?? "") }
    }

    @Test func tailFOnBShowsAsChanges() async throws {
        try await SyncWorld.run("events") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            let tail = try Background("exec tail -f \(q(b))/.nimbus/events")
            defer { tail.stop() }
            let watch = try Background("exec \(q(NimbusBinary.path)) watch \(q(b))/docs --count 3")
            defer { watch.stop() }
            try await Task.sleep(for: .milliseconds(500))  // both are following

            try sh("mkdir \(q(a))/docs && printf one > \(q(a))/docs/f.txt")
            try await eventually("create on B's events", "grep -q 'created remote /docs/f.txt' \(q(b))/.nimbus/events")
            try sh("printf two > \(q(a))/docs/f.txt && mv \(q(a))/docs/f.txt \(q(a))/docs/g.txt")
            try await eventually("move on B", "grep -q 'moved remote /docs/f.txt -> /docs/g.txt' \(q(b))/.nimbus/events")
            try sh("cat \(q(b))/docs/g.txt > /dev/null && rm \(q(a))/docs/g.txt")
            try await eventually("delete on B", "grep -q 'deleted remote /docs/g.txt' \(q(b))/.nimbus/events")

            // tail -f saw them as they came, in order, with increasing sequence numbers.
            // tail -f polls a FUSE file once a second: wait (bounded) until it printed the last one.
            let deadline = ContinuousClock.now + .seconds(10)
            while !tail.output.contains("deleted remote /docs/g.txt") && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(100))
            }
            let followed = tail.output
            // A small file's bytes come with the change (`inline`): downloaded as it arrives.
            for needle in ["created remote /docs/f.txt", "downloaded sync /docs/f.txt", "version remote /docs/",
                           "moved remote /docs/f.txt -> /docs/g.txt", "deleted remote /docs/g.txt"] {
                #expect(followed.contains(needle), "tail -f did not show \(needle):\n\(followed)")
            }
            let seqs = Self.sequences(followed)
            #expect(!seqs.isEmpty && seqs == seqs.sorted() && Set(seqs).count == seqs.count, "\(seqs)")
            // nimbus watch PATH shows only events under it.
            watch.wait()
            let watched = watch.output.split(separator: "\n")
            #expect(watched.count == 3 && watched.allSatisfy { $0.contains("/docs") }, "\(watch.output)")

            // A's own log: local changes, then the uploads.
            let mine = try sh("cat \(q(a))/.nimbus/events")
            #expect(mine.contains("created local /docs/f.txt") && mine.contains("uploaded sync /docs/f.txt")
                    && mine.contains("moved local /docs/f.txt -> /docs/g.txt") && mine.contains("deleted local /docs/g.txt"), "\(mine)")
            // One save (open O_TRUNC, write, close) is one event, not one per step.
            #expect(mine.components(separatedBy: "changed local /docs/f.txt").count - 1 == 1, "\(mine)")

            // Sequence numbers go on after a remount (the followers let go of B first).
            tail.stop()
            watch.stop()
            let last = Self.sequences(try sh("cat \(q(b))/.nimbus/events")).last ?? 0
            try sh("\(q(NimbusBinary.path)) unmount \(q(b))")
            try w.remount("b")
            try sh("printf three > \(q(a))/h.txt")
            try await eventually("event after remount", "grep -q 'created remote /h.txt' \(q(b))/.nimbus/events")
            let after = Self.sequences(try sh("cat \(q(b))/.nimbus/events"))
            #expect(after.first.map { $0 > last } == true, "after remount \(after) follows \(last)")

            // And after kill -9 (no clean unmount to save the next number): never a number twice.
            let beforeCrash = Self.sequences(try sh("cat \(q(b))/.nimbus/events")).last ?? 0
            try w.crash(b)
            try w.remount("b")
            try sh("printf four > \(q(a))/i.txt")
            try await eventually("event after kill -9", "grep -q 'created remote /i.txt' \(q(b))/.nimbus/events")
            let afterCrash = Self.sequences(try sh("cat \(q(b))/.nimbus/events"))
            #expect(afterCrash.first.map { $0 > beforeCrash } == true, "after kill -9 \(afterCrash) follows \(beforeCrash)")
        }
    }
}
