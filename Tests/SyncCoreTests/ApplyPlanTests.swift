import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

/// `SyncItem.planApply`: what becomes of a server state that arrives, for every branch of the
/// rule, and the holds it leaves.
@Suite struct ApplyPlanTests {
    typealias Item = SyncItem<T>

    static func server(_ version: Int64, kind: ItemKind = .file, deleted: Bool = false) -> ServerItem {
        let state = ItemState(kind: kind, location: ItemLocation(parent: .root, name: ItemName(trusted: "x")),
                              mode: 0o644, modified: 0, modifiedBy: RemoteHoldsTests.device, deleted: deleted)
        return ServerItem(id: RemoteHoldsTests.id, version: version, state: state, conflicts: 0)
    }

    /// (version shown here, arriving version, forced, step)
    @Test(arguments: [
        (Int64?.none, Int64(5), false, ApplyStep.show(resetContent: true, underClaim: false)),
        (5, 5, false, .oldNews),
        (7, 5, false, .oldNews),
        (5, 5, true, .show(resetContent: false, underClaim: false)),
        (7, 5, true, .show(resetContent: false, underClaim: false)),
        (4, 5, false, .show(resetContent: false, underClaim: false)),
    ] as [(Int64?, Int64, Bool, ApplyStep)])
    func versionsDecideWhatIsNews(_ shown: Int64?, _ arriving: Int64, _ forced: Bool, _ step: ApplyStep) {
        var item = Item()
        #expect(item.planApply(Self.server(arriving), ApplyFacts(shownVersion: shown, forced: forced)) == step)
        #expect(item.remote.isEmpty)
    }

    /// A delete shown here leaves no base; a live state read before it (a listing answered
    /// after the delete) is old news, even forced; a newer one (the item brought back) is shown.
    @Test func aDeleteShownHereOutranksOlderLiveStates() {
        var item = Item()
        #expect(item.planApply(Self.server(50), ApplyFacts(shownVersion: nil, deleteShown: 67)) == .oldNews)
        #expect(item.planApply(Self.server(50), ApplyFacts(shownVersion: nil, forced: true, deleteShown: 67)) == .oldNews)
        #expect(item.planApply(Self.server(67, deleted: true), ApplyFacts(shownVersion: nil, deleteShown: 67)) == .oldNews)
        #expect(item.planApply(Self.server(70), ApplyFacts(shownVersion: nil, deleteShown: 67)) == .show(resetContent: true, underClaim: false))
    }

    /// A state skipped (its folder missing) waits; an older one arriving after it (a listing read
    /// before it) is old news and leaves the newer one waiting.
    @Test func anOlderStateNeverReplacesOneWaiting() {
        var item = Item()
        item.remote.skip(Self.server(39))
        #expect(item.planApply(Self.server(36), ApplyFacts(shownVersion: nil)) == .oldNews)
        #expect(item.remote.skipped?.version == 39)
        #expect(item.planApply(Self.server(39), ApplyFacts(shownVersion: nil)) == .show(resetContent: true, underClaim: false))
    }

    @Test func aStateWaitingToBeShownIsShownAtTheBasesVersion() {
        var item = Item()
        item.remote.skip(Self.server(5))
        #expect(item.planApply(Self.server(5), ApplyFacts(shownVersion: 5)) == .show(resetContent: false, underClaim: false))
        // A newer version shown: the skipped one waits no more.
        #expect(item.planApply(Self.server(5), ApplyFacts(shownVersion: 6)) == .oldNews)
        #expect(item.remote.skipped == nil)
    }

    /// A state recorded as the base but not shown — a commit's answer whose place was taken
    /// here, the note that it waits lost with a restart (model seed 54762); an item a folder
    /// delete took with it after the server had moved it out (model seed 68075) — is shown when
    /// the tree's place differs. Where a local change is pending, its push answers it instead.
    @Test func aBaseNotShownIsShownWhenThePlaceDiffers() {
        var item = Item()
        #expect(item.planApply(Self.server(5), ApplyFacts(shownVersion: 5, placeDiffers: true)) == .show(resetContent: false, underClaim: false))
        #expect(item.planApply(Self.server(5), ApplyFacts(shownVersion: 5)) == .oldNews)
        #expect(item.planApply(Self.server(5), ApplyFacts(shownVersion: 6, placeDiffers: true)) == .oldNews)
        #expect(item.planApply(Self.server(5), ApplyFacts(shownVersion: 5, pushPending: true, placeDiffers: true)) == .heldForPush)
    }

    @Test func oldNewsLetsGoOfHoldsItCovers() {
        var item = Item()
        _ = item.remote.holdForLock(Self.server(4))
        item.remote.holdForWriter(Self.server(6))
        #expect(item.planApply(Self.server(3), ApplyFacts(shownVersion: 5)) == .oldNews)
        #expect(item.remote.forLock == nil)
        #expect(item.remote.forWriter?.version == 6)
    }

    @Test func itsOwnPushAnswersIt() {
        var item = Item()
        #expect(item.planApply(Self.server(8), ApplyFacts(shownVersion: 5, contentDiffers: true, pushPending: true)) == .heldForPush)
        #expect(item.planApply(Self.server(7), ApplyFacts(shownVersion: 5, pushPending: true)) == .heldForPush)
        #expect(item.remote.forWriter?.version == 8)  // the newest stays
        #expect(ApplyStep.heldForPush.holds)
    }

