/// When the content of a file that keeps changing may be uploaded again.
///
/// A save uploads at once. A file that keeps changing — changed again before it had been quiet
/// for a quiet period — is paced by two rules, so a program appending to a log every second or
/// rewriting a file in place all day does not upload it over and over:
/// - **at most one upload per quiet period** once a short burst is used up (a generic cell-rate
///   bucket: `burst` uploads at once, then one more per quiet period);
/// - **bytes uploaded stay within about twice the bytes the program wrote**: after the first
///   upload of a run of changes, another goes only when the program has written, since that
///   first upload, at least what the later uploads sent plus what the next one will (estimated
///   as the size of the last). The uploads in between never send more than the program wrote,
///   which leaves the other half for the last state of the run, which always goes (a log whose
///   every upload sends the whole file: 1.6–2.6×, by where the run ends). A whole-file rewrite
///   earns its upload; an append of a few bytes to a large file waits.
///
/// What waits is never lost: it is in the local state, and it goes once the file has had no
/// change for a quiet period (the last state of a run always reaches the server). While the
/// program goes on, the server's copy lags by the time the program takes to write what the
/// uploads of the run sent so far plus the next (a log growing 100 bytes a second in a 256 KiB
/// chunk: 45 minutes or more).
///
/// Pure: no clock, no I/O. Instants are passed in, so the engine runs it on its clock and tests
/// on a stepped one.
public struct UploadPacing<Instant: InstantProtocol>: Sendable, Equatable where Instant.Duration == Duration, Instant: Sendable {
    public struct Rules: Sendable, Equatable {
        /// The quiet period; 0 turns pacing off.
        public var quietPeriod: Duration
        /// Uploads that may follow each other at once before the one-per-quiet-period rule.
        public var burst: Int

        public init(quietPeriod: Duration, burst: Int = 3) {
            self.quietPeriod = quietPeriod
            self.burst = max(1, burst)
        }
    }

    public enum Decision: Sendable, Equatable {
        case now
        /// Ask again then (or at the next change: more bytes written may earn the upload sooner).
        case wait(until: Instant)
    }

    /// The bucket's theoretical arrival time: uploads are allowed while it is at most
    /// `(burst - 1)` quiet periods ahead of now.
    public private(set) var bucket: Instant?
    /// The last time the engine learned that the content changed (close, fsync, truncate).
    public private(set) var lastChange: Instant?
    /// The last upload that sent content.
    public private(set) var lastUpload: Instant?
    /// The program's written-bytes counter when the first upload of this run read the content.
    public private(set) var writtenAtStart: UInt64?
    /// Bytes sent by the uploads of this run after its first.
    public private(set) var sentSinceStart: Int64 = 0
    /// Bytes sent by the last upload: the estimate of the next one.
    public private(set) var lastSent: Int64 = 0

    public init() {}

    /// The content changed. After a quiet period without changes a new run starts: its first
    /// upload is never held by the byte rule.
    public mutating func changed(at now: Instant, rules: Rules) {
        if let last = lastChange, now >= last.advanced(by: rules.quietPeriod) {
            writtenAtStart = nil
            sentSinceStart = 0
        }
        lastChange = now
    }

    /// Whether an upload may start now. `written` is the program's written-bytes counter of the
    /// file now (it may restart from 0 when the file's node changes: then all of it counts).
    public func decide(at now: Instant, written: UInt64, rules: Rules) -> Decision {
        guard rules.quietPeriod > .zero else { return .now }
        let window = rules.quietPeriod * (rules.burst - 1)
        if let bucket, bucket > now.advanced(by: window) {
            return .wait(until: bucket.advanced(by: .zero - window))
        }
        guard let start = writtenAtStart, sentSinceStart > 0 else { return .now }
        let wrote = written >= start ? written - start : written
        // sent + next ≤ written, leaving as much again for the run's last state. Each term is
        // at most Int64.max, so the sum cannot overflow.
        if UInt64(sentSinceStart) + UInt64(lastSent) <= wrote { return .now }
        // The last state of a run of changes: quiet since the last change — or, when none was
        // seen (uploads retried after a restart), since the last upload.
        guard let since = lastChange ?? lastUpload else { return .now }
        let quiet = since.advanced(by: rules.quietPeriod)
        return now >= quiet ? .now : .wait(until: quiet)
    }

    /// An upload read the content when the counter was `written` and sent `sent` bytes of new
    /// chunks (also when it stopped midway because the file changed underneath).
    public mutating func uploaded(at now: Instant, sent: Int64, written: UInt64, rules: Rules) {
        guard rules.quietPeriod > .zero else { return }
        bucket = max(bucket ?? now, now).advanced(by: rules.quietPeriod)
        lastUpload = now
        lastSent = max(0, sent)
        if writtenAtStart == nil {
            writtenAtStart = written
        } else {
            sentSinceStart = sentSinceStart.addingReportingOverflow(max(0, sent)).overflow ? .max : sentSinceStart + max(0, sent)
        }
    }

    /// Nothing left to pace: quiet for the whole bucket window, so a new change uploads at once
    /// and a new run starts. The engine forgets such records.
    public func isIdle(at now: Instant, rules: Rules) -> Bool {
        guard let idle = idleFrom(rules: rules) else { return true }
        return now >= idle
    }

    /// The first instant `isIdle` holds at while nothing changes; nil when it holds at any.
    public func idleFrom(rules: Rules) -> Instant? {
        guard let last = lastChange ?? lastUpload else { return nil }
        let end = last.advanced(by: rules.quietPeriod * rules.burst)
        guard let bucket else { return end }
        return max(end, bucket)
    }
}
