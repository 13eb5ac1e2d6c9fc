import Logging
import NimbusProtocol
import NIOCore
import PostgresNIO

/// Wakes this instance's long-polls for commits made through any instance.
///
/// Two paths, so a lost notification costs at most `catchUpInterval`, never a sleeping device:
/// - LISTEN on a dedicated connection; each "CONTAINER:CURSOR" payload goes to the notifier at once.
///   When the connection drops, it reconnects (after `reconnectDelay`) and re-subscribes.
/// - Every `catchUpInterval`, the cursors of the containers someone is waiting on are read and
///   announced (also right after each reconnect, for what was sent while disconnected).
///
/// A commit NOTIFYs only while its container is watched (`containers.watched_until` in the
/// future): every listening instance is woken by every notification, so commits to containers
/// no device is waiting on would cost each instance for nothing. A long-poll, before it reads
/// the changes it may wait after, makes sure its container is watched for longer than a poll
/// lasts (`watch`); an instance renews that at most every few minutes per container. No commit
/// can slip between the two: the watch's UPDATE takes the container's row lock, which every
/// commit holds from its first statement to COMMIT. A commit that locked the row first has
/// committed before the poll reads; one that locks it after reads the new `watched_until`.
extension PostgresStore: CommitFeed {
    static let catchUpInterval: Duration = .seconds(2)
    static let reconnectDelay: Duration = .seconds(1)
    /// How long one `watch` keeps a container watched.
    static let watchLease: Duration = .seconds(600)
    /// A watch is renewed when less than this is left: longer than any long-poll waits.
    static let watchRenewal: Duration = .seconds(2 * ProtocolLimits.maxWaitSeconds)

    public func watch(_ container: ContainerRecord) async throws {
        let now = ContinuousClock.now
        if let until = watched.withLock({ $0[container.id] }), until - now > Self.watchRenewal { return }
        // The lease is counted from before the statement is sent: PostgreSQL's now() is later.
        let seconds = Int64(Self.watchLease.components.seconds)
        _ = try await read("""
            UPDATE containers SET watched_until = greatest(watched_until, now() + make_interval(secs => \(seconds)))
            WHERE id = \(container.id)
            """)
        watched.withLock { $0[container.id] = max($0[container.id] ?? now, now + Self.watchLease) }
    }

    public func follow(into notifier: CommitNotifier) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.listen(into: notifier) }
            group.addTask { await self.catchUpLoop(into: notifier) }
            await group.waitForAll()
        }
    }

    private func listen(into notifier: CommitNotifier) async {
        var id = 0
        while !Task.isCancelled {
            id += 1
            do {
                let conn = try await PostgresConnection.connect(configuration: location.connectionConfiguration, id: id, logger: logger)
                do {
                    try await conn.listen(on: Self.channel) { events in
                        // Subscribed: announce what may have been committed while we were not.
                        await catchUp(into: notifier)
                        for try await event in events {
                            let parts = event.payload.split(separator: ":")
                            if parts.count == 2, let container = Int64(parts[0]), let seq = Int64(parts[1]) {
                                notifier.notify(container: container, seq: seq, source: .notification)
                            }
                        }
                    }
                } catch {
                    if !Task.isCancelled { logger.warning("lost the commit notifications from \(location): \(error); reconnecting") }
                }
                try? await conn.close()
            } catch {
                logger.warning("cannot listen for commit notifications on \(location): \(error); retrying in \(Self.reconnectDelay)")
            }
            try? await Task.sleep(for: Self.reconnectDelay)
        }
    }

    private func catchUpLoop(into notifier: CommitNotifier) async {
        while !Task.isCancelled {
            try? await Task.sleep(for: Self.catchUpInterval)
            await catchUp(into: notifier)
            let now = ContinuousClock.now
            watched.withLock { $0 = $0.filter { $0.value > now } }
        }
    }

    /// Announces the current cursor of every container a long-poll waits on.
    func catchUp(into notifier: CommitNotifier) async {
        let waited = notifier.waitedContainers
        guard !waited.isEmpty else { return }
        do {
            for row in try await read("SELECT id, cursor FROM containers WHERE id = ANY(\(waited))") {
                let (id, cursor) = try row.decode((Int64, Int64).self)
                notifier.notify(container: id, seq: cursor, source: .catchUp)
            }
        } catch {
            logger.warning("catch-up read of container cursors failed: \(error)")
        }
    }
}

// MARK: scratch databases (tests, benchmarks)

extension PostgresStore {
    /// Creates database `name` on the server of `admin` (whose user needs CREATEDB).
    public static func createDatabase(_ name: String, admin: PostgresLocation) async throws {
        try await adminStatement(PostgresQuery(unsafeSQL: "CREATE DATABASE \"\(name)\""), admin: admin)
    }

    /// Drops database `name`, closing its remaining connections.
    public static func dropDatabase(_ name: String, admin: PostgresLocation) async throws {
        try await adminStatement(PostgresQuery(unsafeSQL: "DROP DATABASE IF EXISTS \"\(name)\" WITH (FORCE)"), admin: admin)
    }

    /// Runs one SQL statement on `location` and returns the rows' first columns as text (tests use
    /// it to disturb a running deployment, e.g. `pg_terminate_backend`).
    public static func execute(_ sql: String, on location: PostgresLocation) async throws -> [String?] {
        let logger = Logger(label: "nimbus.postgres.admin")
        let conn = try await PostgresConnection.connect(configuration: location.connectionConfiguration, id: 0, logger: logger)
        do {
            var out: [String?] = []
            for try await row in try await conn.query(PostgresQuery(unsafeSQL: sql), logger: logger) {
                out.append(try? row.decode(String?.self))
            }
            try await conn.close()
            return out
        } catch {
            try? await conn.close()
            throw error
        }
    }

    private static func adminStatement(_ q: PostgresQuery, admin: PostgresLocation) async throws {
        let logger = Logger(label: "nimbus.postgres.admin")
        do {
            let conn = try await PostgresConnection.connect(configuration: admin.connectionConfiguration, id: 0, logger: logger)
            do {
                _ = try await conn.query(q, logger: logger)
            } catch {
                try? await conn.close()
                throw error
            }
            try await conn.close()
        } catch let error as PSQLError {
            // PSQLError's description hides what the server said; say it (SQLSTATE and message).
            let state = error.serverInfo?[.sqlState] ?? "none"
            let message = error.serverInfo?[.message] ?? String(describing: error.code)
            throw APIError(.unavailable, "PostgreSQL refused \(q.sql): \(message) (SQLSTATE \(state))")
        }
    }
}
