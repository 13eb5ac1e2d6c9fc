import NimbusCore
import SyncCore
import Testing

/// `InlineChunks`: bytes that came with a changes page, each given out once, the oldest dropped
/// beyond the limit.
@Suite struct InlineChunksTests {
    /// A distinct hash per name (the store does not check bytes against it).
    static func hash(_ s: String) -> ContentHash { ContentHash(digest: Array(s.utf8) + [UInt8](repeating: 0, count: 32 - s.utf8.count)) }

    @Test func bytesAreGivenOutOnceAndTheOldestGoBeyondTheLimit() {
        var c = InlineChunks(limit: 10)
        c.add(Self.hash("a"), [1, 2, 3, 4])
        c.add(Self.hash("b"), [5, 6, 7, 8])
        #expect(c.total == 8 && c.count == 2)
        c.add(Self.hash("c"), [9, 9, 9, 9])  // 12 > 10: "a" goes
        #expect(!c.holds(Self.hash("a")) && c.holds(Self.hash("b")) && c.holds(Self.hash("c")))
        #expect(c.take(Self.hash("b")) == [5, 6, 7, 8])
        #expect(c.take(Self.hash("b")) == nil, "given out once")
        #expect(c.total == 4)
        c.add(Self.hash("big"), [UInt8](repeating: 0, count: 11))  // larger than the limit: not kept
        #expect(!c.holds(Self.hash("big")) && c.holds(Self.hash("c")))
        c.add(Self.hash("c"), [1])  // already held: kept as it was
        #expect(c.take(Self.hash("c")) == [9, 9, 9, 9])
        #expect(c.total == 0 && c.count == 0)
    }
}
