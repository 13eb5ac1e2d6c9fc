import NimbusCore
import NimbusProtocol

/// What the engine knows about one item's local changes on their way up, besides the queue's
/// order (`UploadQueue`). One record per item that has any of it; an item without a record is
/// clean here and uploads at once when it changes.
///
/// A state machine: the record changes only by `on(_:at:rules:)`, one event at a time, and each
/// event answers with what the engine does next (`UploadAction`). The phases are enums, so
/// contradictory combinations (waiting for a lock and backing off, a snapshot due of a file no
/// program writes) cannot be represented:
///
///     wait:    none ──askAgain / paced──▶ until(t) / paced(t) ──committing / waitLook (queue)──▶ none
///               │  ──failed─────▶ failed(retrying | refused | overQuota) ──pushEnded──▶ none
///               ├──lockHeld─────▶ lock ──lockReleased (requeue)──▶ none
///               └──contentApart─▶ content ──contentDone──▶ none
///     writer:  idle ──wrote──▶ writing ──quiet(gen)──▶ writing(snapshot due)
///                                  ▲ └─committing(snapshot)─▶ writing(sent gen) ──writersGone──▶ idle
///                                  └──────────── wrote ─────────┘
public struct UploadState<Instant: InstantProtocol>: Sendable, Equatable where Instant.Duration == Duration, Instant: Sendable {
    /// The last upload failed; the item stays queued and is tried again at `at`.
    public enum Failure: Sendable, Equatable {
        /// Server trouble, a lost connection or an ordering race: back-off `delay` seconds.
        case retrying(at: Instant, delay: Int)
        /// The server refuses this state as it is (`user.nimbus.status` says `error`): tried
        /// again when it changes, at the next start, or at `at`.
        case refused(at: Instant)
        /// The server refused a chunk for the account's quota (`quota_exceeded`; its usage and
        /// quota when it said them): `user.nimbus.status` says `error`, and the item is tried
        /// again at `at` (`quotaRetrySeconds`) or at the next start.
        case overQuota(at: Instant, QuotaFigures?)

        public var at: Instant {
            switch self { case .retrying(let at, _), .refused(let at), .overQuota(let at, _): at }
        }

        /// The back-off after another transport failure: 1 s doubling to 30 s (30 s after a
        /// refusal: the server answered, but not well).
        public var nextDelay: Int {
            if case .retrying(_, let delay) = self { return delay >= 15 ? 30 : delay < 1 ? 1 : delay * 2 }
            return 30
        }
    }

    /// Why the item is not pushed now.
    public enum Wait: Sendable, Equatable {
        /// The last upload failed: tried again at the failure's `at`.
        case failed(Failure)
        /// Looked at again then, keeping its place in the queue: a folder delete waiting for the
        /// pushes of items below it, a save or a change's notice on its way.
        case until(Instant)
        /// A file that keeps changing (`UploadPacing`), keeping its place in the queue: taken
        /// then, or sooner once its program has written enough to earn the upload.
        case paced(Instant)
        /// A program holds the file exclusively (mid-save): its unlock queues it again.
        case lock
        /// A big file's content is being chunked and uploaded apart from the queue, keeping its
        /// place: the other items go meanwhile, and its commit when the content is up.
        case content
    }

    /// The programs writing the file.
    public enum Writer: Sendable, Equatable {
        case idle
        /// Written since its last close or fsync (`user.nimbus.status` says `uploading`; the
        /// quiet period of a file kept open runs). `snapshotDue`: no write for a quiet period, so
        /// the next push may upload a snapshot although the file is still open. `sent`: the write
        /// generation of the last snapshot uploaded (the same generation is not sent twice).
        case writing(snapshotDue: Bool, sent: UInt64?)
    }

    /// How long an item refused for the account's quota waits before it is tried again: room
    /// appears when the admin raises the quota or the garbage collector frees content no version
    /// refers to any more, neither of which the device hears of.
    public static var quotaRetrySeconds: Int { 60 }

