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
        // Not in the tree at all: its bytes went with what took it (purge seed 1460).
        #expect(item.planApply(Self.server(5), ApplyFacts(shownVersion: 5, placeDiffers: true, absent: true)) == .show(resetContent: true, underClaim: false))
        #expect(item.planApply(Self.server(6), ApplyFacts(shownVersion: 5, absent: true)) == .show(resetContent: true, underClaim: false))
        #expect(item.planApply(Self.server(7, kind: .folder), ApplyFacts(shownVersion: 6, absent: true)) == .show(resetContent: false, underClaim: false),
                "a folder has no bytes")
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

/// `ApplyFacts.gather` asks only what a rule needs; `ApplyStep.actions` says what the engine does.
@Suite struct ApplyGatherTests {
    static func base(_ s: ServerItem) -> Base { Base(record: s, present: nil) }

    static func withChunks(_ version: Int64, _ bytes: [UInt8]) -> ServerItem {
        let chunks = bytes.map { ChunkRef(hash: ContentHash(digest: [UInt8](repeating: $0, count: 32)), size: 4) }
        let state = ItemState(kind: .file, location: ItemLocation(parent: .root, name: ItemName(trusted: "x")),
                              content: ItemContent(chunks: chunks), mode: 0o644, modified: 0, modifiedBy: RemoteHoldsTests.device)
        return ServerItem(id: RemoteHoldsTests.id, version: version, state: state, conflicts: 0)
    }

    /// Lookups that count what is asked.
    final class Asked: @unchecked Sendable {
        var place = 0, writer = 0, below = 0
        var here: (parent: ItemID?, name: String)? = (.root, "x")
        var writing: Bool? = false
        var items: [BelowDeletedFolder] = []
        var lookups: ApplyLookups {
            ApplyLookups(place: { _ in self.place += 1; return self.here },
                         openForWriting: { _ in self.writer += 1; return self.writing },
                         below: { _ in self.below += 1; return self.items },
                         descendants: { _ in [] })
        }
    }

    @Test func theSameVersionAsksWhereItIsOnlyWithNoPushPending() {
        let v5 = ApplyPlanTests.server(5), a = Asked()
        var (f, leaving) = ApplyFacts.gather(v5, old: Self.base(v5), pushPending: false, forced: false, deleteShown: 9, a.lookups)
        #expect(!f.placeDiffers && !leaving && a.place == 1 && a.writer == 0 && a.below == 0 && f.deleteShown == nil)
        a.here = (.root, "y")
        (f, _) = ApplyFacts.gather(v5, old: Self.base(v5), pushPending: false, forced: false, deleteShown: nil, a.lookups)
        #expect(f.placeDiffers)
        a.here = nil
        (f, _) = ApplyFacts.gather(v5, old: Self.base(v5), pushPending: false, forced: false, deleteShown: nil, a.lookups)
        #expect(f.placeDiffers && f.absent, "not in the tree: not shown, and its bytes are gone")
        (f, _) = ApplyFacts.gather(v5, old: Self.base(v5), pushPending: true, forced: false, deleteShown: nil, a.lookups)
        #expect(!f.placeDiffers && a.place == 3 && f.pushPending)
        (f, _) = ApplyFacts.gather(ApplyPlanTests.server(6), old: Self.base(v5), pushPending: false, forced: false, deleteShown: nil, a.lookups)
        #expect(a.place == 4 && f.absent, "a newer version is news anyway; only whether the tree still holds the file is asked")
        (f, _) = ApplyFacts.gather(Self.withChunks(6, [9]), old: Self.base(v5), pushPending: false, forced: false, deleteShown: nil, a.lookups)
        #expect(a.place == 4 && !f.absent, "new content is reset anyway")
        // Never shown here: the delete shown since counts, nothing else is asked.
        (f, _) = ApplyFacts.gather(v5, old: nil, pushPending: false, forced: true, deleteShown: 9, a.lookups)
        #expect(f.deleteShown == 9 && f.forced && f.shownVersion == nil && a.place == 4 && a.writer == 1)
    }

