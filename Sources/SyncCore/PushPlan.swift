import NimbusCore

/// What the tree says about an item when the push loop takes it: one snapshot, read by the
/// engine from the filesystem just before `pushStep`.
public struct PushFacts<Instant: InstantProtocol>: Sendable, Equatable where Instant.Duration == Duration, Instant: Sendable {
    /// The item is in the tree here (else it was deleted here).
    public var exists: Bool
    public var isFile: Bool
    /// The item was synced before (it has a base).
    public var hasBase: Bool
    /// Every byte of its content is here (no base, or a base whose chunks are all present).
    public var complete: Bool
    /// A never-synced item that lives on this device only: a FIFO, socket or device node, or a
    /// file whose name marks it as device-local (SQLite's journals).
    public var localOnly: Bool
    /// A new file under the name a document was just renamed away from (an editor's save in
    /// progress): it may take the document's identity in a moment.
    public var pendingSafeSave: Bool
    /// Open for writing with writes since its last fsync: the write generation then.
    public var midSaveGeneration: UInt64?
    /// A program holds an exclusive lock on the file.
    public var lockedExclusively: Bool
    /// Bytes programs wrote into the file so far (`UploadPacing`).
    public var written: UInt64
    /// The tree changed the file's content (a write, an editor's save handing it new bytes)
    /// and the engine has not had the notice yet: what it knows of the content is out of date.
    public var unnoticedChange: Bool
    /// A folder deleted here while an item the server has below it still has a push to make
    /// (`CommitPlan.deleteWaitsForBelow`).
    public var belowStillToPush: Bool
    /// What the `.nimbusignore` files say of the item's place here (for an item deleted here,
    /// of its place on the server): true = ignored, false = not, nil = not known yet (a rules
    /// file on the way is still a placeholder).
    public var ignored: Bool?
    public var now: Instant

    public init(exists: Bool, isFile: Bool, hasBase: Bool, complete: Bool, localOnly: Bool = false,
                pendingSafeSave: Bool = false, midSaveGeneration: UInt64? = nil, lockedExclusively: Bool = false,
                written: UInt64 = 0, unnoticedChange: Bool = false, belowStillToPush: Bool = false, ignored: Bool? = false, now: Instant) {
        self.ignored = ignored
        self.unnoticedChange = unnoticedChange
        self.belowStillToPush = belowStillToPush
        self.exists = exists
        self.isFile = isFile
        self.hasBase = hasBase
        self.complete = complete
        self.localOnly = localOnly
        self.pendingSafeSave = pendingSafeSave
        self.midSaveGeneration = midSaveGeneration
        self.lockedExclusively = lockedExclusively
        self.written = written
        self.now = now
    }
}

/// What the push of an item does next.
public enum PushStep<Instant: InstantProtocol>: Sendable, Equatable where Instant.Duration == Duration, Instant: Sendable {
    /// Deleted here: the delete is committed (from the base, or asked of the server).
    case commitDelete
    /// A folder deleted here waits, keeping its place in the queue, until the items moved out
    /// of it (or deleted) here are pushed: the server's folder delete takes what it holds below.
    case waitForBelow(until: Instant)
    /// Never leaves this device; its queue entries go.
    case keepLocal
    /// Ignored here (`.nimbusignore`), or its rules are not known yet: its changes stay on this
    /// device for now. It leaves the order but keeps its queue entries and counts as local work
    /// (`UploadQueue.park`): no pull replaces what it holds, and when the rules change it is
    /// looked at again — one that stops being ignored is pushed on its base, or as a new item.
    case park
    /// An editor's save is under way: asked again then. The item keeps its place in the queue
    /// meanwhile, so every rule that looks for local work (a folder delete from elsewhere) sees it.
    case waitForSafeSave(until: Instant)
    /// Mid-save: the writer's close or fsync queues the item again.
    case waitForWriter
    /// A change of the content is on its way to the engine: asked again then, keeping its place
    /// in the queue (deciding now, on a placeholder's base, would find "nothing to send" and drop
    /// the queue entry the change put on disk; and the notice on its way may name the item by
    /// another id, that of a file whose identity it took).
    case waitForNotice(until: Instant)
    /// A program holds it exclusively: the unlock queues it again.
    case waitForLock
    /// A file that keeps changing: it keeps its place in the queue until then.
    case paced(until: Instant)
    /// Its whole state is committed; `snapshot` is the write generation of a file kept open
    /// whose quiet period is over (nil: not open for writing, or fsynced).
    case commit(snapshot: UInt64?)

