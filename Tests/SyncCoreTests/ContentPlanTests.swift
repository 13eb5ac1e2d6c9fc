import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

/// The rules of an item's content here (ContentPlan.swift), as tables.
@Suite struct ContentPlanTests {
    static let mib: Int64 = 1 << 20

    static func file(_ sizes: [Int64], version: Int64 = 1, deleted: Bool = false, id: ItemID = ItemID(UUID())) -> ServerItem {
        let chunks = sizes.enumerated().map { ChunkRef(hash: ContentHash(digest: Array(repeating: UInt8($0.offset), count: 32)), size: $0.element) }
        let state = ItemState(kind: .file, location: ItemLocation(parent: .root, name: ItemName(trusted: "f")),
                              content: ItemContent(chunks: chunks), mode: 0o644, modified: 1, modifiedBy: DeviceID(UUID()), deleted: deleted)
        return ServerItem(id: id, version: version, state: state, conflicts: 0)
    }

    /// Reads in a row make a run; a jump starts over.
    @Test func readsInARowMakeARun() {
        var c = CacheUse()
        #expect(c.read(0..<100) == 0)
        #expect(c.read(100..<300) == 200)
        #expect(c.read(300..<400) == 300)
        #expect(c.read(1_000..<1_100) == 0, "a jump")
    }

    /// (run, chunks present, expected chunks fetched ahead of a read of chunk 0).
    @Test(arguments: [
        (Int64(0), [false, false, false, false], [Int]()),          // a random read: nothing ahead
        (4 * mib - 1, [false, false, false, false], []),            // not yet 4 MiB in a row
        (4 * mib, [false, false, false, false], [1, 2]),            // two chunks
        (40 * mib, [false, false, false, false], [1, 2, 3]),        // a wide window, up to the end
        (8 * mib, [true, true, false, true], [2]),                  // only what is missing
    ] as [(Int64, [Bool], [Int])])
    func aWindowAheadOfASequentialReader(_ run: Int64, _ present: [Bool], _ expected: [Int]) {
        let b = Base(record: Self.file([Self.mib, Self.mib, Self.mib, Self.mib]), present: present)
        #expect(b.readAhead(after: 0..<Self.mib, run: run) == expected)
        #expect(Base(record: Self.file([Self.mib, Self.mib]), present: nil).readAhead(after: 0..<Self.mib, run: 40 * Self.mib).isEmpty,
                "a whole file fetches nothing")
    }

    /// A shown state keeps what is here of the same content, nothing of other content; a delete
    /// leaves no base.
    @Test func theBaseAfterAStateIsShown() {
        let id = ItemID(UUID())
        let v1 = Self.file([10, 20], version: 1, id: id)
        let old = Base(record: v1, present: [true, false])
        var renamed = v1
        renamed.version = 2
        #expect(Base.afterShowing(renamed, over: old)?.present == [true, false], "same content: its presence stays")
        let v3 = Self.file([10, 21], version: 3, id: id)
        #expect(Base.afterShowing(v3, over: old)?.present == [false, false], "other content: a placeholder")
        #expect(Base.afterShowing(v3, over: nil)?.present == [false, false], "new here: a placeholder")
        #expect(Base.afterShowing(Self.file([10], version: 4, deleted: true, id: id), over: old) == nil, "a delete: no base")
    }

    @Test func aChunkBelongsOnlyToTheContentItWasAskedFor() {
        let r = Self.file([10, 20])
        let b = Base.placeholder(r)
        #expect(b.holds(chunk: 1, hash: r.chunks[1].hash, at: 10))
        #expect(!b.holds(chunk: 1, hash: r.chunks[0].hash, at: 10), "another hash")
        #expect(!b.holds(chunk: 1, hash: r.chunks[1].hash, at: 0), "another offset")
        #expect(!b.holds(chunk: 2, hash: r.chunks[1].hash, at: 30), "past the end")
    }

    /// An answer not shown leaves the previous base; a file whole here stays whole.
    @Test func theBaseAnAnswerNotShownLeaves() {
        let v1 = Self.file([10, 20], version: 1)
        let previous = Base(record: v1, present: [true, false])
        let answer = Base.placeholder(Self.file([11], version: 2, id: v1.id))
        #expect(Base.keptWhenNotShown(previous: previous, answer: answer, answerIsSent: true, isFile: true, wholeHere: false) == previous)
        #expect(Base.keptWhenNotShown(previous: previous, answer: answer, answerIsSent: false, isFile: true, wholeHere: true)?.complete == true)
        #expect(Base.keptWhenNotShown(previous: nil, answer: answer, answerIsSent: true, isFile: true, wholeHere: false) == answer, "a first commit")
        // A create sent again after its answer was lost, answered with another device's edit:
        // the bytes here are not that edit, which stays news.
        #expect(Base.keptWhenNotShown(previous: nil, answer: answer, answerIsSent: false, isFile: true, wholeHere: true) == nil)
    }
}

