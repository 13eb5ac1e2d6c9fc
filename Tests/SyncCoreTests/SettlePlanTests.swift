import SyncCore
import Testing

/// `SyncItem.planSettle`: every way the answer to an item's own commit can go.
@Suite struct SettlePlanTests {
    typealias F = SettleFacts

    @Test(arguments: [
        // The server kept what was sent.
        (F(), true, SettleStep.record),
        (F(), false, .record),
        // A delete made elsewhere answers a create sent again: shown, unless written since.
        (F(deletedElsewhere: true), true, .deletedElsewhere(keptForWrite: false)),
        (F(deletedElsewhere: true, writtenSince: true), true, .deletedElsewhere(keptForWrite: true)),
        (F(deletedElsewhere: true, writtenSince: true), false, .deletedElsewhere(keptForWrite: false)),
        // Deleted here meanwhile: never brought back; the delete goes on the answer when it
        // holds what was sent, else on the previous base (a create: on its first version), so
        // an edit made elsewhere that this device never showed wins.
        (F(sameContent: false, existsHere: false), true, .deletedHere(onAnswer: false)),
        (F(samePlace: false, existsHere: false), true, .deletedHere(onAnswer: true)),
        // The server's state differs: shown, with other bytes when the content differs.
        (F(sameContent: false), true, .show(resetContent: true)),
        (F(writtenSince: true, sameContent: false), true, .show(resetContent: true)),
        (F(samePlace: false), true, .show(resetContent: false)),
        (F(sameContent: false, samePlace: false), false, .show(resetContent: false)),
        // The server merged attributes set elsewhere into ours: shown (no other bytes).
        (F(sameXattrs: false), true, .show(resetContent: false)),
        // What was sent is shown already: deleted here or not, nothing to do but record it.
        (F(existsHere: false), true, .record),
    ] as [(SettleFacts, Bool, SettleStep)])
    func theAnswerToAnItemsOwnCommit(_ facts: SettleFacts, _ isFile: Bool, _ step: SettleStep) {
        #expect(SyncItem<T>().planSettle(facts, isFile: isFile) == step)
    }
}

/// What each settle step does, in order, and what the tree's showing of an answer leads to.
@Suite struct SettleActionTests {
    static let previous = Base(record: BaseTests().record([10, 20]), present: [true, false])
    static let answer = Base.placeholder(BaseTests().record([10, 30]))

    @Test func eachStepSavesTheBaseItLeavesAndShowsWhatItMust() {
        let (p, a) = (Self.previous, Self.answer)
        var downloadedSince = p
        downloadedSince.present = nil
        // A delete elsewhere keeps the previous base, with what came here since the commit left.
        #expect(SettleStep.deletedElsewhere(keptForWrite: true).actions(answer: a, previous: p, now: downloadedSince, conflict: false)
            == [.saveBase(downloadedSince)])
        #expect(SettleStep.deletedElsewhere(keptForWrite: false).actions(answer: a, previous: p, now: a, conflict: true)
            == [.saveBase(p), .showAsPulled])
        #expect(SettleStep.record.actions(answer: a, previous: p, now: p, conflict: false) == [.saveBase(a)])
        #expect(SettleStep.record.actions(answer: a, previous: p, now: p, conflict: true) == [.saveBase(a), .logConflict])
        #expect(SettleStep.deletedHere(onAnswer: true).actions(answer: a, previous: p, now: p, conflict: false) == [.saveBase(a)])
        #expect(SettleStep.deletedHere(onAnswer: false).actions(answer: a, previous: p, now: p, conflict: true) == [.saveBase(p)])
        #expect(SettleStep.show(resetContent: true).actions(answer: a, previous: p, now: p, conflict: true)
            == [.show(resetContent: true, base: a), .logConflict])
    }

    @Test func anAnswerNotShownKeepsThePreviousBaseAndWaits() {
        let (p, a) = (Self.previous, Self.answer)
        var whole = p
        whole.present = nil
        func after(shown: Bool, previous: Base? = Self.previous, sent: Bool = true, isFile: Bool = true, wholeHere: Bool = false,
                   movedBack: Bool = false, newer: Bool = false) -> [SettleAction] {
            SettleShown(shown: shown, previous: previous, answer: a, answerIsSent: sent, isFile: isFile, wholeHere: wholeHere,
                        movedBack: movedBack, placeHereNewer: newer).actions
        }
        #expect(after(shown: true) == [.persistShown(a)])
        #expect(after(shown: true, newer: true) == [.persistShown(a), .pushAgain])
        #expect(after(shown: true, movedBack: true) == [.persistShown(a)])
        #expect(after(shown: false) == [.saveBase(p), .holdAnswer])
        #expect(after(shown: false, wholeHere: true) == [.saveBase(whole), .holdAnswer], "written since: whole here")
        #expect(after(shown: false, isFile: false, wholeHere: true) == [.saveBase(p), .holdAnswer])
        #expect(after(shown: false, previous: nil) == [.saveBase(a), .holdAnswer], "a first commit keeps the answer")
        #expect(after(shown: false, previous: nil, sent: false, wholeHere: true) == [.saveBase(nil), .holdAnswer],
                "a first commit answered with other content keeps no base")
        #expect(after(shown: false, sent: false) == [.saveBase(p), .holdAnswer])
        #expect(after(shown: false, movedBack: true, newer: true) == [.saveBase(p), .holdAnswer, .movedBack])
    }

    @Test func theAnswerToADeleteShowsItOrBringsTheItemBack() {
        let gone = ApplyPlanTests.server(7, deleted: true)
        #expect(DeleteAnswer.actions(gone) == [.saveBase(nil), .deleteShown(7)])
        #expect(DeleteAnswer.actions(ApplyPlanTests.server(8)) == [.saveBase(nil), .showAsPulled])
        #expect(DeleteAnswer.actions(ApplyPlanTests.server(8, kind: .folder)) == [.saveBase(nil), .showAsPulled, .listAgain])
    }
}
