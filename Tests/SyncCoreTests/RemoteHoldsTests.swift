import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

@Suite struct RemoteHoldsTests {
    static let id = ItemID(UUID())
    static let device = DeviceID(UUID())

    static func v(_ version: Int64) -> ServerItem {
        let state = ItemState(kind: .file, location: ItemLocation(parent: .root, name: ItemName(trusted: "f.txt")),
                              mode: 0o644, modified: 0, modifiedBy: device)
        return ServerItem(id: id, version: version, state: state, conflicts: 0)
    }

    /// (held for a lock, held for a writer, version shown, status says `downloaded`)
    @Test(arguments: [
        (Int64?.none, Int64?.none, Int64(3), false),
        (5, nil, 3, true),
        (nil, 5, 3, true),
        (3, 3, 3, false),
        (2, nil, 3, false),
        (nil, 9, -1, true),
    ] as [(Int64?, Int64?, Int64, Bool)])
    func aNewerVersionWaits(_ lock: Int64?, _ writer: Int64?, _ shown: Int64, _ waits: Bool) {
        var h = RemoteHolds()
        if let lock { _ = h.holdForLock(Self.v(lock)) }
        if let writer { h.holdForWriter(Self.v(writer)) }
        #expect(h.waitsNewer(than: shown) == waits)
    }

    @Test func aWriterHoldKeepsTheNewest() {
        var h = RemoteHolds()
        h.holdForWriter(Self.v(5))
        h.holdForWriter(Self.v(4))
        #expect(h.forWriter?.version == 5)
        h.holdForWriter(Self.v(7))
        #expect(h.forWriter?.version == 7)
    }

    @Test func shownVersionsLetTheirHoldsGo() {
        var h = RemoteHolds()
        let first = h.holdForLock(Self.v(4)), second = h.holdForLock(Self.v(4))
        #expect(first && !second, "the first hold for a lock says so")
        h.holdForWriter(Self.v(6))
        h.skip(Self.v(2))
        h.drop(upTo: 5)
        #expect(h.forLock == nil && h.forWriter?.version == 6)
        #expect(h.skipped?.version == 2, "skipped states are let go by the apply that shows them, not by a version")
        h.drop(upTo: 6)
        #expect(h.forWriter == nil && !h.isEmpty)
        h.skippedShown()
        #expect(h.isEmpty)
        h.holdForWriter(Self.v(8))
        #expect(h.takeForWriter()?.version == 8 && h.takeForWriter() == nil && h.isEmpty)
    }

    @Test func aRecordWithAHeldStateIsKept() {
        let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))
        var item = SyncItem<T>()
        #expect(item.isIdle(at: .s(0), rules: rules))
        item.remote.skip(Self.v(1))
        #expect(!item.isIdle(at: .s(1000), rules: rules))
    }
}

extension RemoteHoldsTests {
    /// (held for a writer, skipped, the answer's version) → (writer hold left, skipped left)
    @Test(arguments: [
        (Int64?.some(3), Int64?.some(2), Int64(5), Int64?.none, Int64?.none),
        (7, 5, 5, 7, 5),  // the answer itself waiting to be shown stays
        (nil, 9, 5, nil, 9),
    ] as [(Int64?, Int64?, Int64, Int64?, Int64?)])
    func aCommitsAnswerSupersedesOlderHolds(_ writer: Int64?, _ skipped: Int64?, _ answer: Int64, _ writerLeft: Int64?, _ skippedLeft: Int64?) {
        var h = RemoteHolds()
        if let writer { h.holdForWriter(Self.v(writer)) }
        if let skipped { h.skip(Self.v(skipped)) }
        h.answered(answer)
        #expect(h.forWriter?.version == writerLeft)
        #expect(h.skipped?.version == skippedLeft)
    }
}

@Suite struct SeenCursorTests {
    /// (cursor, versions received and not shown, the seenCursor a delete sends)
    @Test(arguments: [
        (Int64(40), [Int64](), Int64(40)),
        (40, [21], 20),
        (40, [33, 21, 38], 20),
        (40, [41, 50], 40),
        (40, [40], 39),
        (40, [1], 0),
        (0, [0], 0),
        (Int64.max, [Int64.max], Int64.max - 1),
    ] as [(Int64, [Int64], Int64)])
    func aDeleteNeverClaimsAStateItDidNotShow(_ cursor: Int64, _ held: [Int64], _ seen: Int64) {
        #expect(SeenCursor.forDelete(cursor: cursor, notShown: held) == seen)
    }

    @Test func theLowestSkippedVersionIsKept() {
        #expect(SeenCursor.lowestSkipped(nil, adding: []) == nil)
        #expect(SeenCursor.lowestSkipped(nil, adding: [9, 4, 7]) == 4)
        #expect(SeenCursor.lowestSkipped(3, adding: [9, 4]) == 3)
        #expect(SeenCursor.lowestSkipped(12, adding: []) == 12)
    }

    @Test func everyHoldCounts() {
        var h = RemoteHolds()
        #expect(h.heldVersions.isEmpty)
        _ = h.holdForLock(RemoteHoldsTests.v(7))
        h.holdForWriter(RemoteHoldsTests.v(9))
        h.skip(RemoteHoldsTests.v(4))
        #expect(h.heldVersions.sorted() == [4, 7, 9])
    }
}
