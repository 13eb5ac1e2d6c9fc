import ArgumentParser
import Foundation
import Logging
import NimbusServer

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the sync server (embedded SQLite + chunk directory, or PostgreSQL + S3 for several instances).",
        discussion: """
            Prints "nimbus serve: listening on http://HOST:PORT" once it accepts connections.
            Stops gracefully on SIGINT or SIGTERM, at once: open long-polls are answered first. --listen 127.0.0.1:0 picks a free port.
            Log lines go to stderr, timestamped; under systemd (stderr is the journal) with a syslog priority and no timestamp.
            Any number of instances may share one --database and one --chunks (see docs/deploy.md).
            s3:// chunks read AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
            Chunks no version refers to are freed every --gc-interval seconds once untouched for --gc-grace seconds (docs/deploy.md).
            History: an earlier version of an item is pruned when it is both beyond the item's last --keep-versions previous versions and older than --keep-days days, when the item next changes; the current and unresolved conflict versions are always kept (docs/deploy.md).
            Recently Deleted: a deleted item stays restorable, with its history, for --keep-deleted-days days, then it is purged (docs/trash.md).
            """)

    @Option(help: "Data directory: metadata.sqlite and chunks/ live here (created if missing).")
    var data: String?

    @Option(help: "Metadata in PostgreSQL instead of DATA/metadata.sqlite: postgres://USER:PASSWORD@HOST:PORT/DATABASE.")
    var database: String?

    @Option(help: "Chunks in this directory or S3-compatible bucket (s3://BUCKET/PREFIX) instead of DATA/chunks.")
    var chunks: String?

    @Option(name: .customLong("keep-versions"), parsing: .unconditional,
            help: ArgumentHelp("Keep each item's last N previous versions whatever their age (0: only what --keep-days keeps).", valueName: "N"))
    var keepVersions: Int = HistoryRetention.default.keepVersions

    @Option(name: .customLong("keep-days"), parsing: .unconditional,
            help: ArgumentHelp("Keep every earlier version younger than D days however many (0: only what --keep-versions keeps).", valueName: "D"))
    var keepDays: Int = HistoryRetention.default.keepDays

    var storage: StorageOptions {
        StorageOptions(dataDir: data, database: database, chunks: chunks,
                       history: HistoryRetention(keepVersions: keepVersions, keepDays: keepDays) ?? .default)
    }

    @Option(name: .customLong("keep-deleted-days"), parsing: .unconditional,
            help: ArgumentHelp("Keep deleted items restorable this many days (fractions allowed; 0: purge at once).", valueName: "D"))
    var keepDeletedDays: Double = TrashRetention.defaultDays

    @Option(name: .customLong("web-idle"), parsing: .unconditional,
            help: ArgumentHelp("Sign a web view session out after this many seconds unused (default 12 hours).", valueName: "SECONDS"))
    var webIdle: Int64 = NimbusServerApp.defaultWebIdleSeconds

    @Option(name: .customLong("gc-interval"), parsing: .unconditional,
            help: ArgumentHelp("Collect unreferenced chunks every this many seconds (0: never; `nimbus admin gc` runs one by hand).", valueName: "SECONDS"))
    var gcInterval: Int64 = 3_600

    @Option(name: .customLong("gc-grace"), parsing: .unconditional,
            help: ArgumentHelp("Keep chunks uploaded, or reported present to a device, less than this long ago.", valueName: "SECONDS"))
    var gcGrace: Int64 = 3_600

    @Option(help: "Address to listen on, HOST:PORT.")
    var listen: String = "127.0.0.1:7070"

    @Option(name: .customLong("tls-cert"), help: ArgumentHelp("HTTPS: the certificate chain (PEM, server certificate first); read again on SIGHUP.", valueName: "FILE"))
    var tlsCert: String?

    @Option(name: .customLong("tls-key"), help: ArgumentHelp("HTTPS: the certificate's private key (PEM, no passphrase); read again on SIGHUP.", valueName: "FILE"))
    var tlsKey: String?

    @Option(name: .customLong("trusted-proxy"), help: ArgumentHelp("A reverse proxy's address (repeatable): its X-Forwarded-For names the client for pairing's wrong-code limit.", valueName: "ADDRESS"))
    var trustedProxy: [String] = []

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "info"

    func validate() throws {
        _ = try HostPort.parse(listen)
        guard Logger.Level(rawValue: logLevel) != nil else { throw ValidationError("unknown log level \(logLevel)") }
        if let problem = storage.problem { throw ValidationError(problem) }
        if (tlsCert == nil) != (tlsKey == nil) { throw ValidationError("--tls-cert and --tls-key go together (HTTPS needs both)") }
        if let problem = HistoryRetention.problem(keepVersions: keepVersions, keepDays: keepDays) { throw ValidationError(problem) }
        if let problem = TrashRetention.problem(days: keepDeletedDays) { throw ValidationError(problem) }
        if !(1...(366 * 86_400)).contains(webIdle) { throw ValidationError("--web-idle is 1 second to 366 days, in seconds (\(webIdle) given)") }
        guard (0...ChunkCollector.maxGraceSeconds).contains(gcInterval) else {
            throw ValidationError("--gc-interval takes 0…\(ChunkCollector.maxGraceSeconds) seconds (got \(gcInterval))")
        }
        guard (0...ChunkCollector.maxGraceSeconds).contains(gcGrace) else {
            throw ValidationError("--gc-grace takes 0…\(ChunkCollector.maxGraceSeconds) seconds (got \(gcGrace))")
        }
    }

    func run() async throws {
        // Everything the server writes (database, chunks, temp files) is for this user only.
        umask(0o077)
        let (host, port) = try HostPort.parse(listen)
        var logger = Logger(label: "nimbus.serve")
        logger.logLevel = Logger.Level(rawValue: logLevel) ?? .info
        var tls: ServerTLS?
        if let tlsCert, let tlsKey {
            do { tls = try ServerTLS(certFile: tlsCert, keyFile: tlsKey) } catch {
                throw CLIFailure(.usage, "cannot serve HTTPS: \(error)")
            }
        }
        var app: NimbusServerApp
        let storage = storage
        do {
            app = try await storage.openApp(logger: logger)
        } catch let e as APIError {
            throw CLIFailure(.storage, "cannot open the storage (\(storage.summary)): \(e.message)")
        } catch {
            throw CLIFailure(.storage, "cannot open the storage (\(storage.summary)): \(error)")
        }
        app.trustedProxies = Set(trustedProxy)
        app.gcInterval = gcInterval > 0 ? .seconds(gcInterval) : nil
        app.gcGraceSeconds = gcGrace
        app.trashKeepSeconds = TrashRetention.seconds(days: keepDeletedDays)
        app.webIdleSeconds = webIdle
        let dataDir = storage.summary
        logger.info("history: \(storage.history)")
        logger.info("Recently Deleted keeps a deleted item \(app.trashKeepSeconds) s (--keep-deleted-days \(keepDeletedDays))")
        logger.info(gcInterval > 0 ? "chunk garbage collection every \(gcInterval) s, grace \(gcGrace) s" : "chunk garbage collection off (--gc-interval 0)")
        if let tls { logger.info("HTTPS with \(tls.summary) (\(tls.certFile)); SIGHUP reads it again") }
        let scheme = tls == nil ? "http" : "https"
        let shownHost = host.contains(":") ? "[\(host)]" : host
        do {
            try await app.run(host: host, port: port, tls: tls, logger: logger) { bound in
                FileHandle.standardOutput.write(Data("nimbus serve: listening on \(scheme)://\(shownHost):\(bound) (\(dataDir))\n".utf8))
            }
        } catch {
            throw CLIFailure(.network, "cannot serve on \(listen): \(error). Is another server using that port? Pick another with --listen.")
        }
    }
}

enum HostPort {
    static func parse(_ s: String) throws -> (String, Int) {
        guard let colon = s.lastIndex(of: ":"), let port = Int(s[s.index(after: colon)...]), (0...65535).contains(port) else {
            throw ValidationError("--listen takes HOST:PORT, e.g. 127.0.0.1:7070 (got \(s.debugDescription))")
        }
        var host = String(s[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty else { throw ValidationError("--listen needs a host, e.g. 127.0.0.1:7070") }
        return (host, port)
    }
}
