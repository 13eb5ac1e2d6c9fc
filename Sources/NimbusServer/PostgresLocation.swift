import Foundation
import PostgresNIO

/// Where a PostgreSQL metadata database is: parsed from `postgres://USER:PASS@HOST:PORT/DB`
/// (`postgresql://` too). `?sslmode=disable` is the only TLS mode supported for now, so the URL
/// is refused when it asks for TLS rather than silently sending the password in the clear.
public struct PostgresLocation: Sendable, CustomStringConvertible {
    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String

    public init(host: String, port: Int = 5432, username: String, password: String?, database: String) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.database = database
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
        for item in url.queryItems ?? [] where item.name == "sslmode" && item.value != "disable" {
            throw APIError(.badRequest, "sslmode=\(item.value ?? "") is not supported yet; reach PostgreSQL over a private network or a TLS tunnel and use sslmode=disable")
        }
        return PostgresLocation(host: host, port: url.port ?? 5432, username: user, password: url.password, database: db)
    }

    /// The same server and credentials, another database (tests create one per case).
    public func with(database: String) -> PostgresLocation {
        var copy = self
        copy.database = database
        return copy
    }

    /// The URL without the password, for logs and messages.
    public var description: String { "postgres://\(username)@\(host):\(port)/\(database)" }

    var clientConfiguration: PostgresClient.Configuration {
        var c = PostgresClient.Configuration(host: host, port: port, username: username, password: password, database: database, tls: .disable)
        c.options.maximumConnections = 24
        c.options.connectTimeout = .seconds(10)
        return c
    }

    var connectionConfiguration: PostgresConnection.Configuration {
        var c = PostgresConnection.Configuration(host: host, port: port, username: username, password: password, database: database, tls: .disable)
        c.options.connectTimeout = .seconds(10)
        return c
    }
}