    /// Steps about the file's content, for which the file's presenters are asked to save first.
    public var concernsContent: Bool {
        switch self {
        case .commitDelete, .waitForBelow, .keepLocal, .park, .waitForSafeSave, .waitForNotice: false
        case .waitForWriter, .waitForLock, .paced, .commit: true
        }
    }

    /// What the item's upload record takes for this step, in order. An item neither kept nor
    /// parked here is not device-local (a SQLite journal's name renamed to an ordinary one is
    /// uploaded from then on; a file no longer ignored is synced), nor is a delete; a kept or
    /// parked one is; a lock held waits for its release; a paced file waits its time; a commit
    /// is under way.
    public func uploadEvents(isFile: Bool, hasBase: Bool) -> [UploadState<Instant>.Event] {
        let ordinary: [UploadState<Instant>.Event] = self != .keepLocal && self != .park ? [.deviceLocal(false)] : []
        switch self {
        case .commitDelete: return ordinary
        case .keepLocal, .park: return [.deviceLocal(true)]
        case .waitForLock: return ordinary + [.lockHeld]
        case .paced(let until): return ordinary + [.paced(until: until)]
        case .commit(let snapshot): return ordinary + [.committing(snapshot: snapshot != nil)]
        case .waitForBelow, .waitForNotice, .waitForSafeSave, .waitForWriter: return ordinary
        }
    }
}

extension SyncItem {
    /// How long a first upload held as a possible editor's save waits before it is looked at
    /// again (the save takes the document's identity when its backup goes, usually within
    /// milliseconds).
    public static var safeSaveRecheck: Duration { .milliseconds(500) }

    /// How long a push waits for a content change's notice on its way before it looks again.
    public static var noticeRecheck: Duration { .milliseconds(20) }

    /// How long a folder delete waits before it looks again at the pushes of items below it.
    public static var belowRecheck: Duration { .seconds(1) }

    /// The decision at the start of a push, in order: ignored here, deleted here, a change not
    /// noticed yet, device-local, an editor's save under way, mid-save (unless a snapshot is
    /// due), locked, paced; else commit. Pure.
    public func pushStep(_ f: PushFacts<Instant>, rules: UploadPacing<Instant>.Rules) -> PushStep<Instant> {
        // Ignored (or under rules not known yet): parked. Not an item deleted here that the
        // server never had — there is nothing to keep, and its queue entries go.
        if f.ignored != false, f.exists || f.hasBase, !Mutation.ignoredItemPushed.isOn { return .park }
        guard f.exists else { return f.belowStillToPush ? .waitForBelow(until: f.now.advanced(by: Self.belowRecheck)) : .commitDelete }
        guard f.isFile else { return .commit(snapshot: nil) }
        if f.unnoticedChange, !Mutation.pushBeforeNotice.isOn { return .waitForNotice(until: f.now.advanced(by: Self.noticeRecheck)) }
        if !f.hasBase {
            if f.localOnly { return .keepLocal }
            if f.pendingSafeSave { return .waitForSafeSave(until: f.now.advanced(by: Self.safeSaveRecheck)) }
        }
        var snapshot: UInt64?
        if let generation = f.midSaveGeneration {
            guard upload.snapshotDue else { return .waitForWriter }
            snapshot = generation
        }
        if f.lockedExclusively { return .waitForLock }
        if f.complete, case .wait(let until) = upload.pacing.decide(at: f.now, written: f.written, rules: rules) {
            return .paced(until: until)
        }
        return .commit(snapshot: snapshot)
    }
}

/// What a change made here is, to the item's record.
public enum LocalChangeKind: Sendable, Equatable {
    /// The first write since the last close or fsync (a durable note, not an upload trigger).
    case writing
    /// The content changed (the writer closed or fsynced).
    case content
    case deleted
    /// Created, moved, attributes changed.
    case other
}

extension SyncItem {
    /// A change made here is noticed. Returns whether the item goes into the upload queue (a
    /// write in progress does not: its close or fsync does) and, for a content change, the base
    /// it makes whole (nil: nothing changes): content is written only into whole files, so the
    /// file is whole here from now on, and kept so on disk at once — after a kill -9 the push
    /// must not find "nothing to send".
    public mutating func noticed(_ change: LocalChangeKind, at now: Instant, rules: UploadPacing<Instant>.Rules) -> (queue: Bool, whole: Base?) {
        switch change {
        case .writing:
            upload.on(.wrote, at: now, rules: rules)
            return (false, nil)
        case .content:
            upload.on(.changed(content: true), at: now, rules: rules)
            let whole = base?.wholeAfterLocalContent()
            if let whole { base = whole }
            return (true, whole)
        case .deleted:
            upload.on(.deletedHere, at: now, rules: rules)
            return (true, nil)
        case .other:
            return (true, nil)
        }
    }
}
