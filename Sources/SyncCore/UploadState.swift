import NimbusCore
import NimbusProtocol

/// What the engine knows about one item's local changes on their way up, besides the queue's
/// order (`UploadQueue`): why its upload failed and when it is tried again, whether a program is
/// writing it or holds it locked, the snapshot of a file kept open, the pacing of a file that
/// keeps changing. One record per item that has any of it; an item without a record is clean
/// here and uploads at once when it changes.
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

    /// How long an item refused for the account's quota waits before it is tried again: room
    /// appears when the admin raises the quota or the garbage collector frees content no version refers to any more,
    /// neither of which the device hears of.
    public static var quotaRetrySeconds: Int { 60 }

    public var failure: Failure?
    /// The last failure of an upload or download of the item (`user.nimbus.error`).
    public var error: String?
    /// Written since its last close or fsync (`user.nimbus.status` says `uploading`; the quiet
    /// period of a file kept open runs).
    public var writing = false
    /// Not uploaded while a program holds the file exclusively: its unlock queues it again.
    public var waitingForLock = false
    /// A never-synced file with a device-local name (SQLite's journals): kept here only.
    public var deviceLocal = false
    /// How often this never-committed folder was pushed ahead of an item inside it (bounded, so
    /// a folder that cannot be committed never keeps the loop spinning).
    public var pushedAhead = 0
    /// Its place here is newer than the one the server keeps from an earlier commit of ours
    /// (moved back here while that commit was on its way): the answer to its next commit leaves
    /// it where it is, and it is pushed once more.
    public var relocate = false
    /// The file is kept open and had no write for a quiet period: its next push may upload a
    /// snapshot although it is still open.
    public var snapshotDue = false
    /// The write generation of the last snapshot uploaded while the file stayed open (the same
    /// generation is not sent twice).
    public var snapshotSent: UInt64?
    public var pacing = UploadPacing<Instant>()
    /// Paced (`UploadPacing`): the item keeps its place in the queue and is not pushed before then.
    public var notBefore: Instant?
    /// The server answered `missing_chunks`: chunks it once had are gone (freed by its garbage
    /// collection after their last version was pruned). The next push asks which chunks it lacks
    /// even when the content is the base's, instead of taking the base's word for it.
    public var chunksMissing = false

    public init() {}

    /// The item was deleted here: its delete goes at once. Nothing of its content is left to
    /// pace, snapshot or wait for, and a refusal of its last state (or of its content for the
    /// quota) no longer applies; a back-off for server trouble stays. A delete kept waiting
    /// would let a folder delete made after it overtake it, and the folder delete's rule is
    /// coarser: the item's own delete, on its base, loses to an edit made elsewhere.
    public mutating func deletedHere() {
        if Mutation.deleteWaitsOutPacing.isOn { return }
        notBefore = nil
        snapshotDue = false
        waitingForLock = false
        switch failure {
        case .refused?, .overQuota?:
            failure = nil
            error = nil
        case .retrying?, nil:
            break
        }
    }

    /// Whether the push loop may take the item now: no back-off or pacing wait runs.
    public func ready(at now: Instant) -> Bool {
        (failure.map { $0.at <= now } ?? true) && (notBefore.map { $0 <= now } ?? true)
    }

    public var refused: Bool {
        if case .refused = failure { return true }
        return false
    }

    /// The account's usage and quota of the last `quota_exceeded` (with nil figures when the
    /// server gave none); nil when the item does not wait on the quota.
    public var overQuota: QuotaFigures?? {
        if case .overQuota(_, let figures) = failure { return .some(figures) }
        return nil
    }

    /// Nothing worth remembering: the item's record forgets its upload phase.
    public func isIdle(at now: Instant, rules: UploadPacing<Instant>.Rules) -> Bool {
        failure == nil && error == nil && !writing && !waitingForLock && !deviceLocal && pushedAhead == 0 && !relocate
            && !snapshotDue && snapshotSent == nil && notBefore == nil && !chunksMissing && pacing.isIdle(at: now, rules: rules)
    }
}
