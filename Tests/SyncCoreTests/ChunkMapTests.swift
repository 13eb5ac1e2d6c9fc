import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

/// Reading an old version: which chunks a range needs, which comes next, what is held.
@Suite struct ChunkMapTests {
    static let map = ChunkMap(BaseTests().record([10, 20, 30]).chunks)  // [0,10) [10,30) [30,60)

    @Test func aRangeNeedsTheChunksOverItAndTheNextIsReadAhead() {
        let m = Self.map
        #expect(m.size == 60 && m.count == 3)
        #expect(m.covering(9..<11) == 0..<2 && m.covering(60..<70).isEmpty && m.covering(-5..<1) == 0..<1)
        #expect(m.readAhead(after: 0..<2) == [2] && m.readAhead(after: 1..<3).isEmpty && m.readAhead(after: 0..<0).isEmpty)
        #expect(m.part(of: 1, in: 12..<40) == 2..<20 && m.part(of: 2, in: 12..<40) == 0..<10 && m.part(of: 0, in: 0..<100) == 0..<10)
        #expect(ChunkMap([]).covering(0..<10).isEmpty && ChunkMap([]).size == 0)
    }

    @Test func eachChunkIsFetchedOnceAndTheLastFewAreHeld() {
        var h = HeldChunks<Int>(kept: 2)
        guard case .fetch = h.ask(0, 100) else { Issue.record("first ask fetches"); return }
        guard case .joined = h.ask(0, 101) else { Issue.record("a second reader joins"); return }
        #expect(h.ended(0, bytes: [1]) == [100, 101])
        guard case .held(let b) = h.ask(0, 102), b == [1] else { Issue.record("held"); return }
        #expect(h.ended(0, bytes: nil).isEmpty, "nobody waits")
        guard case .fetch = h.ask(1, 103) else { Issue.record("fetch 1"); return }
        #expect(h.ended(1, bytes: nil) == [103])  // failed: not held
        #expect(h.heldIndices == [0])
        _ = h.ask(1, 104); _ = h.ended(1, bytes: [2])
        _ = h.ask(2, 105); _ = h.ended(2, bytes: [3])
        #expect(h.heldIndices == [1, 2], "at most two held, least recently used goes")
        guard case .held = h.ask(1, 106) else { Issue.record("1 held"); return }
        _ = h.ask(3, 107); _ = h.ended(3, bytes: [4])
        #expect(h.heldIndices == [1, 3])
    }
}
