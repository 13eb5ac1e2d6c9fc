import Logging
import NimbusCore
import ServiceLifecycle

/// Chunk garbage collection: frees the chunks that no version refers to (current, conflict or
/// kept history, in any container of any account) once nobody has touched them for `grace`.
///
/// The state it works on (both engines, same schema):
/// - an **ownership** (`account_chunks` row) says an account may refer to a chunk; commits check
///   it. It carries `touched`, the last time it was recorded (upload) or claimed (an upload of an
///   owned chunk, or `POST /v1/chunks/missing` reporting the chunk present): its lease;
/// - an **upload** (`chunk_uploads` row) is recorded before a chunk's bytes are written and
///   removed, in the same transaction that records the ownership, after they are;
/// - a **deletion** (`chunk_deletions` row) is recorded before a chunk's bytes are deleted and
///   removed after they are gone.
///
/// One run, under the store-wide collector lock (one collector at a time, in all processes and
/// instances):
/// 1. finish the deletions a crashed run left (delete the bytes, forget the deletion);
/// 2. **mark**: in one snapshot, each container's cursor and the chunks that no version refers
///    to and that have an ownership or upload untouched since `now - grace` (the candidates);
/// 3. **sweep**, in transactions of up to `batch` candidates: read the versions written since the
///    mark (every version row gets a new sequence number of its container, so they are exactly
///    those above the mark's cursors), drop the candidates they refer to, delete the stale
///    ownerships and uploads of the rest (their `touched`/`started` re-checked in the
///    transaction), and for each chunk left with neither, record its deletion;
/// 4. after that transaction has committed, delete those chunks' bytes, then forget the
///    deletions.
///
/// Why it cannot race:
/// - **A commit** refers to a chunk only after finding the account's ownership in its own
///   transaction. SQLite: the sweep's transaction and the commit's are both write transactions
///   of one database, so one runs entirely before the other: the sweep sees the commit's versions
///   or the commit sees no ownership (`missing_chunks`; the device uploads again). PostgreSQL: the
///   commit holds the ownerships `FOR KEY SHARE`; the sweep takes them `FOR UPDATE SKIP LOCKED`
///   and reads the new versions only after that, so a commit still in flight keeps its
///   ownerships (skipped), one that committed is seen, and one that comes after finds none.
///   Restoring a version copies chunks without an ownership check, but the version it copies
///   was visible to the mark or is among the new versions, so its chunks are not candidates.
/// - **An upload** records itself before writing bytes; the sweep dooms a chunk only when no
///   upload is recorded (or the ones recorded are older than `grace`, and removing them makes
///   their uploads fail with `busy` at their end), and an upload cannot begin while the chunk's
///   deletion is recorded (`busy`). Recording an upload and recording a deletion exclude each
///   other (SQLite: one writer; PostgreSQL: an advisory lock on the hash). So bytes are deleted
///   only while no upload can write them and no ownership can be recorded for them: an
///   ownership always has its bytes.
/// - **A device between "missing" and its commit**: `POST /v1/chunks/missing` touches what it
///   reports present, in the same write, so those chunks stay for `grace` from then. A commit
///   later than that may get `missing_chunks` and uploads again: slower, never wrong.
/// - **Chunks are shared by content** between accounts (one file or object per hash): an
///   ownership is removed only while no version at all refers to the chunk, and bytes only when
///   no ownership is left.
/// - **Another collector**: the collector lock. Without it a crash's leftover deletion (step 1)
///   could not be told from one in progress; the sweep alone also deletes an ownership once
///   (row locks) and dooms a chunk only when its own transaction removed the last claim.
/// Times are the servers' clocks (`now`): instances must agree to well within `grace`.
public struct ChunkCollector: Sendable {
    public let store: any ServerStore
    public let chunks: any ChunkStore
    /// How long an untouched ownership or upload is kept, in nanoseconds.
    public let grace: Int64
    /// Candidates per sweep transaction.
    public var batch = 200

    public init(store: any ServerStore, chunks: any ChunkStore, graceSeconds: Int64) {
        self.store = store
        self.chunks = chunks
        grace = graceSeconds.multipliedReportingOverflow(by: 1_000_000_000).overflow ? .max : graceSeconds * 1_000_000_000
    }

    /// Longest grace accepted at the edge (`--grace`, `--gc-grace`): ten years.
    public static let maxGraceSeconds: Int64 = 10 * 366 * 86_400