    @Test func theWriterIsAskedForNewContentOrADeleteOfAFileShownHere() {
        let a = Asked()
        a.writing = true
        let v6 = Self.withChunks(6, [1])
        var (f, _) = ApplyFacts.gather(v6, old: Self.base(ApplyPlanTests.server(5)), pushPending: false, forced: false, deleteShown: nil, a.lookups)
        #expect(f.contentDiffers && f.openForWriting && a.writer == 1)
        (f, _) = ApplyFacts.gather(ApplyPlanTests.server(6, deleted: true), old: Self.base(ApplyPlanTests.server(5)), pushPending: false,
                                   forced: false, deleteShown: nil, a.lookups)
        #expect(f.openForWriting && a.writer == 2)
        (f, _) = ApplyFacts.gather(ApplyPlanTests.server(6), old: Self.base(ApplyPlanTests.server(5)), pushPending: false, forced: false,
                                   deleteShown: nil, a.lookups)
        #expect(!f.openForWriting && a.writer == 2, "same content: no writer asked")
        (f, _) = ApplyFacts.gather(v6, old: nil, pushPending: false, forced: false, deleteShown: nil, a.lookups)
        #expect(!f.openForWriting && a.writer == 2, "never shown here")
        a.writing = nil
        (f, _) = ApplyFacts.gather(v6, old: Self.base(ApplyPlanTests.server(5)), pushPending: false, forced: false, deleteShown: nil, a.lookups)
        #expect(!f.openForWriting, "not a file here")
    }

    @Test func aFolderDeleteAsksWhatIsBelow() {
        let a = Asked()
        let folder = ApplyPlanTests.server(9, kind: .folder, deleted: true)
        a.items = [BelowDeletedFolder(id: ItemID(UUID()), localWork: true, baseVersion: 3, serverParent: nil),
                   BelowDeletedFolder(id: ItemID(UUID()), localWork: false, baseVersion: 12, serverParent: ItemID(UUID()))]
        let (f, leaving) = ApplyFacts.gather(folder, old: Self.base(ApplyPlanTests.server(8, kind: .folder)), pushPending: false,
                                             forced: false, deleteShown: nil, a.lookups)
        #expect(a.below == 1 && f.localWorkBelow && !f.newerBelow && leaving, "the newer one is moving out: it does not hold the delete")
        _ = ApplyFacts.gather(ApplyPlanTests.server(9, kind: .folder), old: nil, pushPending: false, forced: false, deleteShown: nil, a.lookups)
        #expect(a.below == 1)
    }

    @Test func eachStepsActions() {
        let v5 = ApplyPlanTests.server(5), gone = ApplyPlanTests.server(6, deleted: true)
        let partial = Base(record: v5, present: [Bool]())  // no chunks: whole
        #expect(ApplyStep.oldNews.actions(v5, old: nil, leaving: true).isEmpty)
        for held in [ApplyStep.heldForPush, .heldForWriter, .folderKept] {
            #expect(held.actions(v5, old: nil, leaving: true) == [.markRelist])
        }
        #expect(ApplyStep.show(resetContent: true, underClaim: false).actions(v5, old: nil, leaving: false)
            == [.show(resetContent: true, base: .placeholder(v5), frozen: nil)])
        #expect(ApplyStep.show(resetContent: false, underClaim: false).actions(gone, old: partial, leaving: true)
            == [.relistAfter, .deleteShown(6), .show(resetContent: false, base: nil, frozen: nil)])
        // New content of a file partly here: under a claim, and open readers keep the old presence.
        let old = Base(record: Self.withChunks(5, [2, 3]), present: [true, false])
        #expect(ApplyStep.show(resetContent: true, underClaim: true).actions(ApplyPlanTests.server(7), old: old, leaving: false)
            == [.claim, .show(resetContent: true, base: .placeholder(ApplyPlanTests.server(7)), frozen: old)])
        // The same content, reset (the file was taken from the tree): none of it is here any more.
        let whole = Base(record: Self.withChunks(5, [2]), present: nil)
        #expect(ApplyStep.show(resetContent: true, underClaim: false).actions(Self.withChunks(5, [2]), old: whole, leaving: false)
            == [.show(resetContent: true, base: .placeholder(Self.withChunks(5, [2])), frozen: nil)])
        #expect(ApplyStep.show(resetContent: false, underClaim: false).actions(Self.withChunks(6, [2]), old: whole, leaving: false)
            == [.show(resetContent: false, base: Base(record: Self.withChunks(6, [2]), present: nil), frozen: nil)])
    }
}
