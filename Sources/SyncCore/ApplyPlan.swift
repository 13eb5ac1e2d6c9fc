import NimbusCore

/// What the device knows about an item when a server state of it arrives (from the journal, a
/// listing or a commit's answer): one snapshot, read just before `SyncItem.planApply`.
public struct ApplyFacts: Sendable, Equatable {
    /// The version shown here (the item's base); nil when the server's state of it was never
    /// shown here or it was deleted here.
    public var shownVersion: Int64?
    /// The content shown here differs from the arriving state's (false when nothing is shown).
    public var contentDiffers: Bool
    /// Shown even if the version shown here is as new (a commit's answer, a listing after a
    /// restart).
    public var forced: Bool
    /// The item's own push is queued or on its way: its answer supersedes this state, or the
    /// server keeps both.
    public var pushPending: Bool
    /// The tree holds the item in another folder or under another name than this state, or not
    /// at all, with no local change of it pending: a state recorded as the base but not shown (a
    /// commit's answer whose place was taken here, when the note that it waits was lost with a
    /// restart; an item a folder delete took with it after the server had moved it out).
    public var placeDiffers: Bool
    /// The tree does not hold the item at all although it has a base (a folder delete took it
    /// with it after the server had moved it out): its bytes went with it, so showing it again
    /// makes a placeholder, whatever the base says was downloaded.
    public var absent: Bool
    /// The file is open for writing here, or written since its last close or fsync.
    public var openForWriting: Bool
    /// For a folder delete only: an item below the folder has local work not uploaded yet
    /// (queued, on its way, or open for writing).
    public var localWorkBelow: Bool
    /// For a folder delete only: an item below the folder was synced at a version newer than
    /// the delete (the server kept it and brought the folder back; that news is on its way).
    public var newerBelow: Bool
    /// The version of a delete of this item shown here since the engine started (its base is
    /// gone with it): a state no newer is old news — a listing read before the delete and
    /// answered after it would bring the item back.
    public var deleteShown: Int64?

    public init(shownVersion: Int64?, contentDiffers: Bool = false, forced: Bool = false, pushPending: Bool = false,
                placeDiffers: Bool = false, absent: Bool = false, openForWriting: Bool = false, localWorkBelow: Bool = false,
                newerBelow: Bool = false, deleteShown: Int64? = nil) {
        self.shownVersion = shownVersion
        self.contentDiffers = contentDiffers
        self.forced = forced
        self.pushPending = pushPending
        self.placeDiffers = placeDiffers
        self.absent = absent
        self.openForWriting = openForWriting
        self.localWorkBelow = localWorkBelow
        self.newerBelow = newerBelow
        self.deleteShown = deleteShown
    }
}

/// What becomes of a server state that arrived for an item.
public enum ApplyStep: Sendable, Equatable {
    /// Already shown (our own commit coming back) or older than what is shown: nothing to do.
    case oldNews
    /// Held until the item's own push answers (`RemoteHolds.forWriter`).
    case heldForPush
    /// Held until the program writing the file here is done (`RemoteHolds.forWriter`): never
    /// mixed with, or replacing, bytes being written; a delete waits too, so what the writer
    /// saves is committed on the old base and wins as an edit against a delete.
    case heldForWriter
    /// A folder deleted elsewhere that holds local work (or newer items) stays; the delete is
    /// tried again after the pushes (`RemoteHolds.skipped`).
    case folderKept
    /// Shown in the tree. `resetContent`: the file's content is replaced (its bytes are no longer
    /// here). `underClaim`: new content of a file shown before, put in under a write claim (a
    /// program holding a lock makes it wait).
    case show(resetContent: Bool, underClaim: Bool)

    /// The item's state waits here and the next start must list the container again.
    public var holds: Bool {
        switch self {
        case .heldForPush, .heldForWriter, .folderKept: true
        case .oldNews, .show: false
        }
    }
}

