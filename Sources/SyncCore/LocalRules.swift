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

    /// What an item's push does about the item the server has at the place the item takes here
    /// (`nameFirst`).
    public enum NameFirst<Instant: InstantProtocol>: Sendable, Equatable where Instant.Duration == Duration, Instant: Sendable {
        /// That item's push goes first: it was moved away or deleted here, and until the server
        /// has that, the server finds the name taken and puts this item beside it (`NAME 2`) on
        /// every device (`mv a b && ln -s x a`, `mv a b && mv c a`, `rmdir d && mkdir d`).
        case pushFirst(ItemID)
        /// That item's push is in the request being gathered and it is queued again since: its
        /// state in the request may be one decided before it left the name, so this item goes
        /// in the next request, after its answer. (Not queued again, the state in the request
        /// is its newest: this item joins the request behind it, and the server takes a
        /// request's commits in order; a notice of a move still on its way is covered by
        /// `CommitBatch.holds`, which keeps a second commit at that name out of the request.)
        case nextRequest
        /// That item's push waits (backing off after a failure, paced, a moment for a save or
        /// the pushes below a deleted folder): this item waits as long, keeping its place.
        case waitUntil(Instant)
    }

    /// What the push loop does with an item just taken (`taken`), starting from `start` (the
    /// item itself, or a folder above it created first), given `nameFirst` of an item (and the
    /// items it would be pushed first for, a cycle when the holder is one of them).
    public enum PushOrder<Instant: InstantProtocol>: Sendable, Equatable where Instant.Duration == Duration, Instant: Sendable {
        /// This item is pushed now (the one taken, or one that goes before it).
        case push(ItemID)
        /// The item taken goes back to the front: the request being gathered goes without it
        /// (`item`: the one the walk stopped at, pushed when no request is being gathered).
        case nextRequest(item: ItemID)
        /// The item taken waits until then, keeping its place.
        case wait(until: Instant)
    }

    /// Follows `nameFirst` from `start`: the item the server has at its name goes first when it
    /// left it here, and the one at that item's new name before it, and so on; a cycle (a swap)
    /// or a chain longer than `limit` ends with the last one found. An item found that way which
    /// went into a folder the server does not have yet (`folderFirst`) is preceded by that
    /// folder, or the server refuses its move (`parent_not_found`) and the item taking its name,
    /// sent behind it, is put beside it. Pure.
    public static func pushOrder<Instant>(start: ItemID, taken: ItemID, limit: Int = 16,
                                          folderFirst: (ItemID) -> ItemID? = { _ in nil },
                                          nameFirst: (ItemID, Set<ItemID>) -> NameFirst<Instant>?) -> PushOrder<Instant> {
        var item = start
        var seen: Set<ItemID> = [taken]
        func push(_ item: ItemID) -> PushOrder<Instant> {
            guard item != start, !Mutation.holderBeforeItsFolder.isOn, let folder = folderFirst(item) else { return .push(item) }
            return .push(folder)
        }
        for _ in 0..<limit {
            switch nameFirst(item, seen) {
            case nil: return push(item)
            case .nextRequest?: return .nextRequest(item: item)
            case .waitUntil(let until)?: return .wait(until: until)
            case .pushFirst(let holder)?:
                guard seen.insert(holder).inserted else { return push(item) }
                item = holder
            }
        }
        return push(item)
    }

    /// How long an item waits for the push of the item at its name whose content is being
    /// uploaded apart before it looks again.
    public static var contentApartRecheck: Duration { .seconds(1) }

    /// How long, at most, an item waits in all for the item at its name: then it goes, and may
    /// be put beside it (a push that stays stuck never holds another up for good).
    public static var nameWaitLimit: Duration { .seconds(30) }

    /// The item at the name, as `nameFirst` reads it.
    public struct NameHolder<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration, Instant: Sendable {
        public var id: ItemID
        /// Queued to push (not parked).
        public var queued: Bool
        /// Parked: ignored here by a `.nimbusignore` (its changes stay on this device).
        public var parked: Bool
        /// In the request being gathered.
        public var onItsWay: Bool
        /// Not at that place in the tree here any more (moved away, deleted, its identity
        /// taken by a save): when not queued, the notice of that is still on its way.
        public var leftHere: Bool
        /// Shown here at that place (its base is there), not only known to be there from a server
        /// state held back here.
        public var shownThere: Bool
        /// Not in the tree here at all (deleted, or its identity taken by a save): its push is a
        /// delete, which no program's writer or lock holds back.
        public var gone: Bool
        public var upload: UploadState<Instant>?
        public init(id: ItemID, queued: Bool, parked: Bool = false, onItsWay: Bool = false, leftHere: Bool, shownThere: Bool = true,
                    gone: Bool = false, upload: UploadState<Instant>? = nil) {
            self.id = id
            self.gone = gone
            self.shownThere = shownThere
            self.queued = queued
            self.parked = parked
            self.onItsWay = onItsWay
            self.leftHere = leftHere
            self.upload = upload
        }
    }

    /// Whether the item the server has at the place an item takes here (`holder`, from the
    /// bases: `ItemTable.holder(of:)`; nil when none, or it is the item itself) must push first.
    /// Only when it left that place here and has a push to make, or will have once the notice
    /// is in: one still there is really at that name on the server. One whose push waits on a
    /// program (a writer, a lock), is parked, or is refused by the server as it is (or over the
    /// quota) is not waited for, nor is anything after `nameWaitLimit` since the item first
    /// waited (`waitingSince`): the item goes, and may be put beside it. Each push first moves
    /// that item away, or makes it wait or leave the queue, so this never loops.
    public static func nameFirst<Instant>(_ holder: NameHolder<Instant>?, waitingSince: Instant?, now: Instant) -> NameFirst<Instant>? {
        guard let holder, holder.leftHere, !Mutation.nameTakenBeforeItIsLeft.isOn else { return nil }
        if let since = waitingSince, since.duration(to: now) > nameWaitLimit { return nil }
        if holder.onItsWay { return holder.queued ? .nextRequest : nil }
        if holder.parked { return nil }
        guard holder.queued else {
            // Its notice is on its way (the tree tells the engine of changes in order, but a
            // content notice of a new file can come before the rename that freed its name) —
            // unless a program keeps it from being queued, or it was never shown there (a state
            // held back here put it there: another device's doing, or nothing of this device
            // moves it).
            guard holder.shownThere else { return nil }
            if !holder.gone, let u = holder.upload, u.writer != .idle || u.wait == .lock { return nil }
            return .waitUntil(now.advanced(by: SyncItem<Instant>.noticeRecheck))
        }
        let readyAt: Instant
        switch holder.upload?.wait {
        case nil, .lock?: return .pushFirst(holder.id)
        case .failed(.retrying(let at, _))?: readyAt = at
        case .failed(.refused)?, .failed(.overQuota)?: return nil
        case .until(let t)?, .paced(let t)?: readyAt = t
        case .content?: return .waitUntil(now.advanced(by: contentApartRecheck))
        }
        return readyAt <= now ? .pushFirst(holder.id) : .waitUntil(readyAt)
    }

    /// Nothing to send: the draft is the base's state (a save that changed only the
    /// modification time commits nothing, so it makes no false conflicts), unless that time was
    /// set on purpose (`touch -d`, `cp -p`, `rsync -t`: an attributes change), the base is a
    /// delete (a create after it must go), or an earlier commit of the item may have applied
    /// without its answer (`UploadState.unanswered`): the server may hold what that commit
    /// carried, which the state here, equal to the base, undoes.
    public static func nothingToSend(base: ServerItem?, draft: ItemDraft, timeSetOnPurpose: Bool, unanswered: Bool = false) -> Bool {
        guard let base, !base.deleted, !unanswered else { return false }
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
    /// What the gathered commits do before the next item's push. A delete joins them like a
    /// commit: the server takes a request's commits in the order sent, each on its own, so it
    /// reaches the server after the commits queued before it (a folder's delete would otherwise
    /// take a child committed after it, and a create sent after its folder's delete would bring
    /// the folder back) as it would alone.
    public enum Next: Sendable, Equatable {
        /// It joins them.
        case join
        /// They go first: content that goes up before its commit would hold them back.
        case sendFirst
    }

    public static var maxCommits: Int { ProtocolLimits.maxBatchCommits }
    /// About what the gathered requests may weigh as JSON (the server takes 8 MiB).
    public static var maxBytes: Int { 1 << 20 }

    public private(set) var commits = 0
    public private(set) var bytes = 0
    /// Where the gathered commits put their items.
    private var places: Set<ItemTable.Place> = []

    public init() {}

    /// Whether a gathered commit puts its item at `place`. A commit at the same place must not
    /// join: the server would find the name taken by the first and put it beside (`NAME 2`);
    /// the first may be a state decided just before its item left the name here (`mv a b`
    /// while the create of `a` was being gathered). They go, and the push of the item is
    /// decided again after their answers (`CommitPlan.nameFirst` then sees the item there).
    public func holds(_ place: ItemTable.Place) -> Bool {
        !Mutation.nameTakenBeforeItIsLeft.isOn && places.contains(place)
    }

    /// The next push: a commit whose content is read here (`needsContent`) and, over what travels
    /// inside a commit, uploaded before it, goes after the gathered ones.
    public static func next(needsContent: Bool, size: Int64) -> Next {
        needsContent && size > ProtocolLimits.inlineFileBytes ? .sendFirst : .join
    }

    /// A commit of about `chunks` chunk references and `inlineBytes` bytes inside it, putting its
    /// item at `place`, joins.
    public mutating func add(chunks: Int, inlineBytes: Int, place: ItemTable.Place? = nil) {
        commits += 1
        if let place { places.insert(place) }
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
