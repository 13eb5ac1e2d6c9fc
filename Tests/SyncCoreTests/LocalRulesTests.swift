import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

@Suite struct LocalRulesTests {
    static let device = DeviceID(UUID())
    static let folder = ItemID(UUID()), other = ItemID(UUID())

    static func item(_ kind: ItemKind = .file, parent: ItemID = .root, name: String = "f.txt", modified: Int64 = 100,
                     chunks: [ChunkRef] = [], deleted: Bool = false, version: Int64 = 3) -> ServerItem {
        var state = ItemState(kind: kind, location: ItemLocation(parent: parent, name: ItemName(trusted: name)),
                              mode: 0o644, modified: modified, modifiedBy: device)
        state.content = ItemContent(chunks: chunks, symlinkTarget: nil)
        state.deleted = deleted
        return ServerItem(id: ItemID(UUID()), version: version, state: state, conflicts: 0)
    }

    static let chunk = ChunkRef(hash: ContentHash(hex: String(repeating: "ab", count: 32))!, size: 10)

    /// (base, draft changes, time set on purpose, nothing to send)
    @Test func aCommitIsSentOnlyWhenSomethingChanged() {
        let base = Self.item(modified: 100)
        let same = ItemDraft(base)
        #expect(CommitPlan.nothingToSend(base: base, draft: same, timeSetOnPurpose: false))
        #expect(CommitPlan.nothingToSend(base: base, draft: same.withModified(200), timeSetOnPurpose: false), "only the time: a save that changed nothing")
        #expect(!CommitPlan.nothingToSend(base: base, draft: same.withModified(200), timeSetOnPurpose: true), "touch -d is sent")
        #expect(CommitPlan.nothingToSend(base: base, draft: same, timeSetOnPurpose: true), "a time set to what the base has")
        var renamed = same
        renamed.name = ItemName(trusted: "g.txt")
        #expect(!CommitPlan.nothingToSend(base: base, draft: renamed, timeSetOnPurpose: false))
        var edited = same
        edited.chunks = [Self.chunk]
        #expect(!CommitPlan.nothingToSend(base: base, draft: edited, timeSetOnPurpose: false))
        #expect(!CommitPlan.nothingToSend(base: nil, draft: same, timeSetOnPurpose: false), "never committed")
        #expect(!CommitPlan.nothingToSend(base: Self.item(deleted: true), draft: same, timeSetOnPurpose: false), "after a delete")
    }

    @Test func theTopmostUncommittedFolderGoesFirst() {
        let a = ItemID(UUID()), b = ItemID(UUID()), c = ItemID(UUID())
        var records: [ItemID: SyncItem<T>] = [c: SyncItem(base: Base(record: Self.item(.folder), present: nil))]
        // above: nearest first (a inside b inside c); c is committed, b and a are not.
        #expect(CommitPlan.folderFirst(above: [a, b, c]) { records[$0] } == b)
        let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))
        records[b, default: SyncItem()].upload.on(.failed(.refused, message: "invalid_name", missingChunks: false), at: .s(1), rules: rules)
        #expect(CommitPlan.folderFirst(above: [a, b, c]) { records[$0] } == a, "a folder refused for good is not pushed ahead")
        for _ in 0..<CommitPlan.pushAheadLimit { records[a, default: SyncItem()].upload.on(.pushedAhead, at: .s(1), rules: rules) }
        #expect(CommitPlan.folderFirst(above: [a, b, c]) { records[$0] } == nil, "nor one pushed ahead too often")
        #expect(CommitPlan.folderFirst(above: []) { records[$0] } == nil)
    }

    /// (file, shown here before, open for writing → held for the writer)
    @Test(arguments: [
        (ItemKind.file, true, true, true), (.file, true, false, false), (.file, false, true, false), (.folder, true, true, false),
    ] as [(ItemKind, Bool, Bool, Bool)])
    func aStateTheTreeCouldNotShowWaits(_ kind: ItemKind, _ shownBefore: Bool, _ writing: Bool, _ forWriter: Bool) {
        var r = SyncItem<T>()
        let s = Self.item(kind)
        r.notShown(s, shownBefore: shownBefore, openForWriting: writing)
        #expect((r.remote.forWriter == s) == forWriter)
        #expect((r.remote.skipped == s) == !forWriter)
    }

    @Test func onlyCleanSyncedFilesAreEvicted() {
        let file = SyncItem<T>(base: Base(record: Self.item(chunks: [Self.chunk]), present: nil))
        #expect(file.evictable(unsent: false, downloading: false))
        #expect(!file.evictable(unsent: true, downloading: false), "changes not uploaded yet")
        #expect(!file.evictable(unsent: false, downloading: true))
        var writing = file
        let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))
        writing.upload.on(.wrote, at: .s(0), rules: rules)
        #expect(!writing.evictable(unsent: false, downloading: false))
        var locked = file
        locked.upload.on(.lockHeld, at: .s(0), rules: rules)
        #expect(!locked.evictable(unsent: false, downloading: false))
        var held = file
        _ = held.remote.holdForLock(Self.item(chunks: [Self.chunk], version: 9))
        #expect(!held.evictable(unsent: false, downloading: false))
        #expect(!SyncItem<T>(base: Base(record: Self.item(), present: nil)).evictable(unsent: false, downloading: false), "empty: nothing to drop")
        let rulesFile = Self.item(name: ".nimbusignore", chunks: [Self.chunk])
        #expect(!SyncItem<T>(base: Base(record: rulesFile, present: nil)).evictable(unsent: false, downloading: false), "rules files stay")
        #expect(!SyncItem<T>(base: Base(record: Self.item(.folder), present: nil)).evictable(unsent: false, downloading: false))
        #expect(!SyncItem<T>().evictable(unsent: false, downloading: false), "never synced")
    }

    @Test func aPlaceMovedBackSinceTheCommitIsKept() {
        let previous = Self.item(parent: .root, name: "doc.txt")
        var moved = ItemDraft(previous)
        moved.name = ItemName(trusted: "doc.txt~")
        // The commit renamed it to the backup name; the tree has it under the old name again.
        #expect(SettleFacts.movedBackSinceCommit(previous: previous, sent: moved, here: (.root, "doc.txt"), relocate: false))
        #expect(!SettleFacts.movedBackSinceCommit(previous: previous, sent: moved, here: (.root, "doc.txt~"), relocate: false))
        #expect(!SettleFacts.movedBackSinceCommit(previous: previous, sent: ItemDraft(previous), here: (.root, "doc.txt"), relocate: false), "the commit moved nothing")
        #expect(!SettleFacts.movedBackSinceCommit(previous: nil, sent: moved, here: (.root, "doc.txt"), relocate: true), "a first commit")
        #expect(!SettleFacts.movedBackSinceCommit(previous: previous, sent: moved, here: nil, relocate: true), "gone here")
        #expect(SettleFacts.movedBackSinceCommit(previous: previous, sent: ItemDraft(previous), here: (Self.folder, "x"), relocate: true))
    }
}