extension SyncItem {
    /// Decides what becomes of `server`, a state of this item that arrived, and records the hold
    /// it makes (or lets go of the holds it overtakes). Pure; the order of the checks is the rule:
    /// old news (also: no newer than a delete shown), the item's own push, a writer here, a
    /// folder delete over local work, else shown.
    public mutating func planApply(_ server: ServerItem, _ f: ApplyFacts) -> ApplyStep {
        // A state waiting to be shown (a commit's answer whose place was taken here) is shown
        // although its version is the base's.
        let notShown = remote.skipped?.version == server.version || f.placeDiffers
        if let gone = f.deleteShown, server.version <= gone, !Mutation.resurrectFromStaleListing.isOn {
            remote.drop(upTo: gone)
            return .oldNews
        }
        // A newer state already waits to be shown here (its folder missing, its name taken): an
        // older one — from a listing read before it — must not take its place.
        if let waiting = remote.skipped?.version, waiting > server.version, !Mutation.olderOverWaiting.isOn {
            return .oldNews
        }
        if let shown = f.shownVersion, !f.forced, shown > server.version || (shown == server.version && !notShown) {
            // A state waiting to be shown that a newer one has overtaken waits no more, nor do
            // versions held for a lock or a writer that are shown already.
            if shown > server.version, (remote.skipped?.version ?? .max) <= shown { remote.skipped = nil }
            remote.drop(upTo: shown)
            return .oldNews
        }
        if f.pushPending, !Mutation.dropPushHold.isOn {
            remote.holdForWriter(server)
            return .heldForPush
        }
        let isFile = server.kind == .file
        if f.shownVersion != nil, isFile, server.deleted || f.contentDiffers, f.openForWriting, !Mutation.dropWriterHold.isOn {
            remote.forWriter = server
            return .heldForWriter
        }
        if server.deleted, server.kind == .folder, f.localWorkBelow || f.newerBelow, !Mutation.folderDeleteOverLocalWork.isOn {
            remote.skipped = server
            return .folderKept
        }
        // Shown: the holds it overtakes go (a version held for a push that ended without a
        // commit, then overtaken, stayed held for good).
        remote.drop(upTo: server.version)
        let contentChanged = f.shownVersion == nil || f.contentDiffers || (f.absent && !Mutation.showAbsentAsDownloaded.isOn)
        return .show(resetContent: isFile && contentChanged,
                     underClaim: f.shownVersion != nil && isFile && !server.deleted && f.contentDiffers)
    }
}

/// An item below a folder whose delete arrived from the server, as this device sees it.
public struct BelowDeletedFolder: Sendable, Equatable {
    public var id: ItemID
    /// Local work not uploaded yet: queued, on its way, written, or open for writing.
    public var localWork: Bool
    /// The version synced here (its base); nil when never synced.
    public var baseVersion: Int64?
    /// Where the server has it now, when that is not shown here yet (a live state in the same
    /// batch, or one skipped for a taken name): nil when the tree shows the server's place.
    public var serverParent: ItemID?

    public init(id: ItemID, localWork: Bool, baseVersion: Int64?, serverParent: ItemID?) {
        self.id = id
        self.localWork = localWork
        self.baseVersion = baseVersion
        self.serverParent = serverParent
    }
}

/// What a folder delete from the server finds below the folder here. Pure.
public enum FolderDeletePlan {
    /// The facts of `ApplyFacts` a folder delete at `version` needs, and `leaving`: the delete
    /// takes items the server moved out of the folder before it (their moves not shown here
    /// yet), so the container is listed again to bring them back where the server has them.
    /// `descendants` gives what is below an item in the tree here.
    public static func facts(folder: ItemID, version: Int64, below: [BelowDeletedFolder],
                             descendants: (ItemID) -> [ItemID]) -> (localWorkBelow: Bool, newerBelow: Bool, leaving: Bool) {
        let ids = Set(below.map(\.id))
        let leavers = below.filter { b in b.serverParent.map { $0 != folder && !ids.contains($0) } ?? false }.map(\.id)
        // What is below an item moving out does not hold the delete back: it may wait for the
        // kept folder's name. A stale delete (asked for just before an upload into the folder
        // finished) would take the uploaded file with it.
        let gone = Set(leavers + leavers.flatMap(descendants))
        return (localWorkBelow: below.contains(where: \.localWork),
                newerBelow: below.contains { !gone.contains($0.id) && ($0.baseVersion ?? 0) > version },
                leaving: !leavers.isEmpty)
    }
}

/// What `ApplyFacts.gather` may ask about an item, asked only when a rule needs the answer.
public struct ApplyLookups {
    /// Where the tree here has the item (nil: not in the tree).
    public var place: (ItemID) -> (parent: ItemID?, name: String)?
    /// The file is open for writing here, or written since its last close or fsync (nil: not a
    /// file here).
    public var openForWriting: (ItemID) -> Bool?
    /// The items below a folder here, as the engine sees each (`BelowDeletedFolder`).
    public var below: (ItemID) -> [BelowDeletedFolder]
    /// Every item below one here.
    public var descendants: (ItemID) -> [ItemID]