    public private(set) var wait: Wait?
    public private(set) var writer: Writer = .idle
    /// The last failure of an upload or download of the item (`user.nimbus.error`).
    public private(set) var error: String?
    /// A never-synced file with a device-local name (SQLite's journals): kept here only.
    public private(set) var deviceLocal = false
    /// How often this never-committed folder was pushed ahead of an item inside it (bounded, so
    /// a folder that cannot be committed never keeps the loop spinning).
    public private(set) var pushedAhead = 0
    /// Its place here is newer than the one the server keeps from an earlier commit of ours
    /// (moved back here while that commit was on its way): the answer to its next commit leaves
    /// it where it is, and it is pushed once more.
    public private(set) var relocate = false
    public private(set) var pacing = UploadPacing<Instant>()
    /// The server answered `missing_chunks`: chunks it once had are gone (freed by its garbage
    /// collection after their last version was pruned). The next push asks which chunks it lacks
    /// even when the content is the base's, instead of taking the base's word for it.
    public private(set) var chunksMissing = false
    /// A commit of it may have applied on the server without its answer reaching here (a
    /// transport failure or server trouble after it went, or a stop with it queued): its next
    /// push is sent even when its state is its base's (`CommitPlan.nothingToSend`), so a change
    /// here that undid what that commit carried (an attribute set, then removed) is not taken for
    /// no change while the server keeps what the commit carried. The server decides that commit
    /// against the versions this device made since its base (docs/protocol.md "Commit").
    public private(set) var unanswered = false
    /// Where the last commit sent asked the item to be (nil: a delete). While `unanswered`, the
    /// server may have the item there although no state of it was heard here: a create whose
    /// answer was lost holds its name (`ItemTable.Place`), so a new item at that name waits for
    /// this one's push, as for any item of this device leaving a name.
    public var sentPlace: ItemTable.Place?

    public init() {}

    /// What happened to the item.
    public enum Event: Sendable, Equatable {
        /// A program wrote into the file (a durable note only: the close or fsync uploads).
        case wrote
        /// A change was queued; `content`: its content changed (pacing counts it).
        case changed(content: Bool)
        /// The item was deleted here.
        case deletedHere
        /// No program has the file open for writing any more.
        case writersGone
        /// The file kept open had no write for a quiet period, at write generation `generation`;
        /// `queued`: the item is in the queue or being pushed already.
        case quiet(generation: UInt64, queued: Bool)
        /// The tick's look at a file being written: `writers` programs have it open for writing,
        /// `unsynced`: written since its last fsync, no write for `idle`, at `generation`;
        /// `queued`: in the queue or being pushed.
        case writerLook(writers: Int, unsynced: Bool, idle: Duration, generation: UInt64, queued: Bool)
        /// The tick's look at an item waiting (`until`): the program has written `written` bytes.
        case waitLook(written: UInt64)
        /// The push decided to look again at `until`, keeping the item's place in the queue.
        case askAgain(until: Instant)
        /// The push found the file changing again too soon (`UploadPacing`): paced until then.
        case paced(until: Instant)
        /// The push commits the item's state now; `snapshot`: of a file kept open.
        case committing(snapshot: Bool)
        /// A snapshot at write generation `generation` was committed.
        case snapshotSent(UInt64)
        /// Its content goes up apart from the queue (a big file).
        case contentApart
        /// The content sent apart is up, or its upload ended without it.
        case contentDone
        /// Its upload found the file locked exclusively.
        case lockHeld
        /// The last lock on the file went.
        case lockReleased
        /// A never-synced file decided device-local (or not any more).
        case deviceLocal(Bool)
        /// The folder is pushed ahead of an item inside it.
        case pushedAhead
        /// An upload read the content when `written` bytes were written and sent `sent` bytes.
        case uploaded(sent: Int64, written: UInt64)
        /// The push ended without an error; `closed`: no program writes the file now.
        case pushEnded(closed: Bool)
        /// The push failed with `failure`, the error text to show, and whether the server said
        /// chunks were missing.
        case failed(UploadFailure, message: String, missingChunks: Bool)
        /// A refused move was put back where the server has it.
        case putBack
        /// The place here is newer than what the next commit's answer says: keep it (`relocate`).
        case movedBackSinceCommit
        /// A commit's answer is being settled (`relocate` is used up; the item is answered).
        case settling
        /// Queued on disk at a start: a commit of it may have gone before the stop, its answer
        /// never recorded (`unanswered`).
        case queuedAtStart
        /// A download of it failed with `message`, or it is whole here now (`nil`).
        case download(failed: String?)
    }