extension LocalRulesTests {
    /// A folder's delete waits for the pushes of items the server has below it (a file moved
    /// out here, not committed yet, would go with the folder), at any depth; not for others.
    @Test func aFolderDeleteWaitsForPushesBelowItOnTheServer() {
        let folder = ItemID(UUID()), sub = ItemID(UUID()), moved = ItemID(UUID()), other = ItemID(UUID())
        let parents: [ItemID: ItemID] = [sub: folder, moved: sub, folder: .root, other: .root]
        let parentOf = { (id: ItemID) in parents[id] }
        #expect(CommitPlan.deleteWaitsForBelow(folder, pending: [moved], parentOf: parentOf))
        #expect(CommitPlan.deleteWaitsForBelow(folder, pending: [other, sub], parentOf: parentOf))
        #expect(!CommitPlan.deleteWaitsForBelow(folder, pending: [other, folder], parentOf: parentOf))
        #expect(!CommitPlan.deleteWaitsForBelow(sub, pending: [folder], parentOf: parentOf))
    }
}

extension LocalRulesTests {
    typealias Clock = ContinuousClock.Instant
    typealias Holder = CommitPlan.NameHolder<Clock>

    /// An item committed at a name the server has another item of this device at, which left it
    /// here: that item's push goes first (`mv a b && ln -s x a`), or, when it waits, this one
    /// waits as long; never for an item still there, parked, held by a program or refused, and
    /// never past the limit.
    @Test func anItemAtANameAnotherItemIsLeavingWaitsForThatPush() {
        let h = ItemID(UUID()), now = ContinuousClock.now
        let rules = UploadPacing<Clock>.Rules(quietPeriod: .seconds(1))
        func upload(_ events: UploadState<Clock>.Event...) -> UploadState<Clock> {
            var u = UploadState<Clock>()
            for e in events { u.on(e, at: now, rules: rules) }
            return u
        }
        func decide(_ holder: Holder?, since: Clock? = nil) -> CommitPlan.NameFirst<Clock>? {
            CommitPlan.nameFirst(holder, waitingSince: since, now: now)
        }
        #expect(decide(nil) == nil)
        #expect(decide(Holder(id: h, queued: true, leftHere: false)) == nil, "still there here: the name is really taken")
        #expect(decide(Holder(id: h, queued: true, leftHere: true)) == .pushFirst(h))
        #expect(decide(Holder(id: h, queued: true, onItsWay: true, leftHere: true)) == .nextRequest, "queued again since it was gathered")
        #expect(decide(Holder(id: h, queued: false, onItsWay: true, leftHere: true)) == nil,
                "its newest state is in the request: this item goes behind it in the same request")
        #expect(decide(Holder(id: h, queued: false, parked: true, leftHere: true)) == nil, "an ignored item's move stays here")
        // Not queued yet: the notice of its move is on its way.
        #expect(decide(Holder(id: h, queued: false, leftHere: true)) == .waitUntil(now.advanced(by: SyncItem<Clock>.noticeRecheck)))
        #expect(decide(Holder(id: h, queued: false, leftHere: true, shownThere: false)) == nil, "put there by a state held back here: nothing here moves it")
        #expect(decide(Holder(id: h, queued: false, leftHere: true, upload: upload(.lockHeld))) == nil, "a program's lock holds it")
        #expect(decide(Holder(id: h, queued: false, leftHere: true, upload: upload(.wrote))) == nil, "a program writing it holds it")
        #expect(decide(Holder(id: h, queued: false, leftHere: true, gone: true, upload: upload(.wrote))) == .waitUntil(now.advanced(by: SyncItem<Clock>.noticeRecheck)),
                "but not its delete")
        // Queued, waiting: as long as it waits.
        let later = now.advanced(by: .seconds(3))
        #expect(decide(Holder(id: h, queued: true, leftHere: true, upload: upload(.askAgain(until: later)))) == .waitUntil(later))
        #expect(decide(Holder(id: h, queued: true, leftHere: true, upload: upload(.askAgain(until: now)))) == .pushFirst(h))
        let failed = upload(.failed(.transient, message: "down", missingChunks: false))
        if case .failed(let f)? = failed.wait { #expect(decide(Holder(id: h, queued: true, leftHere: true, upload: failed)) == .waitUntil(f.at)) }
        let refused = upload(.failed(.refused, message: "no", missingChunks: false))
        #expect(decide(Holder(id: h, queued: true, leftHere: true, upload: refused)) == nil, "refused as it is: not waited for")
        // Bounded.
        #expect(decide(Holder(id: h, queued: true, leftHere: true, upload: upload(.askAgain(until: later))), since: now.advanced(by: .seconds(-10))) == .waitUntil(later))
        #expect(decide(Holder(id: h, queued: true, leftHere: true, upload: upload(.askAgain(until: later))),
                       since: now.advanced(by: .zero - CommitPlan.nameWaitLimit - .seconds(1))) == nil)
    }
}

