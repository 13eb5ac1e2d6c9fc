/// What the engine tracks about one item's local content on its way up, besides the queue:
/// whether a program is writing it, the snapshot of a file kept open, and the pacing of a file
/// that keeps changing. One record per item that has any of it; an item without a record is
/// clean here and uploads at once when it changes.
public struct UploadState<Instant: InstantProtocol>: Sendable, Equatable where Instant.Duration == Duration, Instant: Sendable {
    /// Written since its last close or fsync (`user.nimbus.status` says `uploading`; the quiet
    /// period of a file kept open runs).
    public var writing = false
    /// The file is kept open and had no write for a quiet period: its next push may upload a
    /// snapshot although it is still open.
    public var snapshotDue = false
    /// The write generation of the last snapshot uploaded while the file stayed open (the same
    /// generation is not sent twice).
    public var snapshotSent: UInt64?
    public var pacing = UploadPacing<Instant>()
    /// Paced (`UploadPacing`): the item keeps its place in the queue and is not pushed before then.
    public var notBefore: Instant?

    public init() {}

    /// Whether the push loop may take the item now.
    public func ready(at now: Instant) -> Bool { notBefore.map { $0 <= now } ?? true }

    /// Nothing worth remembering: the engine drops the record.
    public func isIdle(at now: Instant, rules: UploadPacing<Instant>.Rules) -> Bool {
        !writing && !snapshotDue && snapshotSent == nil && notBefore == nil && pacing.isIdle(at: now, rules: rules)
    }
}