    /// What the engine does after an event.
    public enum Action: Sendable, Equatable {
        /// Put the item in the upload queue (a snapshot is due, or its lock went).
        case queue
        /// Tried again in `seconds`.
        case retryIn(seconds: Int)
        /// Back at the front of the queue (a failed change is never dropped).
        case queueFirst
        /// The server refused the device's token: no upload goes until a valid one is given.
        case waitForToken
        /// A move refused as a cycle: it leaves the queue and the item is put back where the
        /// server has it (the container is listed again, so a lost answer cannot leave it here).
        case putBack
        /// Its commit's answer must keep the place here (settle with relocation).
        case keepPlace
    }

    /// Takes `event` at `now` and returns what the engine does next.
    @discardableResult
    public mutating func on(_ event: Event, at now: Instant, rules: UploadPacing<Instant>.Rules) -> [Action] {
        switch event {
        case .wrote:
            if case .idle = writer { writer = .writing(snapshotDue: false, sent: nil) }
            pacing.changed(at: now, rules: rules)
        case .changed(let content):
            if content { pacing.changed(at: now, rules: rules) }
        case .deletedHere:
            deletedHere()
        case .writersGone:
            writer = .idle
        case .quiet(let generation, let queued):
            guard !queued, case .writing(_, let sent) = writer, sent != generation else { return [] }
            writer = .writing(snapshotDue: true, sent: sent)
            return [.queue]
        case .writerLook(let writers, let unsynced, let idle, let generation, let queued):
            // No program writes it any more: its close or fsync queued it.
            guard writers > 0 else { return on(.writersGone, at: now, rules: rules) }
            // Kept open and quiet for a quiet period (0: never): a snapshot goes.
            guard rules.quietPeriod > .zero, unsynced, idle >= rules.quietPeriod else { return [] }
            return on(.quiet(generation: generation, queued: queued), at: now, rules: rules)
        case .waitLook(let written):
            // Asked again later: over when its time came. Paced: also when the program has
            // written enough since to earn the upload.
            switch wait {
            case .until(let t)? where t <= now, .paced(let t)? where t <= now:
                break
            case .paced? where pacing.decide(at: now, written: written, rules: rules) == .now:
                break
            default:
                return []
            }
            wait = nil
            return [.queue]
        case .askAgain(let until):
            wait = .until(until)
        case .paced(let until):
            wait = .paced(until)
        case .committing(let snapshot):
            if notBefore != nil { wait = nil }
            if snapshot, case .writing(_, let sent) = writer { writer = .writing(snapshotDue: false, sent: sent) }
        case .snapshotSent(let generation):
            if case .writing = writer { writer = .writing(snapshotDue: false, sent: generation) }
        case .contentApart:
            wait = .content
        case .contentDone:
            if wait == .content { wait = nil }
        case .lockHeld:
            wait = .lock
        case .lockReleased:
            guard wait == .lock else { return [] }
            wait = nil
            return [.queue]
        case .deviceLocal(let local):
            deviceLocal = local
        case .pushedAhead:
            pushedAhead += 1
        case .uploaded(let sent, let written):
            pacing.uploaded(at: now, sent: sent, written: written, rules: rules)
        case .pushEnded(let closed):
            if case .failed = wait { wait = nil }
            error = nil
            chunksMissing = false
            if closed { writer = .idle }
        case .failed(let f, let message, let missing):
            error = message
            if missing { chunksMissing = true }
            if case .transient = f, !Mutation.nothingToSendAfterLostAnswer.isOn { unanswered = true }
            let delay = failed(f, at: now)
            switch f {
            case .unauthorized: return [.waitForToken, .queueFirst]
            case .moveRefused: return [.putBack]
            case .transient, .refused, .overQuota: return [.retryIn(seconds: delay), .queueFirst]
            }
        case .putBack:
            if case .failed = wait { wait = nil }
            error = nil
        case .movedBackSinceCommit:
            relocate = true
        case .settling:
            let keep = relocate
            relocate = false
            unanswered = false
            sentPlace = nil
            return keep && !Mutation.settleWithoutRelocate.isOn ? [.keepPlace] : []
        case .download(let failed):
            error = failed
        case .queuedAtStart:
            if !Mutation.nothingToSendAfterLostAnswer.isOn { unanswered = true }
        }
        return []
    }

