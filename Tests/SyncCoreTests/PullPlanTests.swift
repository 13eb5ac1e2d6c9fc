import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

/// What arriving states mean for presenters, how skipped folder deletes are tried again, and
/// what follows a commit's answer.
@Suite struct PullPlanTests {
    @Test func presentersAreAskedForNewContentOrADeleteOfAFileShownHere() {
        let v5 = ApplyGatherTests.withChunks(5, [1]), old = Base(record: v5, present: nil)
        #expect(ArrivingChange.of(ApplyGatherTests.withChunks(6, [2]), over: old) == .replace)
        #expect(ArrivingChange.of(ApplyPlanTests.server(6, deleted: true), over: old) == .delete)
        #expect(ArrivingChange.of(ApplyGatherTests.withChunks(6, [1]), over: old) == nil, "same content")
        #expect(ArrivingChange.of(ApplyGatherTests.withChunks(5, [2]), over: old) == nil, "not newer")
        #expect(ArrivingChange.of(ApplyGatherTests.withChunks(6, [2]), over: nil) == nil, "never shown here")
        #expect(ArrivingChange.of(ApplyPlanTests.server(6, kind: .folder, deleted: true), over: old) == nil, "not a file")
    }

    /// Purged from Recently Deleted: an item the server has no more is deleted here for good, at
    /// a version past what is shown; a delete of it is done (docs/trash.md).
    @Test func anItemTheServerPurgedIsDeletedForGood() {
        let shown = ApplyPlanTests.server(7, kind: .folder)
        let gone = PurgedItem.deleted(shown, asked: 7, cursor: 40)
        #expect(gone?.deleted == true && gone?.version == 40 && gone?.id == shown.id)
        #expect(PurgedItem.deleted(shown, asked: 7, cursor: 3)?.version == 8, "past the version known when the cursor is older")
        #expect(PurgedItem.deleted(shown, asked: 5, cursor: 40) == nil,
                "a state shown since the server was asked (this device's commit brought the item back) is newer than the answer")
        var r = SkippedRetry()
        r.addGone(ApplyPlanTests.server(7, kind: .folder, deleted: true), asked: 6)
        #expect(!r.isEmpty && r.items.isEmpty)
        let folder6 = ApplyPlanTests.server(6, kind: .folder), folder9 = ApplyPlanTests.server(9, kind: .folder)
        #expect(r.purgedDeletes(shown: { _ in folder6 }, cursor: 50).map(\.version) == [50])
        let made = r.purgedDeletes(shown: { _ in folder6 }, cursor: 50)
        #expect(made.allSatisfy(\.deleted) && made.map(\.id) == [folder6.id])
        #expect(r.purgedDeletes(shown: { _ in nil }, cursor: 50).map(\.version) == [50], "nothing shown: the skipped delete itself")
        #expect(r.purgedDeletes(shown: { _ in folder9 }, cursor: 50).isEmpty, "shown newer since it was asked")
        #expect(MissingItemAsk.of(code: .itemNotFound, failure: .transient) == .purged)
        #expect(MissingItemAsk.of(code: nil, failure: .transient) == .relistAgain, "a lost connection: the relist is due again")
        #expect(MissingItemAsk.of(code: .unavailable, failure: .transient) == .relistAgain)
        #expect(MissingItemAsk.of(code: .unauthorized, failure: .unauthorized) == .relistAgain)
        #expect(MissingItemAsk.of(code: .badRequest, failure: .refused) == .skip)
        #expect(DeleteAnswer.gone(code: .itemNotFound) == [.saveBase(nil)])
        #expect(DeleteAnswer.gone(code: .unavailable) == nil && DeleteAnswer.gone(code: nil) == nil)
    }

    @Test func aSkippedFolderDeleteIsTriedWithTheFoldersCurrentState() {
        let delete = ApplyPlanTests.server(7, kind: .folder, deleted: true)
        #expect(SkippedRetry.asksServer(delete) && !SkippedRetry.asksServer(ApplyPlanTests.server(7, kind: .folder))
            && !SkippedRetry.asksServer(ApplyPlanTests.server(7, deleted: true)))
        var r = SkippedRetry()
        #expect(r.isEmpty)
        r.add(ApplyPlanTests.server(3))
        r.add(delete, current: nil)  // the server could not be asked: waits for the next try
        #expect(r.items == [ApplyPlanTests.server(3)] && r.overtaking.isEmpty)
        let back = ApplyPlanTests.server(9, kind: .folder)
        r.add(delete, current: back)  // brought back by the upload of the work it kept
        #expect(r.items.last == back && r.overtaking == [back])
        r.add(delete, current: delete)
        #expect(r.items.last == delete && r.overtaking == [back])
        r.add(delete, current: ApplyPlanTests.server(6, kind: .folder))  // an older answer: the delete stays
        #expect(r.items.last == delete && r.items.count == 4)
    }

    @Test func whatFollowsACommitsAnswer() {
        #expect(CommitPlan.afterAnswer(snapshot: nil) == [.applyHeld, .removeQueued])
        #expect(CommitPlan.afterAnswer(snapshot: 4) == [.snapshotSent(4)])
    }
}

/// The relist mark is written once per run and goes only after a listing that left nothing.
@Suite struct RelistMarkTests {
    @Test func theMarkIsWrittenOncePerRunAndClearedOnlyWhenNothingWasMarked() {
        var m = RelistMark(due: true)
        #expect(m.due)
        #expect(m.mark() && !m.mark(), "written the first time only")
        #expect(!m.listed() && !m.due, "marked during this run: the mark stays on disk")
        var clean = RelistMark(due: true)
        #expect(clean.listed() && !clean.due)
    }
}