    /// (kind, deleted, content differs, step with a writer open here)
    @Test(arguments: [
        (ItemKind.file, false, true, ApplyStep.heldForWriter),
        (.file, true, false, .heldForWriter),
        (.file, false, false, .show(resetContent: false, underClaim: false)),  // a rename goes in
        (.folder, true, false, .show(resetContent: false, underClaim: false)),
        (.symlink, false, false, .show(resetContent: false, underClaim: false)),
    ] as [(ItemKind, Bool, Bool, ApplyStep)])
    func aWriterHoldsNewContentAndDeletes(_ kind: ItemKind, _ deleted: Bool, _ differs: Bool, _ step: ApplyStep) {
        var item = Item()
        let got = item.planApply(Self.server(9, kind: kind, deleted: deleted),
                                 ApplyFacts(shownVersion: 5, contentDiffers: differs, openForWriting: true))
        #expect(got == step)
        #expect((item.remote.forWriter != nil) == (step == .heldForWriter))
    }

    @Test func aWriterDoesNotHoldAFileNeverShownHere() {
        var item = Item()
        #expect(item.planApply(Self.server(9), ApplyFacts(shownVersion: nil, openForWriting: true)) == .show(resetContent: true, underClaim: false))
    }

    /// (local work below, newer item below, step)
    @Test(arguments: [
        (false, false, ApplyStep.show(resetContent: false, underClaim: false)),
        (true, false, .folderKept),
        (false, true, .folderKept),
    ] as [(Bool, Bool, ApplyStep)])
    func aFolderDeleteOverLocalWorkKeepsTheFolder(_ work: Bool, _ newer: Bool, _ step: ApplyStep) {
        var item = Item()
        let got = item.planApply(Self.server(9, kind: .folder, deleted: true),
                                 ApplyFacts(shownVersion: 5, localWorkBelow: work, newerBelow: newer))
        #expect(got == step)
        #expect((item.remote.skipped?.version == 9) == (step == .folderKept))
    }

    @Test func newContentGoesInUnderAClaim() {
        var item = Item()
        #expect(item.planApply(Self.server(9), ApplyFacts(shownVersion: 5, contentDiffers: true)) == .show(resetContent: true, underClaim: true))
        #expect(item.planApply(Self.server(10, deleted: true), ApplyFacts(shownVersion: 9, contentDiffers: true)) == .show(resetContent: true, underClaim: false))
    }
}

extension ApplyPlanTests {
    /// A state shown lets go of the holds it overtakes (a delete held for a push that ended
    /// without a commit, then a newer state shown: the model simulation found it held for good).
    @Test func aShownStateLetsGoOfOlderHolds() {
        var item = Item()
        item.remote.holdForWriter(Self.server(2, deleted: true))
        _ = item.remote.holdForLock(Self.server(9))
        #expect(item.planApply(Self.server(5), ApplyFacts(shownVersion: nil)) == .show(resetContent: true, underClaim: false))
        #expect(item.remote.forWriter == nil)
        #expect(item.remote.forLock?.version == 9)
    }
}

/// What a folder delete from the server finds below the folder.
@Suite struct FolderDeletePlanTests {
    let folder = ItemID(UUID()), a = ItemID(UUID()), b = ItemID(UUID()), c = ItemID(UUID()), elsewhere = ItemID(UUID())

    func facts(_ below: [BelowDeletedFolder], tree: [ItemID: [ItemID]] = [:]) -> (localWorkBelow: Bool, newerBelow: Bool, leaving: Bool) {
        FolderDeletePlan.facts(folder: folder, version: 10, below: below) { tree[$0] ?? [] }
    }

    @Test func localWorkOrANewerItemBelowKeepsTheFolder() {
        let quiet = facts([BelowDeletedFolder(id: a, localWork: false, baseVersion: 4, serverParent: nil)])
        #expect(!quiet.localWorkBelow && !quiet.newerBelow && !quiet.leaving)
        #expect(facts([BelowDeletedFolder(id: a, localWork: true, baseVersion: 4, serverParent: nil)]).localWorkBelow)
        #expect(facts([BelowDeletedFolder(id: a, localWork: false, baseVersion: 11, serverParent: nil)]).newerBelow)
        #expect(!facts([BelowDeletedFolder(id: a, localWork: false, baseVersion: nil, serverParent: nil)]).newerBelow)
    }

    /// An item the server moved out of the folder before the delete: the delete would take it
    /// here (`leaving`: list again), and it and what is in it do not count as newer below.
    @Test func anItemMovedOutIsLeavingAndItsContentDoesNotHoldTheDeleteBack() {
        let below = [
            BelowDeletedFolder(id: a, localWork: false, baseVersion: 12, serverParent: elsewhere),
            BelowDeletedFolder(id: b, localWork: false, baseVersion: 13, serverParent: nil),
        ]
        let f = facts(below, tree: [a: [b]])
        #expect(f.leaving && !f.newerBelow)
        // Moved within the folder (or into it): not leaving, and a newer item counts.
        let inside = facts([BelowDeletedFolder(id: a, localWork: false, baseVersion: 12, serverParent: c),
                            BelowDeletedFolder(id: c, localWork: false, baseVersion: 3, serverParent: nil)])
        #expect(!inside.leaving && inside.newerBelow)
        #expect(!facts([BelowDeletedFolder(id: a, localWork: false, baseVersion: 3, serverParent: folder)]).leaving)
    }
}
