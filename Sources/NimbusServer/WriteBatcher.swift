import GRDB
import Synchronization

/// Group commit for the SQLite engine: writes that arrive while a transaction is running are
/// queued and then run together in the next transaction, each inside its own savepoint (one
/// failing write rolls back only itself). Answers are delivered only after the transaction has
/// committed, so nobody is told "done" about something that is not durable.
///
/// The first caller that finds the queue idle becomes the leader and drains it; the others wait on
/// their continuations. No task is spawned. Lock: `state` only; never held across `await`.
final class WriteBatcher: Sendable {
    private struct Job: Sendable {
        let run: @Sendable (Database) throws -> (@Sendable () -> Void)
        let fail: @Sendable (any Error) -> Void
    }
    private struct State {
        var queue: [Job] = []
        var draining = false
    }
    private let state = Mutex(State())
    private let pool: DatabasePool
    /// Most writes in one transaction.
    private let maxBatch = 256

    init(pool: DatabasePool) { self.pool = pool }

    func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let promise = Promise<T>()
        let job = Job(
            run: { db in
                let value = try body(db)
                return { promise.fulfill(.success(value)) }
            },
            fail: { promise.fulfill(.failure($0)) })
        let lead = state.withLock { s -> Bool in
            s.queue.append(job)
            if s.draining { return false }
            s.draining = true
            return true
        }
        if lead { await drain() }
        return try await promise.value
    }

    /// Several writes queued together, in this order (the same transaction unless the batch
    /// limit cuts it; each in its own savepoint): one result per write.
    func writeAll<T: Sendable>(_ bodies: [@Sendable (Database) throws -> T]) async -> [Result<T, any Error>] {
        let promises = bodies.map { _ in Promise<T>() }
        let jobs = zip(bodies, promises).map { body, promise in
            Job(run: { db in
                    let value = try body(db)
                    return { promise.fulfill(.success(value)) }
                },
                fail: { promise.fulfill(.failure($0)) })
        }
        let lead = state.withLock { s -> Bool in
            s.queue.append(contentsOf: jobs)
            if s.draining { return false }
            s.draining = true
            return true
        }
        if lead { await drain() }
        var results: [Result<T, any Error>] = []
        for p in promises {
            do { results.append(.success(try await p.value)) } catch { results.append(.failure(error)) }
        }
        return results
    }

    /// Runs batches until the queue is empty. Called by exactly one leader at a time; the SQLite
    /// work runs on GRDB's writer queue, not on the caller's thread.
    private func drain() async {
        while true {
            let batch: [Job] = state.withLock { s in
                if s.queue.isEmpty {
                    s.draining = false
                    return []
                }
                let n = min(s.queue.count, maxBatch)
                let b = Array(s.queue.prefix(n))
                s.queue.removeFirst(n)
                return b
            }
            if batch.isEmpty { return }
            do {
                let (answers, failures) = try await pool.write { db -> ([@Sendable () -> Void], [(Job, any Error)]) in
                    var answers: [@Sendable () -> Void] = []
                    var failures: [(Job, any Error)] = []
                    for job in batch {
                        // Savepoint statements are cached: compiling them per commit costs more than the commit.
                        try db.cachedStatement(sql: "SAVEPOINT nimbus_commit").execute()
                        do {
                            answers.append(try job.run(db))
                            try db.cachedStatement(sql: "RELEASE SAVEPOINT nimbus_commit").execute()
                        } catch {
                            try db.cachedStatement(sql: "ROLLBACK TO SAVEPOINT nimbus_commit").execute()
                            try db.cachedStatement(sql: "RELEASE SAVEPOINT nimbus_commit").execute()
                            failures.append((job, error))
                        }
                    }
                    return (answers, failures)
                }
                for a in answers { a() }
                for (job, error) in failures { job.fail(error) }
            } catch {
                for job in batch { job.fail(error) }
            }
        }
    }
}

/// A value delivered once, awaited once.
final class Promise<T: Sendable>: Sendable {
    private let state = Mutex<(result: Result<T, any Error>?, waiter: CheckedContinuation<T, any Error>?)>((nil, nil))

    func fulfill(_ r: Result<T, any Error>) {
        let waiter = state.withLock { s -> CheckedContinuation<T, any Error>? in
            guard s.result == nil else { return nil }
            s.result = r
            let w = s.waiter
            s.waiter = nil
            return w
        }
        waiter?.resume(with: r)
    }

    var value: T {
        get async throws {
            try await withCheckedThrowingContinuation { c in
                let ready = state.withLock { s -> Result<T, any Error>? in
                    if let r = s.result { return r }
                    s.waiter = c
                    return nil
                }
                if let ready { c.resume(with: ready) }
            }
        }
    }
}
