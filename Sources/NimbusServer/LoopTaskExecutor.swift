import HummingbirdCore
import Logging
import NIOCore

/// Runs tasks on one event loop: a task that talks to a channel of that loop then does its work
/// where the channel's I/O happens, with no thread between them.
final class LoopTaskExecutor: TaskExecutor {
    let loop: any EventLoop
    init(_ loop: any EventLoop) { self.loop = loop }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        loop.execute { job.runSynchronously(on: executor) }
    }
}

/// Hummingbird's HTTP/1 connection, with the connection's task (reading requests, running the
/// handlers, writing responses) on the connection's own event loop instead of the global
/// executor: a request then costs no thread switch between the socket and its handler.
/// Handlers never block (file I/O runs on thread pools, SQLite on GRDB's queues, PostgreSQL on
/// its connections' loops), so a connection's work never stalls the loop's others for long.
struct LoopBoundHTTP1Channel: ServerChildChannel {
    let base: HTTP1Channel

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<HTTP1Channel.Value> {
        base.setup(channel: channel, logger: logger)
    }

    func handle(value: HTTP1Channel.Value, logger: Logger) async {
        await withTaskExecutorPreference(LoopTaskExecutor(value.channel.eventLoop)) {
            await base.handle(value: value, logger: logger)
        }
    }
}