/// What a commit's answer leaves (SettlePlan.swift) and when a held state goes in after a push.
@Suite struct AnswerPlanTests {
    @Test func theBaseAnAnswerBecomes() {
        let id = ItemID(UUID())
        let sent = ContentPlanTests.file([10, 20], version: 1, id: id)
        var answer = sent
        answer.version = 2
        let partial = Base(record: sent, present: [true, false])
        #expect(Base.fromAnswer(answer, sent: sent.chunks, previous: partial, wholeNow: false).present == [true, false],
                "the same content keeps what of it is here")
        #expect(Base.fromAnswer(answer, sent: sent.chunks, previous: partial, wholeNow: true).complete, "written since: whole")
        #expect(Base.fromAnswer(answer, sent: sent.chunks, previous: nil, wholeNow: false).complete, "read here to be sent: whole")
        let other = ContentPlanTests.file([11], version: 3, id: id)
        #expect(Base.fromAnswer(other, sent: sent.chunks, previous: partial, wholeNow: true).present == [false], "ours kept apart: not here")
    }

    @Test func theBaseKeptOverADeleteElsewhere() {
        let r = ContentPlanTests.file([10, 20])
        let previous = Base(record: r, present: [false, false])
        let now = Base(record: r, present: nil)
        #expect(Base.keptOverDeleteElsewhere(now: now, previous: previous) == now, "what came here since stays")
        let other = Base(record: ContentPlanTests.file([5]), present: nil)
        #expect(Base.keptOverDeleteElsewhere(now: other, previous: previous) == previous)
        #expect(Base.keptOverDeleteElsewhere(now: nil, previous: previous) == previous)
    }

    @Test func thePlaceHereIsPushedAgainOnlyWhenKeptAndDifferent() {
        let r = ContentPlanTests.file([10])
        #expect(!SettleFacts.placeHereNewer(relocate: false, here: (ItemID(UUID()), "x"), answer: r))
        #expect(!SettleFacts.placeHereNewer(relocate: true, here: (r.parent, r.name.value), answer: r))
        #expect(SettleFacts.placeHereNewer(relocate: true, here: (r.parent, "other"), answer: r))
        #expect(!SettleFacts.placeHereNewer(relocate: true, here: nil, answer: r))
    }

    @Test func aHeldStateGoesInAfterThePushUnlessWrittenOrQueued() {
        let r = ContentPlanTests.file([10], version: 5)
        for (writing, queued, goes) in [(false, false, true), (true, false, false), (false, true, false)] {
            var h = RemoteHolds()
            h.holdForWriter(r)
            #expect((h.releaseAfterPush(writing: writing, queued: queued) != nil) == goes, "writing \(writing), queued \(queued)")
            #expect((h.forWriter == nil) == goes, "kept while it waits")
        }
    }
}

/// A change made here, as the item's record takes it (PushPlan.swift `noticed`).
@Suite struct NoticedChangeTests {
    typealias T = ContinuousClock.Instant
    let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))

    @Test func aWriteInProgressIsANoteAndAContentChangeMakesAPlaceholderWhole() {
        let now = ContinuousClock.now
        var item = SyncItem<T>()
        item.base = Base(record: ContentPlanTests.file([10, 20]), present: [true, false])
        let w = item.noticed(.writing, at: now, rules: rules)
        #expect(!w.queue && w.whole == nil && item.upload.writing, "the close or fsync uploads")
        let c = item.noticed(.content, at: now, rules: rules)
        #expect(c.queue && c.whole?.complete == true && item.base?.complete == true)
        #expect(item.noticed(.content, at: now, rules: rules).whole == nil, "whole already: nothing to save")
        let d = item.noticed(.deleted, at: now, rules: rules)
        #expect(d.queue && d.whole == nil && item.upload.ready(at: now), "a delete goes at once")
        var other = SyncItem<T>()
        let o = other.noticed(.other, at: now, rules: rules)
        #expect(o.queue && o.whole == nil && other == SyncItem<T>(), "a move or a create: queued, nothing else")
    }
}

/// What a read needs: nothing, a refusal, or the chunks to download; and what is read ahead.
@Suite struct ReadNeedTests {
    static let r = BaseTests().record([10, 20, 30])  // [0,10) [10,30) [30,60)

    @Test func aReadNeedsItsMissingChunksUnlessDownloadsAreRefused() {
        let b = Base(record: Self.r, present: [true, false, false])
        #expect(Base.need(nil, 0..<10, refused: true) == .here)
        #expect(Base.need(b, 0..<10, refused: true) == .here)
        #expect(Base.need(Base(record: Self.r, present: nil), 0..<60, refused: true) == .here)
        #expect(Base.need(b, 5..<35, refused: true) == .refused)
        #expect(Base.need(b, 5..<35, refused: false) == .fetch(b.wants([1, 2])))
        #expect(b.wants([2]).first?.offset == 30 && b.wants([2]).first?.hash == Self.r.chunks[2].hash)
        #expect(b.missingChunks == [1, 2] && Base(record: Self.r, present: nil).missingChunks.isEmpty)
    }

    @Test func aReadOfAFileNotWhollyHereNotesItsRunAndReadsAhead() {
        var asked = 0
        let whole = Base.beforeRead(Base(record: Self.r, present: nil), 0..<10, refused: false) { asked += 1; return 0 }
        #expect(whole.present && whole.ahead.isEmpty && asked == 0, "a whole file notes nothing")
        let b = Base(record: Self.r, present: [true, false, false])
        let first = Base.beforeRead(b, 0..<10, refused: false) { asked += 1; return 10 }
        #expect(first.present && first.ahead.isEmpty && asked == 1, "a short run reads nothing ahead")
        let long = Base.beforeRead(b, 0..<10, refused: false) { Base.prefetchAfter }
        #expect(long.present && long.ahead == b.wants([1, 2]))
        let offline = Base.beforeRead(b, 0..<20, refused: true) { Base.prefetchAfter }
        #expect(!offline.present && offline.ahead.isEmpty)
    }
}
