import NimbusCore
import NimbusProtocol

/// What an arriving state does to a file shown here, for the programs presenting it: they are
/// asked to let go of it first (docs/presenters.md).
public enum ArrivingChange: Sendable, Equatable {
    /// Other content replaces the file.
    case replace
    /// The file goes.
    case delete

    /// Nil when it changes nothing a presenter holds: not a file, not newer than what is shown,
    /// or the same content.
    public static func of(_ item: ServerItem, over old: Base?) -> ArrivingChange? {
        guard let old, old.version < item.version, item.kind == .file else { return nil }
        if item.deleted { return .delete }
        return old.record.chunks != item.chunks ? .replace : nil
    }
}

/// Skipped states to show again. A folder delete is replaced by the folder's current state on
/// the server (`asksServer`): a delete kept for local work is usually overtaken by the upload of
/// that work (the server brings the folder back), and applying the stale delete before the
/// journal says so would remove the folder with the file just uploaded.
public struct SkippedRetry: Sendable, Equatable {
    public private(set) var items: [ServerItem] = []
    /// Newer states of kept folders, waiting to be shown like the states they overtake.
    public private(set) var overtaking: [ServerItem] = []

    public init() {}

    public var isEmpty: Bool { items.isEmpty && purged.isEmpty }

    /// The server is asked for the item's current state before it is tried again.
    public static func asksServer(_ item: ServerItem) -> Bool { item.deleted && item.kind == .folder }

    /// A skipped state tried again as it is.
    public mutating func add(_ item: ServerItem) { items.append(item) }

    /// A folder delete with the server's current state of the folder (nil: the server could not
    /// be asked now, and it waits for the next try).
    public mutating func add(_ item: ServerItem, current: ServerItem?) {
        guard let now = current else { return }
        if now.version > item.version { overtaking.append(now) }
        items.append(now.version >= item.version ? now : item)
    }

    /// A folder delete whose folder the server no longer has (purged from Recently Deleted):
    /// its delete for good is tried, made in the turn that shows it (`purgedDeletes`) from the
    /// state shown then. `asked` is the version shown here when the server was asked.
    public mutating func addGone(_ item: ServerItem, asked: Int64?) {
        purged.append(Purged(item: item, asked: asked))
    }

    /// Folders the server answered it has no more, with the version shown here when it was asked.
    public private(set) var purged: [Purged] = []

    public struct Purged: Sendable, Equatable {
        public var item: ServerItem
        public var asked: Int64?
    }

    /// The deletes for good of `purged` (`PurgedItem.deleted`), from what is shown here now
    /// (`shown`: the state of an id shown here, nil for none).
    public func purgedDeletes(shown: (ItemID) -> ServerItem?, cursor: Int64) -> [ServerItem] {
        purged.compactMap { p in
            let now = shown(p.item.id)
            return PurgedItem.deleted(now ?? p.item, asked: now == nil ? p.item.version : p.asked, cursor: cursor)
        }
    }
}

/// An item the server answers it has no more (`item_not_found`: purged from Recently Deleted,
/// docs/trash.md) while this device still shows it: it is deleted for good. Its state is made
/// from what is known of it, deleted, at the container's `cursor` (or just past the version
/// known), so it is newer than any state of it shown here; a state the server makes of that id
/// later (a device's edit brings it back) is newer still. Waiting for a state that never comes
/// would keep it here for good (`Mutation.purgedItemStays`).
///
/// `asked` is the version shown here when the server was asked. When a newer state was shown
/// meanwhile, the answer is older than it (this device's own commit brought the item back on the
/// server after the server answered), and nothing is made: the made delete would be newer than
/// the server's live item and remove it here alone (`Mutation.purgeOverNewerState`).
public enum PurgedItem {
    public static func deleted(_ known: ServerItem, asked: Int64?, cursor: Int64) -> ServerItem? {
        if Mutation.purgedItemStays.isOn { return nil }
        guard known.version == asked || Mutation.purgeOverNewerState.isOn else { return nil }
        var gone = known
        gone.deleted = true
        gone.version = max(known.version + 1, cursor)
        return gone
    }
}

/// What a relist does with its ask about an item shown here that the listing lacks (deleted or
/// purged there), when the ask failed. The mark that made the relist due is cleared only when
/// it ends; the states it finds were held in memory only (a restart lost them), so an item left
/// unasked would stay here for good.
public enum MissingItemAsk: Sendable, Equatable {
    /// Purged from Recently Deleted: deleted for good (`PurgedItem.deleted`).
    case purged
    /// The relist fails and stays due: the pull asks again after its back-off.
    case relistAgain
    /// Refused as a request (not about the item): the item is left as it is.
    case skip

    public static func of(code: APIErrorCode?, failure: UploadFailure) -> MissingItemAsk {
        if code == .itemNotFound { return .purged }
        if failure == .refused { return .skip }
        return Mutation.relistDropsUnanswered.isOn ? .skip : .relistAgain
    }
}