    /// Collects at server time `now` (ns). With `dryRun`, only reports what a run would free.
    public func run(now: Int64, dryRun: Bool = false) async throws -> CollectionReport {
        let cutoff = now.subtractingReportingOverflow(grace).overflow ? .min : now - grace
        if dryRun {
            let mark = try await store.markChunks(staleAt: cutoff)
            let freeable = mark.candidates.values.filter(\.freeable)
            return CollectionReport(chunks: freeable.count, bytes: freeable.reduce(0) { $0 + ($1.size ?? 0) },
                                    released: mark.candidates.count, dryRun: true)
        }
        let report = try await store.withCollectorLock { () async throws -> CollectionReport in
            var report = CollectionReport()
            let leftovers = try await store.chunkDeletions()
            try await delete(leftovers.map { ($0, nil) }, into: &report)
            let mark = try await store.markChunks(staleAt: cutoff)
            try await sweep(mark.candidates.keys.sorted(), mark: mark, staleAt: cutoff, now: now, into: &report)
            return report
        }
        return report ?? CollectionReport(skipped: true)
    }

    /// Frees now, whatever the grace, those of `hashes` that no version refers to: the chunks of
    /// Recently Deleted entries just purged to make room under a quota. Ignoring the grace only
    /// costs a device that was told it has one of those chunks a `missing_chunks` (it uploads
    /// again), and an upload of one under way a `busy`: slower, never wrong. Skipped (nothing
    /// freed) while another collection runs.
    public func reclaim(_ hashes: Set<ContentHash>, now: Int64) async throws -> CollectionReport {
        guard !hashes.isEmpty else { return CollectionReport() }
        let report = try await store.withCollectorLock { () async throws -> CollectionReport in
            var report = CollectionReport()
            let mark = try await store.markChunks(staleAt: now)
            try await sweep(mark.candidates.keys.filter(hashes.contains).sorted(), mark: mark, staleAt: now, now: now, into: &report)
            return report
        }
        return report ?? CollectionReport(skipped: true)
    }

    /// Sweeps `candidates` of `mark` in transactions of `batch`, deleting the bytes of what each
    /// dooms.
    private func sweep(_ candidates: [ContentHash], mark: ChunkMark, staleAt cutoff: Int64, now: Int64,
                       into report: inout CollectionReport) async throws {
        for start in stride(from: 0, to: candidates.count, by: batch) {
            try Task.checkCancellation()
            let part = Array(candidates[start..<min(start + batch, candidates.count)])
            let sweep = try await store.sweepChunks(part, mark: mark, staleAt: cutoff, now: now)
            report.released += sweep.released
            try await delete(sweep.doomed, into: &report)
        }
    }

    /// Deletes the bytes of doomed chunks, then forgets their deletions.
    private func delete(_ doomed: [(hash: ContentHash, size: Int64?)], into report: inout CollectionReport) async throws {
        guard !doomed.isEmpty else { return }
        for (hash, size) in doomed {
            // Only an upload claimed a chunk without a size: it was freed if its bytes got written.
            let bytes = size != nil ? size : try await chunks.size(of: hash)
            try await chunks.delete(hash)
            if let bytes {
                report.chunks += 1
                report.bytes += bytes
            }
        }
        try await store.forgetChunkDeletions(doomed.map(\.hash))
    }
}

/// What a collection freed (or, dry, would free).
public struct CollectionReport: Sendable, Hashable, CustomStringConvertible {
    /// Chunks whose bytes were deleted.
    public var chunks = 0
    public var bytes: Int64 = 0
    /// Ownerships removed (a chunk another account still owns loses only this account's).
    public var released = 0
    public var dryRun = false
    /// Another collector was running; nothing was done.
    public var skipped = false

    public init(chunks: Int = 0, bytes: Int64 = 0, released: Int = 0, dryRun: Bool = false, skipped: Bool = false) {
        self.chunks = chunks
        self.bytes = bytes
        self.released = released
        self.dryRun = dryRun
        self.skipped = skipped
    }

    public var description: String {
        if skipped { return "another garbage collection is running; nothing done" }
        if dryRun { return "would free \(chunks) chunk(s), \(bytes) bytes (\(released) unreferenced chunk(s) with a stale ownership or upload)" }
        return "freed \(chunks) chunk(s), \(bytes) bytes (\(released) ownership(s) released)"
    }
}

/// `nimbus serve`'s periodic collection: the first a minute after start (or after `interval`
/// when shorter), then every `interval`. Stops at graceful shutdown; a run cut short leaves
/// nothing unsafe (its recorded deletions are finished by the next run, on any instance).
struct ChunkCollectorService: Service {
    let collector: ChunkCollector
    let interval: Duration
    let clock: @Sendable () -> Int64
    let metrics: ServerMetrics
    let logger: Logger

    /// Returns (never throws) at graceful shutdown: a service that throws fails the whole group.
    func run() async throws {
        await cancelWhenGracefulShutdown { await self.loop() }
    }

    private func loop() async {
        var wait = min(interval, .seconds(60))
        while true {
            do { try await Task.sleep(for: wait) } catch { return }
            wait = interval
            do {
                let report = try await collector.run(now: clock())
                metrics.collected(report)
                if !report.skipped { logger.info("chunk garbage collection: \(report)") }
            } catch {
                if Task.isCancelled { return }
                logger.warning("chunk garbage collection failed (next try in \(interval)): \(error)")
            }
        }
    }
}
