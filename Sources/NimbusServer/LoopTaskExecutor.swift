import NIOCore

/// Runs tasks on one event loop: a task that talks to a channel of that loop (a PostgreSQL
/// connection) then does its work where the channel's I/O happens, with no thread between them.
final class LoopTaskExecutor: TaskExecutor {
    let loop: any EventLoop
    init(_ loop: any EventLoop) { self.loop = loop }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        loop.execute { job.runSynchronously(on: executor) }
    }
}
