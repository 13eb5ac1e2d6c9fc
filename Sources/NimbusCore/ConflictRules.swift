/// The concurrency rules (docs/protocol.md "Commit") as pure functions. The store calls them inside the commit
/// transaction; they read no clock and touch no storage, so they are tested as tables.
///
/// The model is a three-way merge per field group, with the state at the committer's
/// `baseVersion` as the common ancestor:
/// - **content** (chunks or symlink target, with its modification time): changed on one side →
///   that side; changed identically on both → no conflict; changed differently on both → a
///   conflict: the state with the later modification time (ties: device id) becomes current and
///   the other is kept as an unresolved conflict version. Nothing is discarded.
/// - **location** (folder and name) and **mode**: changed by the committer → the committer's,
///   else the current one (last writer wins; a rename on one device and an edit on another both
///   survive: the edit follows the renamed item). **extra** (the item's user attributes among
///   its fields) the same, field by field and attribute by attribute (`mergeExtra`).
/// - **delete vs edit**: the edit wins. A delete whose base is stale is ignored when the content
///   changed since that base; an edit of a deleted item brings it back with the edited content.
public enum ConflictRules {
    public enum Decision: Equatable, Sendable {
        /// Nothing changes (the commit restates the current state, or is a delete of a deleted item).
        case unchanged
        /// `state` becomes the current state.
        case apply(ItemState)
        /// `current` becomes the current state and `conflict` is kept as an unresolved conflict version.
        case conflict(current: ItemState, conflict: ItemState)
        /// The commit was a delete, but someone edited the item since the committer's base: the
        /// item stays as it is (the committer must pull it back).
        case deleteLost
    }

    /// Decides a commit of `incoming` on an item whose state is `current`.
    ///
    /// - Parameters:
    ///   - base: the state at the committer's base version; `nil` when the base is unknown (pruned
    ///     history or a version that never existed), which makes every difference a conflict.
    ///   - baseIsCurrent: the committer's base version is the item's current version.
    ///   - mergeExtra: merges `extra` (base, current, incoming) when the committer changed it
    ///     since its base; the server's is field by field (`ExtraMerge`), the default takes the
    ///     committer's whole.
    ///   - placeIfUnmoved: the committer's folder and name apply only if the item's place is the
    ///     base's (a place the device did not choose: docs/protocol.md); with an unknown base, never.
    public static func decide(base: ItemState?, current: ItemState, incoming: ItemState, baseIsCurrent: Bool,
                              placeIfUnmoved: Bool = false,
                              mergeExtra: (String?, String?, String?) -> String? = { _, _, incoming in incoming }) -> Decision {
        if baseIsCurrent { return incoming == current ? .unchanged : .apply(incoming) }
        var incoming = incoming
        if placeIfUnmoved, !incoming.deleted, base.map({ $0.location != current.location }) ?? true {
            incoming.location = current.location
        }
        if incoming == current { return .unchanged }

        let remoteContentChanged = base.map { $0.content != current.content || $0.deleted != current.deleted } ?? true
        let localContentChanged = base.map { $0.content != incoming.content } ?? (incoming.content != current.content)

        // Delete with a stale base.
        if incoming.deleted {
            if current.deleted { return .unchanged }
            // Unknown base: we cannot prove the content is what the deleter saw, so keep it.
            guard let base, base.content == current.content else { return .deleteLost }
            var gone = current
            gone.deleted = true
            gone.modified = max(incoming.modified, current.modified)
            gone.modifiedBy = incoming.modifiedBy
            return .apply(gone)
        }

        // Edit of an item that was deleted since the base: the edit wins and brings it back;
        // an edit that did not touch content (a rename, a chmod) does not revive it.
        if current.deleted {
            guard localContentChanged else { return .unchanged }
            var revived = incoming
            revived.deleted = false
            // Its fields (user attributes) as merged for a live item: set elsewhere before the
            // delete, and not changed by this editor, they come back with it.
            if let base { revived.extra = incoming.extra == base.extra ? current.extra : mergeExtra(base.extra, current.extra, incoming.extra) }
            return .apply(revived)
        }

        var merged = current
        if let base {
            if incoming.location != base.location { merged.location = incoming.location }
            if incoming.mode != base.mode { merged.mode = incoming.mode }
            if incoming.extra != base.extra { merged.extra = mergeExtra(base.extra, current.extra, incoming.extra) }
        } else {
            merged.location = incoming.location
            merged.mode = incoming.mode
            merged.extra = incoming.extra ?? current.extra
        }

        if !localContentChanged || incoming.content == current.content {
            // Content: keep the current one (it is either unchanged by us or identical to ours).
            if incoming.content == current.content && localContentChanged {
                merged.modified = max(current.modified, incoming.modified)
            }
            return merged == current ? .unchanged : .apply(merged)
        }
        if !remoteContentChanged {
            merged.content = incoming.content
            merged.modified = incoming.modified
            merged.modifiedBy = incoming.modifiedBy
            return .apply(merged)
        }

        // Both sides changed the content differently: a true conflict.
        var theirs = merged
        theirs.content = incoming.content
        theirs.modified = incoming.modified
        theirs.modifiedBy = incoming.modifiedBy
        if theirs.winsOver(current) {
            var loser = current
            loser.location = theirs.location
            return .conflict(current: theirs, conflict: loser)
        } else {
            return .conflict(current: merged, conflict: theirs)
        }
    }

    /// Whether moving `item` into `newParent` would put a folder inside itself.
    /// `parentOf` returns the parent of a live item, `nil` for the root or an unknown item.
    /// The walk is bounded by `maxDepth` so a corrupt store cannot loop forever; hitting the bound
    /// counts as a cycle (the move is refused rather than risked).
    public static func wouldCreateCycle(moving item: ItemID, into newParent: ItemID, maxDepth: Int = 10_000, parentOf: (ItemID) throws -> ItemID?) rethrows -> Bool {
        var cursor: ItemID? = newParent
        var depth = 0
        while let c = cursor {
            if c == item { return true }
            if c.isRoot { return false }
            depth += 1
            if depth > maxDepth { return true }
            cursor = try parentOf(c)
        }
        return false
    }
}
