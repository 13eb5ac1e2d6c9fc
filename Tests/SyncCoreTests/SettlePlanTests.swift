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
        // holds what was sent (or nothing came before), else on the previous base.
        (F(sameContent: false, existsHere: false), true, .deletedHere(onAnswer: false)),
        (F(sameContent: false, existsHere: false, hadBase: false), true, .deletedHere(onAnswer: true)),
        (F(samePlace: false, existsHere: false), true, .deletedHere(onAnswer: true)),
        // The server's state differs: shown, with other bytes when the content differs.
        (F(sameContent: false), true, .show(resetContent: true)),
        (F(writtenSince: true, sameContent: false), true, .show(resetContent: true)),
        (F(samePlace: false), true, .show(resetContent: false)),
        (F(sameContent: false, samePlace: false), false, .show(resetContent: false)),
        // What was sent is shown already: deleted here or not, nothing to do but record it.
        (F(existsHere: false), true, .record),
    ] as [(SettleFacts, Bool, SettleStep)])
    func theAnswerToAnItemsOwnCommit(_ facts: SettleFacts, _ isFile: Bool, _ step: SettleStep) {
        #expect(SyncItem<T>().planSettle(facts, isFile: isFile) == step)
    }
}