    public init(place: @escaping (ItemID) -> (parent: ItemID?, name: String)?, openForWriting: @escaping (ItemID) -> Bool?,
                below: @escaping (ItemID) -> [BelowDeletedFolder], descendants: @escaping (ItemID) -> [ItemID]) {
        self.place = place
        self.openForWriting = openForWriting
        self.below = below
        self.descendants = descendants
    }
}

extension ApplyFacts {
    /// The facts of an arriving state `item`, over `old` (its base here), with the lookups each
    /// rule needs made only when it applies: the place, for a state as new as the base with no
    /// push pending; the writer, for new content or a delete of a file shown here; what is
    /// below, for a folder delete. `leaving`: the folder delete takes items the server moved out
    /// of it (`FolderDeletePlan`).
    public static func gather(_ item: ServerItem, old: Base?, pushPending: Bool, forced: Bool, deleteShown: Int64?,
                              _ look: ApplyLookups) -> (facts: ApplyFacts, leaving: Bool) {
        let contentDiffers = old.map { $0.record.chunks != item.chunks } ?? false
        var facts = ApplyFacts(shownVersion: old?.version, contentDiffers: contentDiffers, forced: forced, pushPending: pushPending,
                               deleteShown: old == nil ? deleteShown : nil)
        if let old, old.version == item.version, !pushPending, !item.deleted {
            let place = look.place(item.id)
            facts.placeDiffers = place.map { $0.parent != item.parent || !ItemName.same($0.name, item.name.value) } ?? true
            facts.absent = place == nil
        } else if old != nil, !pushPending, item.kind == .file, !item.deleted, !contentDiffers {
            // A newer state of a file taken from the tree meanwhile is shown; its bytes are gone.
            facts.absent = look.place(item.id) == nil
        }
        if old != nil, item.kind == .file, item.deleted || contentDiffers {
            facts.openForWriting = look.openForWriting(item.id) ?? false
        }
        guard item.deleted, item.kind == .folder else { return (facts, false) }
        let f = FolderDeletePlan.facts(folder: item.id, version: item.version, below: look.below(item.id), descendants: look.descendants)
        (facts.localWorkBelow, facts.newerBelow) = (f.localWorkBelow, f.newerBelow)
        return (facts, f.leaving)
    }
}

/// What the engine does for an arriving state, in order (`ApplyStep.actions`).
public enum ApplyAction: Sendable, Equatable {
    /// The state waits here: the next start lists the container again.
    case markRelist
    /// The batch lists the container again after it (a folder delete took items the server had
    /// moved out of it).
    case relistAfter
    /// A delete shown: a live state no newer is old news from now on (`ApplyFacts.deleteShown`).
    case deleteShown(Int64)
    /// New content goes in under a write claim: while a program holds a lock the state waits.
    case claim
    /// Shown in the tree with `base` as the item's base once it is; `frozen`: what of the old
    /// content open readers may still read (the old base's presence).
    case show(resetContent: Bool, base: Base?, frozen: Base?)
}

extension ApplyStep {
    /// The actions of the step for the arriving `item` over `old`; `leaving` from
    /// `ApplyFacts.gather`: only a delete that goes in takes the items moving out (a kept one is
    /// retried, and listing again at every retry would list for ever).
    /// The base once `item` is shown: a file whose content is reset has none of it here (its
    /// bytes went with what took it from the tree, `ApplyFacts.absent`, although the base says
    /// the same content was downloaded).
    static func base(_ item: ServerItem, over old: Base?, resetContent: Bool) -> Base? {
        resetContent && !item.deleted ? .placeholder(item) : Base.afterShowing(item, over: old)
    }

    public func actions(_ item: ServerItem, old: Base?, leaving: Bool) -> [ApplyAction] {
        switch self {
        case .oldNews:
            return []
        case .heldForPush, .heldForWriter, .folderKept:
            return [.markRelist]
        case .show(let resetContent, let underClaim):
            let frozen = resetContent ? old.flatMap { o in o.present.map { Base(record: o.record, present: $0) } } : nil
            return (leaving ? [.relistAfter] : []) + (item.deleted ? [.deleteShown(item.version)] : []) + (underClaim ? [.claim] : [])
                + [.show(resetContent: resetContent, base: Self.base(item, over: old, resetContent: resetContent), frozen: frozen)]
        }
    }
}
