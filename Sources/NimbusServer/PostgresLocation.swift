import Foundation
import Logging
import NIOCore
import NIOSSL
import PostgresNIO

/// Where a PostgreSQL metadata database is: parsed from `postgres://USER:PASS@HOST:PORT/DB`
/// (`postgresql://` too), with libpq's `sslmode` and `sslrootcert` (`PostgresTLS`).
public struct PostgresLocation: Sendable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var tls: PostgresTLS
    /// How long a statement waits for a lock before it fails (`lock_timeout`): a container row held
    /// by a stuck instance costs devices a retryable error, not a request that never ends.
    public var lockTimeout: Duration = .seconds(30)
    /// How long PostgreSQL keeps a session that sits idle inside a transaction before it ends it and
    /// releases its locks (`idle_in_transaction_session_timeout`): an instance that stopped (paused,
    /// cut off, hung) mid-commit holds its container's lock for at most this long.
    public var idleInTransactionTimeout: Duration = .seconds(60)
    /// How long a transaction of this process waits for PostgreSQL's answers in all before its
    /// connection is closed and it fails (`unavailable`): longer than `lockTimeout`, so a lock wait
    /// gets its own error first.
    public var answerTimeout: Duration = .seconds(60)

    public init(host: String, port: Int = 5432, username: String, password: String?, database: String, tls: PostgresTLS = .disable) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.database = database
        self.tls = tls
    }

    /// Whether `text` names a PostgreSQL database (as opposed to a data directory).
    public static func isURL(_ text: String) -> Bool {
        text.hasPrefix("postgres://") || text.hasPrefix("postgresql://")
    }

    public static func parse(_ text: String) throws -> PostgresLocation {
        let usage = "write the database as postgres://USER:PASSWORD@HOST:PORT/DATABASE"
        guard isURL(text), let url = URLComponents(string: text) else {
            throw APIError(.badRequest, "\(text.debugDescription) is not a PostgreSQL URL; \(usage)")
        }
        guard let host = url.host, !host.isEmpty else { throw APIError(.badRequest, "the PostgreSQL URL has no host; \(usage)") }
        guard let user = url.user, !user.isEmpty else { throw APIError(.badRequest, "the PostgreSQL URL has no user; \(usage)") }
        let db = String(url.path.drop(while: { $0 == "/" }))
        guard !db.isEmpty else { throw APIError(.badRequest, "the PostgreSQL URL names no database; \(usage)") }
        var mode: String?, rootCert: String?
        for item in url.queryItems ?? [] {
            switch item.name {
            case "sslmode": mode = item.value ?? ""
            case "sslrootcert": rootCert = item.value ?? ""
            case "sslcert", "sslkey", "sslpassword":
                throw APIError(.badRequest, "\(item.name) (a client certificate) is not supported: authenticate with the password in the URL, over sslmode=verify-full")
            default:
                throw APIError(.badRequest, "the PostgreSQL URL has an unknown parameter \(item.name.debugDescription); the ones understood are sslmode and sslrootcert")
            }
        }
        let tls = try PostgresTLS.parse(mode: mode, rootCert: rootCert)
        return PostgresLocation(host: host, port: url.port ?? 5432, username: user, password: url.password, database: db, tls: tls)
    }

    /// Why connecting failed: the TLS problem in words when it is one (`PostgresTLS.explain`),
    /// else the error as it came.
    public func connectFailure(_ error: any Error) -> String {
        tls.explain(error, host: host) ?? String(reflecting: error)
    }

    /// The same server and credentials, another database (tests create one per case).
    public func with(database: String) -> PostgresLocation {
        var copy = self
        copy.database = database
        return copy
    }

    /// The URL without the password, for logs and messages.
    public var description: String { "postgres://\(username)@\(host):\(port)/\(database)\(tls.query)" }

    var clientConfiguration: PostgresClient.Configuration {
        var c = PostgresClient.Configuration(host: host, port: port, username: username, password: password, database: database, tls: tls.client)
        c.options.maximumConnections = 24
        c.options.connectTimeout = .seconds(10)
        c.options.tlsServerName = tlsServerName
        c.options.additionalStartupParameters = sessionParameters
        return c
    }

    var connectionConfiguration: PostgresConnection.Configuration {
        var c = PostgresConnection.Configuration(host: host, port: port, username: username, password: password, database: database, tls: tls.connection)
        c.options.connectTimeout = .seconds(10)
        c.options.tlsServerName = tlsServerName
        c.options.additionalStartupParameters = sessionParameters
        return c
    }

    /// Set on every connection as it starts.
    var sessionParameters: [(String, String)] {
        func ms(_ d: Duration) -> String { "\(max(1, d.components.seconds * 1000 + d.components.attoseconds / 1_000_000_000_000_000))ms" }
        return [("lock_timeout", ms(lockTimeout)), ("idle_in_transaction_session_timeout", ms(idleInTransactionTimeout))]
    }

    /// The name the server's certificate must carry under verify-full (and that SNI sends): the
    /// host of the URL, unless it is an IP address, which the certificate must list instead.
    /// Given explicitly: the pool connects to the address it resolved, and would otherwise check
    /// the certificate against that address rather than the name in the URL.
    var tlsServerName: String? {
        tls.mode == .disable || (try? SocketAddress(ipAddress: host, port: 0)) != nil ? nil : host
    }

    /// Connects once and closes. The pool retries a connection that fails quietly for ever; this
    /// fails within the connect timeout and says why (`connectFailure`).
    public func probe(logger: Logger) async throws {
        let connection = try await PostgresConnection.connect(configuration: connectionConfiguration, id: 0, logger: logger)
        try await connection.close()
    }
}
