import Foundation
import Logging

/// Where a server keeps its data, as given on the command line (`nimbus serve`, `nimbus admin`):
/// - `dataDir` alone: the embedded default, `DIR/metadata.sqlite` and `DIR/chunks`;
/// - `database` (postgres://…) replaces the SQLite file, so several instances can share it;
/// - `chunks` (a directory, or s3://BUCKET/PREFIX) replaces `DIR/chunks`.
public struct StorageOptions: Sendable {
    public var dataDir: String?
    public var database: String?
    public var chunks: String?
    /// How much history commits keep (`--keep-versions`, `--keep-days`); tools that do not
    /// commit (`nimbus admin`) leave the default.
    public var history: HistoryRetention

    public init(dataDir: String?, database: String?, chunks: String?, history: HistoryRetention = .default) {
        self.dataDir = dataDir
        self.database = database
        self.chunks = chunks
        self.history = history
    }

    /// A sentence saying what is missing, or nil when the options are complete.
    public var problem: String? {
        if let database, !PostgresLocation.isURL(database) {
            return "--database takes a postgres://USER:PASSWORD@HOST:PORT/DATABASE URL (got \(database.debugDescription)); leave it out for the embedded SQLite file in --data"
        }
        if dataDir == nil && (database == nil || chunks == nil) {
            return "give --data DIR (embedded storage), or both --database postgres://… and --chunks DIR|s3://BUCKET/PREFIX"
        }
        return nil
    }

    /// Opens the metadata store.
    public func openStore(logger: Logger) async throws -> any ServerStore {
        if let problem { throw APIError(.badRequest, problem) }
        if let database {
            return try await PostgresStore.open(try PostgresLocation.parse(database), logger: logger, history: history)
        }
        let dir = dataDir!
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return try SQLiteStore(path: dir + "/metadata.sqlite", history: history)
    }

    /// Opens the chunk store.
    public func openChunks(logger: Logger) async throws -> any ChunkStore {
        if let problem { throw APIError(.badRequest, problem) }
        if let chunks, chunks.hasPrefix("s3://") {
            return try S3ChunkStore(url: chunks, environment: ProcessInfo.processInfo.environment, logger: logger)
        }
        return try DirectoryChunkStore(root: chunks ?? dataDir! + "/chunks")
    }

    /// Store and chunks, as the server uses them.
    public func openApp(logger: Logger) async throws -> NimbusServerApp {
        NimbusServerApp(store: try await openStore(logger: logger), chunks: try await openChunks(logger: logger))
    }

    /// Where the data is, for the "listening" line and logs (no passwords).
    public var summary: String {
        var parts: [String] = []
        if let database { parts.append("metadata: \((try? PostgresLocation.parse(database).description) ?? "postgres")") }
        else if let dataDir { parts.append("metadata: \(dataDir)/metadata.sqlite") }
        parts.append("chunks: \(chunks ?? (dataDir ?? "") + "/chunks")")
        return parts.joined(separator: ", ")
    }
}
