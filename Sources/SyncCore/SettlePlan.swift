import NimbusCore
import NimbusProtocol

/// What the device knows when the answer to its own commit of an item (not a delete) arrives:
/// one snapshot, read just before `SyncItem.planSettle`.
public struct SettleFacts: Sendable, Equatable {
    /// The answer is a delete made elsewhere, while we sent a live state (a create whose first
    /// answer was lost, sent again after another device deleted the item).
    public var deletedElsewhere: Bool
    /// A file written here since its content was read for the commit: its bytes are newer than
    /// what was sent.
    public var writtenSince: Bool
    /// The answer holds the content that was sent.
    public var sameContent: Bool
    /// The answer has the folder, name and mode that were sent.
    public var samePlace: Bool
    /// The item is in the tree here (not deleted here while the commit was on its way).
    public var existsHere: Bool
    /// The answer has the user attributes that were sent (the server merges those set elsewhere
    /// meanwhile, name by name: they are shown).
    public var sameXattrs: Bool

    public init(deletedElsewhere: Bool = false, writtenSince: Bool = false, sameContent: Bool = true, samePlace: Bool = true,
                existsHere: Bool = true, sameXattrs: Bool = true) {
        self.sameXattrs = sameXattrs
        self.deletedElsewhere = deletedElsewhere
        self.writtenSince = writtenSince
        self.sameContent = sameContent
        self.samePlace = samePlace
        self.existsHere = existsHere
    }
}

/// What becomes of the answer to an item's own commit.
public enum SettleStep: Sendable, Equatable {
    /// The answer is a delete made elsewhere. The previous base stays; the delete is shown like
    /// a pulled one unless the file was written since (`keptForWrite`): that write is committed
    /// next on the old base and wins as an edit against a delete.
    case deletedElsewhere(keptForWrite: Bool)
    /// The server kept what was sent: the answer becomes the base, nothing to show.
    case record
    /// Deleted here while the commit was on its way: showing the answer would bring it back.
    /// The queued delete goes next, on the answer when it holds what was sent, else on the
    /// previous base (none for a create: the delete then goes on the item's first version), so
    /// content from elsewhere that this device never showed wins over the delete.
    case deletedHere(onAnswer: Bool)
    /// The server's state differs from what was sent (a merge, a rename for a taken name, our
    /// edit kept as a conflict version): it is shown here (`resetContent`: other bytes). When it
    /// cannot be shown yet (its place is taken, or the file was written since), the previous
    /// base stays and the answer is held (`RemoteHolds.skipped`).
    case show(resetContent: Bool)
}

extension SyncItem {
    /// The answer to the item's own commit of a live state: what it becomes. Pure.
    public func planSettle(_ f: SettleFacts, isFile: Bool) -> SettleStep {
        if f.deletedElsewhere { return .deletedElsewhere(keptForWrite: isFile && f.writtenSince) }
        if f.sameContent && f.samePlace && (f.sameXattrs || Mutation.settleDropsMergedXattrs.isOn) { return .record }
        if !f.existsHere { return .deletedHere(onAnswer: f.sameContent || Mutation.deleteOnForeignAnswer.isOn) }
        return .show(resetContent: isFile && !f.sameContent)
    }
}

extension Base {
    /// The base the answer to a commit of `sent` content becomes: with the same content, what of
    /// it is here is the previous base's presence when that content was what it had (else all
    /// of it: the content was read here), or all of it when the file is whole here now (written
    /// while the commit was on its way); other content (a conflict kept ours apart) is not here.
    public static func fromAnswer(_ answer: ServerItem, sent: [ChunkRef], previous: Base?, wholeNow: Bool) -> Base {
        guard answer.chunks == sent else { return .placeholder(answer) }
        let present = wholeNow ? nil : previous.flatMap { $0.record.chunks == sent ? $0.present : nil }
        return Base(record: answer, present: present)
    }

    /// The base kept when the answer is a delete made elsewhere: the previous one, with what was
    /// downloaded or written here since (the base now, when it is still of the previous record):
    /// a placeholder overwritten while the commit was on its way is whole, and its next push
    /// must send those bytes.
    public static func keptOverDeleteElsewhere(now: Base?, previous: Base?) -> Base? {
        guard let now, now.record == previous?.record, !Mutation.forgetPresenceOnKeep.isOn else { return previous }
        return now
    }
}

extension SettleFacts {
    /// After an answer shown with the place here kept (`relocate`): the place here differs from
    /// the answer's, so the item is pushed again from there.
    public static func placeHereNewer(relocate: Bool, here: (parent: ItemID?, name: String)?, answer: ServerItem) -> Bool {
        guard relocate, let here else { return false }
        return here.parent != answer.parent || !ItemName.same(here.name, answer.name.value)
    }
}

