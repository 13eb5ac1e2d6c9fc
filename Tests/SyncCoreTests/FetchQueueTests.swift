import SyncCore
import Testing

/// The downloader's schedule (FetchQueue.swift).
@Suite struct FetchQueueTests {
    typealias Q = FetchQueue<String, String, Int>

    @Test func readsGoFirstAtMostTheLimitAtOnceEachKeyOnce() {
        var q = Q()
        #expect(q.want("prefetch", priority: 2, waiter: nil) { "prefetch" })
        #expect(q.want("pin", priority: 1, waiter: nil) { "pin" })
        #expect(q.want("read", priority: 0, waiter: 1) { "read" })
        #expect(!q.want("read", priority: 2, waiter: nil) { "read again" }, "a prefetch of a key asked for queues nothing")
        let first = q.next(limit: 2, refuse: false)
        #expect(first.start.map(\.fetch) == ["read", "pin"] && q.active == 2)
        #expect(!q.want("read", priority: 0, waiter: 2) { "read" }, "under way: a second reader only waits")
        #expect(q.next(limit: 2, refuse: false).start.isEmpty, "no slot free")
        #expect(q.ended("read") == [1, 2] && q.active == 1)
        #expect(q.next(limit: 2, refuse: false).start.map(\.fetch) == ["prefetch"])
        #expect(q.count == 2)
    }

    @Test func aHigherPriorityAsksAgainAndTheStaleEntryIsSkipped() {
        var q = Q()
        _ = q.want("k", priority: 2, waiter: nil) { "prefetch" }
        #expect(q.want("k", priority: 0, waiter: 7) { "read" })
        let n = q.next(limit: 8, refuse: false)
        #expect(n.start.map(\.fetch) == ["read"], "fetched once, at the read's priority")
        #expect(q.ended("k") == [7] && q.count == 0 && q.active == 0)
    }

    @Test func offlineEveryQueuedKeyFailsAtOnce() {
        var q = Q()
        _ = q.want("a", priority: 0, waiter: 1)  { "a" }
        _ = q.want("b", priority: 1, waiter: nil) { "b" }
        let n = q.next(limit: 8, refuse: true)
        #expect(n.start.isEmpty && n.fail == [[1], []] && q.count == 0)
    }

    @Test func unwaitedKeysOfAnItemCanBeDropped() {
        var q = Q()
        _ = q.want("x1", priority: 2, waiter: nil) { "x1" }
        _ = q.want("x2", priority: 0, waiter: 3) { "x2" }
        _ = q.want("y1", priority: 2, waiter: nil) { "y1" }
        q.dropUnwaited { $0.hasPrefix("x") }
        #expect(q.contains { $0 == "x2" } && !q.contains { $0 == "x1" } && q.contains { $0 == "y1" })
        #expect(q.next(limit: 8, refuse: false).start.map(\.fetch) == ["x2", "y1"], "the dropped one's entry is skipped")
    }
}
