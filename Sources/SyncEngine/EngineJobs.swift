/// The engine's short-lived work — chunk downloads, a held version applied after an unlock, the
/// wait of an editor's save — as children of one task group that the engine's `jobs` task owns:
/// `stop()` cancels that task and waits for every job, so nothing the engine started outlives it.
///
/// Jobs are handed over through an unbounded stream, from any thread (libfuse threads too),
/// and started in order.
final class EngineJobs: Sendable {
    typealias Job = @Sendable () async -> Void
    private let jobs: AsyncStream<Job>
    private let feed: AsyncStream<Job>.Continuation

    init() {
        (jobs, feed) = AsyncStream.makeStream(of: Job.self)
    }

    /// Runs the jobs until `finish()` or cancellation, then waits for those still running
    /// (cancelled with this task).
    func run() async {
        await withDiscardingTaskGroup { group in
            for await job in jobs {
                group.addTask { await job() }
            }
        }
    }

    /// Starts `job` as a child of `run()`. False when the engine is stopping: the job does not
    /// run, and the caller answers whoever waits for it.
    @discardableResult
    func spawn(_ job: @escaping Job) -> Bool {
        if case .terminated = feed.yield(job) { return false }
        return true
    }

    /// No new jobs; `run()` ends once the running ones have.
    func finish() { feed.finish() }
}