/// What the engine does with the answer to its own commit, in order (`SettleStep.actions`,
/// `SettleShown.actions`).
public enum SettleAction: Sendable, Equatable {
    /// The item's base becomes this, in memory and on disk (nil: none).
    case saveBase(Base?)
    /// The push is over and the answer is shown as a pulled state would be.
    case showAsPulled
    /// The answer is shown here as the tree allows, its base in memory first (on disk once the
    /// tree's change is); what follows is `SettleShown.actions`.
    case show(resetContent: Bool, base: Base)
    /// Not shown: the answer waits like a skipped remote state, and the next start lists the
    /// container again.
    case holdAnswer
    /// The tree moved the item back since the commit: the next answer keeps the place here.
    case movedBack
    /// Shown: the base goes to disk after the tree's change.
    case persistShown(Base)
    /// The place here is newer than the answer's: pushed again from there.
    case pushAgain
    /// The server kept both contents: said in the log.
    case logConflict
    /// A delete is shown here: a live state no newer is old news from now on.
    case deleteShown(Int64)
    /// A folder came back: the container is listed again after the turn, for the items this
    /// device skipped while it was gone here (the journal has moved past them).
    case listAgain
}

public enum DeleteAnswer {
    /// The server has no such item any more (purged from Recently Deleted, docs/trash.md): the
    /// delete is done and nothing is left to show; its base goes. Kept retrying instead
    /// (`Mutation.deleteOfPurgedRetried`), the delete would stay queued for ever.
    public static func gone(code: APIErrorCode?) -> [SettleAction]? {
        guard code == .itemNotFound, !Mutation.deleteOfPurgedRetried.isOn else { return nil }
        return [.saveBase(nil)]
    }

    /// The answer to an item's own delete: no base either way. The delete is shown, or — the
    /// server ignored it (`delete_ignored`: edited elsewhere meanwhile) — the item comes back as
    /// a pulled state would, a folder with a listing of the container after it.
    public static func actions(_ answer: ServerItem) -> [SettleAction] {
        guard !answer.deleted else { return [.saveBase(nil), .deleteShown(answer.version)] }
        return [.saveBase(nil), .showAsPulled] + (answer.kind == .folder ? [.listAgain] : [])
    }
}

extension SettleStep {
    /// The actions of the step, for an answer whose base is `answer`; `previous`: the base the
    /// commit was sent on; `now`: the base in memory now.
    public func actions(answer: Base, previous: Base?, now: Base?, conflict: Bool) -> [SettleAction] {
        let conflictLine: [SettleAction] = conflict ? [.logConflict] : []
        switch self {
        case .deletedElsewhere(let keptForWrite):
            // The previous base stays: with the delete as its base while the item stays here,
            // the journal's delete would be old news and the item would stay for good.
            let kept = SettleAction.saveBase(Base.keptOverDeleteElsewhere(now: now, previous: previous))
            return keptForWrite ? [kept] : [kept, .showAsPulled]
        case .record:
            return [.saveBase(answer)] + conflictLine
        case .deletedHere(let onAnswer):
            return [.saveBase(onAnswer ? answer : previous)]
        case .show(let resetContent):
            return [.show(resetContent: resetContent, base: answer)] + conflictLine
        }
    }
}

/// What the tree's showing of a commit's answer leads to.
public struct SettleShown: Sendable, Equatable {
    /// The tree showed it (else its place is taken, its folder missing, or the file was
    /// written since its content was read).
    public var shown: Bool
    public var previous: Base?
    public var answer: Base
    /// The answer holds the content sent (not a merge, nor another device's edit).
    public var answerIsSent: Bool
    public var isFile: Bool
    /// Every byte of the file is here: written since, or whole when the push began.
    public var wholeHere: Bool
    /// `SettleFacts.movedBackSinceCommit`.
    public var movedBack: Bool
    /// `SettleFacts.placeHereNewer`.
    public var placeHereNewer: Bool

    public init(shown: Bool, previous: Base?, answer: Base, answerIsSent: Bool = true, isFile: Bool, wholeHere: Bool, movedBack: Bool,
                placeHereNewer: Bool) {
        self.shown = shown
        self.answerIsSent = answerIsSent
        self.previous = previous
        self.answer = answer
        self.isFile = isFile
        self.wholeHere = wholeHere
        self.movedBack = movedBack
        self.placeHereNewer = placeHereNewer
    }

    /// Shown: its base goes to disk, and a newer place here is pushed again. Not shown: the
    /// item stays as it is under its previous base (so the answer still counts as news, and a
    /// write goes on the base it was made on: both contents are kept) and the answer waits.
    public var actions: [SettleAction] {
        guard shown else {
            let kept = Base.keptWhenNotShown(previous: previous, answer: answer, answerIsSent: answerIsSent, isFile: isFile,
                                             wholeHere: wholeHere)
            return [.saveBase(kept), .holdAnswer] + (movedBack ? [.movedBack] : [])
        }
        return [.persistShown(answer)] + (placeHereNewer ? [.pushAgain] : [])
    }
}
