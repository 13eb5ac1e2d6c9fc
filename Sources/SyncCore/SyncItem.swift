/// Everything a device keeps in memory about one item: the server state it shows (its base, with
/// which chunks are in the cache file), how its cache file is used, its local changes on their way
/// up and the server states held back here. The engine keeps one per item it shows or works on.
///
/// The upload and remote phases are boxed and absent while idle, so the record of an item at rest
/// costs little more than its base (a container may show a million of them).
public struct SyncItem<Instant: InstantProtocol>: Sendable, Equatable where Instant.Duration == Duration, Instant: Sendable {
    /// The server state this device shows and will base its next commit on; nil for an item
    /// created here and not committed yet.
    public var base: Base?
    public var cache = CacheUse()
    private var work: Work?

    public init(base: Base? = nil) { self.base = base }

    /// Local changes on their way up: failures, back-offs, writers, locks, snapshots, pacing.
    public var upload: UploadState<Instant> {
        get { work?.upload ?? UploadState() }
        set { setWork(newValue, remote) }
    }

    /// Server states not shown yet, by what holds them back.
    public var remote: RemoteHolds {
        get { work?.remote ?? RemoteHolds() }
        set { setWork(upload, newValue) }
    }

    /// Something is under way or held back (the engine looks at these items after each event).
    public var busy: Bool { work != nil }

    /// Nothing under way or held back worth remembering.
    public func isIdle(at now: Instant, rules: UploadPacing<Instant>.Rules) -> Bool {
        guard let work else { return true }
        return work.remote.isEmpty && work.upload.isIdle(at: now, rules: rules)
    }

    /// Forgets the upload and remote phases once they are idle.
    public mutating func settle(at now: Instant, rules: UploadPacing<Instant>.Rules) {
        if work != nil, isIdle(at: now, rules: rules) { work = nil }
    }

    private mutating func setWork(_ upload: UploadState<Instant>, _ remote: RemoteHolds) {
        work = remote.isEmpty && upload == UploadState() ? nil : Work(upload: upload, remote: remote)
    }

    private final class Work: Sendable, Equatable {
        let upload: UploadState<Instant>
        let remote: RemoteHolds
        init(upload: UploadState<Instant>, remote: RemoteHolds) {
            self.upload = upload
            self.remote = remote
        }
        static func == (a: Work, b: Work) -> Bool { a === b || (a.upload == b.upload && a.remote == b.remote) }
    }
}

/// How an item's cache file is used: read by prefetch and eviction, never persisted.
public struct CacheUse: Sendable, Equatable {
    /// Changes whenever the cache file is reset or swapped for new content: a download that
    /// started before writes into the old file and must not count.
    public var generation: UInt64 = 0
    /// When the content was last read or downloaded (a logical clock): least recently used first.
    public var lastUse: UInt64 = 0
    /// End of the last read and bytes read in a row before it (sequential reading: prefetch).
    public var readEnd: Int64 = -1
    public var readRun: Int64 = 0

    public init() {}
}
