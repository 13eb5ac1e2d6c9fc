import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

@Suite struct BaseTests {
    func record(_ sizes: [Int64]) -> ServerItem {
        let chunks = sizes.enumerated().map { i, s in ChunkRef(hash: ContentHash(digest: [UInt8](repeating: UInt8(i), count: 32)), size: s) }
        let state = ItemState(kind: .file, location: ItemLocation(parent: .root, name: ItemName(trusted: "f")),
                              content: ItemContent(chunks: chunks), mode: 0o644, modified: 1, modifiedBy: DeviceID(UUID()))
        return ServerItem(id: ItemID(UUID()), version: 3, state: state, conflicts: 0)
    }

    @Test func rangesMapToTheChunksThatCoverThem() {
        let b = Base.placeholder(record([10, 20, 30]))  // [0,10) [10,30) [30,60)
        #expect(b.chunks(covering: 0..<1) == 0..<1)
        #expect(b.chunks(covering: 9..<11) == 0..<2)
        #expect(b.chunks(covering: 10..<30) == 1..<2)
        #expect(b.chunks(covering: 29..<31) == 1..<3)
        #expect(b.chunks(covering: 0..<Int64.max) == 0..<3)
        #expect(b.chunks(covering: 60..<100).isEmpty)  // past the end: nothing to fetch
        #expect(b.missing(in: 12..<40) == [1, 2])
    }

    @Test func aStartAfterAnUncleanStopPushesWholeFilesAndPlaceholdersWrittenToAnotherSize() {
        let r = record([10, 20])
        #expect(Base(record: r, present: nil).afterUncleanStop(sizeHere: 30) == .push)
        #expect(Base(record: r, present: nil).afterUncleanStop(sizeHere: 7) == .push)
        #expect(Base.placeholder(r).afterUncleanStop(sizeHere: 30) == .leave)
        #expect(Base(record: r, present: [true, false]).afterUncleanStop(sizeHere: 30) == .leave)
        // Truncated or written past its end here: the program's bytes, whole.
        #expect(Base.placeholder(r).afterUncleanStop(sizeHere: 0) == .pushWhole(Base(record: r, present: nil)))
        #expect(Base(record: r, present: [true, false]).afterUncleanStop(sizeHere: 31) == .pushWhole(Base(record: r, present: nil)))
    }

    @Test func presenceCompletesAndEmptyFilesAreComplete() {
        var b = Base.placeholder(record([10, 20]))
        #expect(!b.complete)
        b = Base(record: b.record, present: [true, false])
        #expect(b.missing(in: 0..<30) == [1])
        b = Base(record: b.record, present: [true, true])
        #expect(b.complete && b.missing(in: 0..<30).isEmpty)
        #expect(Base.placeholder(record([])).complete)
    }
}
