import NimbusCore
import NimbusProtocol

// Smaller rules the engine asks about one item at a time: what a commit would change, which
// folder goes first, what waits when the tree cannot show a state, what may be evicted, and
// whether a commit's answer must keep a place the item was moved back to. Pure.

extension ItemDraft {
    /// The draft with another modification time.
    public func withModified(_ m: Int64) -> ItemDraft {
        var d = self
        d.modified = m
        return d
    }
}

/// What a push compares before it commits.
public enum CommitPlan {
    /// What follows the answer to a commit, once it is settled.
    public enum AfterAnswer: Sendable, Equatable {
        /// A newer version held for this file's push or writer goes in now.
        case applyHeld
        /// A snapshot of a file kept open went up: its queue entries stay (a crash before its
        /// close still uploads the final content) and the close or the next quiet period sends
        /// what follows.
        case snapshotSent(UInt64)
        /// The queue entries the commit covered go.
        case removeQueued
    }

    public static func afterAnswer(snapshot: UInt64?) -> [AfterAnswer] {
        snapshot.map { [.snapshotSent($0)] } ?? [.applyHeld, .removeQueued]
    }

    /// A folder's delete waits while an item the server has below it still has a push to make
    /// (moved out of the folder here, or deleted here): the server's folder delete takes what it
    /// holds below the folder, so a file moved out here and not yet committed would go with it.
    /// `parentOf` is the server's parent of an item (its base); the walk is bounded.
    public static func deleteWaitsForBelow(_ folder: ItemID, pending: [ItemID], parentOf: (ItemID) -> ItemID?) -> Bool {
        if Mutation.folderDeleteBeforeMovesOut.isOn { return false }
        return pending.contains { id in
            guard id != folder else { return false }
            var p = parentOf(id)
            for _ in 0..<4096 {
                guard let cur = p else { return false }
                if cur == folder { return true }
                p = parentOf(cur)
            }
            return false
        }
    }

    /// Nothing to send: the draft is the base's state (a save that changed only the
    /// modification time commits nothing, so it makes no false conflicts), unless that time was
    /// set on purpose (`touch -d`, `cp -p`, `rsync -t`: an attributes change), or the base is a
    /// delete (a create after it must go).
    public static func nothingToSend(base: ServerItem?, draft: ItemDraft, timeSetOnPurpose: Bool) -> Bool {
        guard let base, !base.deleted else { return false }
        if timeSetOnPurpose, base.modified != draft.modified { return false }
        return ItemDraft(base) == draft.withModified(base.modified)
    }

    /// How many times a never-committed folder is pushed ahead of an item inside it before it
    /// counts as failing (a folder that cannot be committed never keeps the loop spinning).
    public static var pushAheadLimit: Int { 5 }

    /// The topmost folder of `above` (the item's folders, nearest first, the root left out) that
    /// exists here but was never committed, so it is created before the item (else the server
    /// answers `parent_not_found` and the item would wait for good); nil when every one is on
    /// the server, refused for good, or pushed ahead `pushAheadLimit` times already.
    public static func folderFirst<Instant>(above: [ItemID], onItsWay: (ItemID) -> Bool = { _ in false },
                                            _ record: (ItemID) -> SyncItem<Instant>?) -> ItemID? {
        above.last { id in
            // A folder gathered into the batch this item joins goes before it in that request.
            if onItsWay(id) { return false }
            let r = record(id)
            return r?.base == nil && r?.upload.refused != true && (r?.upload.pushedAhead ?? 0) < pushAheadLimit
        }
    }
}

/// The commits one request carries (`POST …/commits`): the pushes of the items next in the
/// queue, gathered while each is a commit ready to go, then sent together and settled one by
/// one in queue order, as if sent one after the other. The server applies them in that order;
/// nothing else of this device reaches it in between.
public struct CommitBatch: Sendable, Equatable {
    /// What the gathered commits do before the next item's push.
    public enum Next: Sendable, Equatable {
        /// It joins them.
        case join
        /// They go first: a delete must reach the server after the commits queued before it
        /// (a folder's delete would otherwise take a child committed after it, and a create sent
        /// after its folder's delete brings the folder back), and content that goes up before
        /// its commit would hold them back.
        case sendFirst
    }

    public static var maxCommits: Int { ProtocolLimits.maxBatchCommits }
    /// About what the gathered requests may weigh as JSON (the server takes 8 MiB).
    public static var maxBytes: Int { 1 << 20 }

    public private(set) var commits = 0
    public private(set) var bytes = 0

    public init() {}

    /// The next push: a delete, or a commit whose content is read here (`needsContent`) and, over
    /// what travels inside a commit, uploaded before it.
    public static func next(isDelete: Bool, needsContent: Bool, size: Int64) -> Next {
        isDelete || (needsContent && size > ProtocolLimits.inlineFileBytes) ? .sendFirst : .join
    }

    /// A commit of about `chunks` chunk references and `inlineBytes` bytes inside it joins.
    public mutating func add(chunks: Int, inlineBytes: Int) {
        commits += 1
        bytes += 400 + chunks * 100 + inlineBytes * 4 / 3
    }

    /// No more: the next item's push starts the next request.
    public var isFull: Bool { commits >= Self.maxCommits || bytes >= Self.maxBytes }
}

extension SyncItem {
    /// A state the tree could not show (its folder missing, its name taken, or the file being
    /// written or changed here) waits: for the writer when the file was shown here before and is
    /// open for writing or written since its last close (`RemoteHolds.forWriter`: its close lets
    /// it in), else until what was in the way has moved (`RemoteHolds.skipped`, retried after
    /// pushes and pulls, and by a relist after a restart).
    public mutating func notShown(_ server: ServerItem, shownBefore: Bool, openForWriting: Bool) {
        if server.kind == .file, !server.deleted, shownBefore, openForWriting, !Mutation.dropWriterHold.isOn {
            remote.forWriter = server
        } else {
            remote.skipped = server
        }
    }

    /// Whether the cached bytes of this file may be dropped: a file with content, nothing of it
    /// on its way up (queued, in flight, being written), no program's lock on it or version
    /// waiting for one, no download of it under way. Never a `.nimbusignore`: pushes below one
    /// wait while its rules are not here.
    public func evictable(unsent: Bool, downloading: Bool) -> Bool {
        guard let b = base, b.record.kind == .file, !b.record.chunks.isEmpty else { return false }
        if ItemName.same(b.record.name.value, IgnoreMatch.fileName) { return false }
        if unsent, !Mutation.evictUnsentWrites.isOn { return false }
        return !upload.waitingForLock && remote.forLock == nil && !upload.writing && !downloading
    }
}

extension SettleFacts {
    /// After a commit that moved the item (or one sent while `relocate` was due), whether the
    /// tree has put it back since — an editor's save renamed the document to a backup name while
    /// the commit was on its way, then a new file took its name and identity. Then the next
    /// commit, on the previous base, looks like no move to the server, which keeps our earlier
    /// one: that answer must not move the item, and the item is pushed once more (`relocate`).
    public static func movedBackSinceCommit(previous: ServerItem?, sent: ItemDraft, here: (parent: ItemID?, name: String)?,
                                            relocate: Bool) -> Bool {
        guard let previous, let here else { return false }
        if relocate { return true }
        let commitMoved = previous.parent != sent.parent || previous.name != sent.name
        return commitMoved && here.parent == previous.parent && ItemName.same(here.name, previous.name.value)
    }
}