    /// The item was deleted here: its delete goes at once. Nothing of its content is left to
    /// pace, snapshot or wait for, and a refusal of its last state (or of its content for the
    /// quota) no longer applies; a back-off for server trouble stays. A delete kept waiting
    /// would let a folder delete made after it overtake it, and the folder delete's rule is
    /// coarser: the item's own delete, on its base, loses to an edit made elsewhere.
    private mutating func deletedHere() {
        if Mutation.deleteWaitsOutPacing.isOn { return }
        if case .writing(_, let sent) = writer { writer = .writing(snapshotDue: false, sent: sent) }
        switch wait {
        case .failed(.retrying)?:
            break
        case .failed(.refused)?, .failed(.overQuota)?:
            wait = nil
            error = nil
        case .until?, .paced?, .lock?, .content?, nil:
            wait = nil
        }
    }

    /// Records a failed upload at `now` and returns the seconds until it is tried again (0 when it
    /// waits for a valid token, or leaves the queue to be put back).
    private mutating func failed(_ f: UploadFailure, at now: Instant) -> Int {
        let delay: Int
        switch f {
        case .unauthorized, .moveRefused:
            return 0
        case .transient:
            delay = failure?.nextDelay ?? 1
            wait = .failed(.retrying(at: now.advanced(by: .seconds(delay)), delay: delay))
        case .refused:
            delay = UploadFailure.refusedRetrySeconds
            wait = .failed(.refused(at: now.advanced(by: .seconds(delay))))
        case .overQuota(let figures):
            // Room appears when the admin raises the quota or the server's garbage collection
            // frees content no version refers to any more; the device hears of neither.
            delay = Self.quotaRetrySeconds
            wait = .failed(.overQuota(at: now.advanced(by: .seconds(delay)), figures))
        }
        return delay
    }

    /// The failure it backs off from, if any.
    public var failure: Failure? {
        if case .failed(let f) = wait { return f }
        return nil
    }

    /// The end of a wait that keeps its place in the queue.
    public var notBefore: Instant? {
        switch wait {
        case .until(let t)?, .paced(let t)?: t
        case .failed?, .lock?, .content?, nil: nil
        }
    }

    public var waitingForLock: Bool { wait == .lock }

    public var writing: Bool {
        if case .writing = writer { return true }
        return false
    }

    public var snapshotDue: Bool {
        if case .writing(true, _) = writer { return true }
        return false
    }

    public var snapshotSent: UInt64? {
        if case .writing(_, let sent) = writer { return sent }
        return nil
    }

    /// Whether the push loop may take the item now: no back-off or wait runs.
    public func ready(at now: Instant) -> Bool {
        switch wait {
        case .failed(let f)?: f.at <= now
        case .until(let t)?, .paced(let t)?: t <= now
        case .content?: false
        case .lock?, nil: true
        }
    }

    public var refused: Bool {
        if case .refused? = failure { return true }
        return false
    }

    /// The account's usage and quota of the last `quota_exceeded` (with nil figures when the
    /// server gave none); nil when the item does not wait on the quota.
    public var overQuota: QuotaFigures?? {
        if case .overQuota(_, let figures)? = failure { return .some(figures) }
        return nil
    }

    /// Nothing worth remembering: the item's record forgets its upload phase.
    public func isIdle(at now: Instant, rules: UploadPacing<Instant>.Rules) -> Bool {
        idleButForPacing && pacing.isIdle(at: now, rules: rules)
    }

    /// Nothing under way but the pacing's memory of the last uploads: only time stands between
    /// this state and `isIdle` (`pacing.idleFrom`).
    public var idleButForPacing: Bool {
        wait == nil && writer == .idle && error == nil && !deviceLocal && pushedAhead == 0 && !relocate
            && !chunksMissing && !unanswered
    }
}
