import NimbusProtocol
import Prometheus
import Synchronization

/// The server's Prometheus metrics, on a registry of its own (no global bootstrap, so several
/// servers can live in one test process). Served as text at `GET /metrics`.
public final class ServerMetrics: Sendable {
    public let registry = PrometheusCollectorRegistry()
    let commits: Counter
    let conflicts: Counter
    let bytesIn: Counter
    let bytesOut: Counter
    let longPolls: Gauge
    let chunksFreed: Counter
    let chunkBytesFreed: Counter
    let trashPurged: Counter
    let trashBytesPurged: Counter
    let announcements: [CommitNotifier.Source: Counter]
    let dbStatements: Counter
    let dbWaits: Counter
    /// The store's counts at the last `emit` (the counters above advance by the difference).
    private let dbSeen = Mutex(DatabaseRoundTrips(statements: 0, waits: 0))

    public init() {
        commits = registry.makeCounter(name: "nimbus_commits_total", help: "Commits and resolves applied.")
        conflicts = registry.makeCounter(name: "nimbus_conflicts_total", help: "Commits that produced a conflict version.")
        bytesIn = registry.makeCounter(name: "nimbus_chunk_bytes_in_total", help: "Chunk bytes uploaded.")
        bytesOut = registry.makeCounter(name: "nimbus_chunk_bytes_out_total", help: "Chunk bytes downloaded.")
        chunksFreed = registry.makeCounter(name: "nimbus_gc_chunks_freed_total", help: "Chunks deleted by this instance's garbage collection.")
        chunkBytesFreed = registry.makeCounter(name: "nimbus_gc_bytes_freed_total", help: "Chunk bytes deleted by this instance's garbage collection.")
        trashPurged = registry.makeCounter(name: "nimbus_trash_purged_entries_total",
                                           help: "Recently Deleted entries purged by this instance (expired, or asked for).")
        trashBytesPurged = registry.makeCounter(name: "nimbus_trash_purged_bytes_total",
                                                help: "File bytes of the Recently Deleted entries this instance purged.")
        longPolls = registry.makeGauge(name: "nimbus_longpolls_waiting", help: "Change requests waiting for a commit.")
        var announcements: [CommitNotifier.Source: Counter] = [:]
        for source in CommitNotifier.Source.allCases {
            announcements[source] = registry.makeCounter(
                name: "nimbus_journal_announcements_total", labels: [("source", source.rawValue)],
                help: "Journal advances announced to long-polls, by source (commit here, NOTIFY from another instance, catch-up read).")
        }
        self.announcements = announcements
        dbStatements = registry.makeCounter(name: "nimbus_db_statements_total",
                                            help: "Statements sent to PostgreSQL (each one round trip on the connection).")
        dbWaits = registry.makeCounter(name: "nimbus_db_waits_total",
                                       help: "Times a server thread waited for PostgreSQL's answers (queued writes are answered together).")
    }

    /// Brings the database counters up to the store's counts (called before `emit`).
    func observe(_ trips: DatabaseRoundTrips?) {
        guard let trips else { return }
        let (statements, waits) = dbSeen.withLock { seen in
            // Two scrapes at once: the later count wins, nothing is counted twice.
            let d = (max(0, trips.statements - seen.statements), max(0, trips.waits - seen.waits))
            seen.statements += d.0
            seen.waits += d.1
            return d
        }
        if statements > 0 { dbStatements.increment(by: statements) }
        if waits > 0 { dbWaits.increment(by: waits) }
    }

    func purged(_ r: TrashPurgeResponse) {
        trashPurged.increment(by: Int64(r.entries))
        trashBytesPurged.increment(by: r.bytes)
    }

    func collected(_ report: CollectionReport) {
        guard !report.dryRun, !report.skipped else { return }
        chunksFreed.increment(by: Int64(report.chunks))
        chunkBytesFreed.increment(by: report.bytes)
    }

    func announced(_ source: CommitNotifier.Source) {
        announcements[source]?.increment()
    }

    private let requestCounters = LockedDictionary<Counter>()

    func request(method: String, status: Int) {
        let key = "\(method) \(status)"
        if let c = requestCounters[key] {
            c.increment()
            return
        }
        let c = registry.makeCounter(name: "nimbus_http_requests_total", labels: [("method", method), ("status", String(status))],
                                     help: "HTTP requests answered.")
        requestCounters[key] = c
        c.increment()
    }

    public func emit() -> [UInt8] {
        var out: [UInt8] = []
        registry.emit(into: &out)
        return out
    }
}