extension LocalRulesTests {
    /// The item at a name goes first, and the one at its new name before it; a cycle (a swap)
    /// ends with the last one found; a wait or the next request stops the walk.
    @Test func thePushOrderFollowsTheChainOfNamesAndCutsCycles() {
        let (a, b, c) = (ItemID(UUID()), ItemID(UUID()), ItemID(UUID()))
        let later = ContinuousClock.now.advanced(by: .seconds(1))
        func order(_ holders: [ItemID: CommitPlan.NameFirst<Clock>], start: ItemID? = nil) -> CommitPlan.PushOrder<Clock> {
            CommitPlan.pushOrder(start: start ?? a, taken: a) { id, cycle in
                guard let h = holders[id] else { return nil }
                if case .pushFirst(let x) = h, cycle.contains(x) { return nil }
                return h
            }
        }
        #expect(order([:]) == .push(a))
        #expect(order([a: .pushFirst(b)]) == .push(b))
        #expect(order([a: .pushFirst(b), b: .pushFirst(c)]) == .push(c), "a chain")
        #expect(order([a: .pushFirst(b), b: .pushFirst(a)]) == .push(b), "a swap: the last one found goes")
        #expect(order([a: .pushFirst(b), b: .waitUntil(later)]) == .wait(until: later))
        #expect(order([a: .pushFirst(b), b: .nextRequest]) == .nextRequest(item: b))
        #expect(order([c: .pushFirst(b)], start: c) == .push(b), "from a folder created first")
        // A holder that answers without the cycle check still ends.
        let looping = CommitPlan.pushOrder(start: a, taken: a) { id, _ -> CommitPlan.NameFirst<Clock>? in .pushFirst(id == a ? b : a) }
        #expect(looping == .push(b))
        // The item found moved into a folder the server does not have yet: that folder first
        // (not for the item taken itself, whose folders the engine sends first already).
        let f = ItemID(UUID())
        let folders = [b: f, a: c]
        func ordered(_ holders: [ItemID: CommitPlan.NameFirst<Clock>]) -> CommitPlan.PushOrder<Clock> {
            CommitPlan.pushOrder(start: a, taken: a, folderFirst: { folders[$0] }) { id, _ in holders[id] }
        }
        #expect(ordered([a: .pushFirst(b)]) == .push(f))
        #expect(ordered([:]) == .push(a))
    }
}
