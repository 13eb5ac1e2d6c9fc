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
    /// There was a base before this commit.
    public var hadBase: Bool

    public init(deletedElsewhere: Bool = false, writtenSince: Bool = false, sameContent: Bool = true, samePlace: Bool = true,
                existsHere: Bool = true, hadBase: Bool = true) {
        self.deletedElsewhere = deletedElsewhere
        self.writtenSince = writtenSince
        self.sameContent = sameContent
        self.samePlace = samePlace
        self.existsHere = existsHere
        self.hadBase = hadBase
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
    /// The queued delete goes next, on the answer when it holds what was sent (or there was no
    /// base), else on the previous base, so content from elsewhere wins over the delete.
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
        if f.sameContent && f.samePlace { return .record }
        if !f.existsHere { return .deletedHere(onAnswer: f.sameContent || !f.hadBase) }
        return .show(resetContent: isFile && !f.sameContent)
    }
}
