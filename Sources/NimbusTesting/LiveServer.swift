import Foundation
import Logging
import NimbusServer
import Synchronization

/// A real server on 127.0.0.1 (port chosen by the kernel) in this process, with a fresh data
/// directory, for the duration of `body`. The server is stopped and its data removed afterwards,
/// also when `body` throws.
public struct LiveServer: Sendable {
    public let url: String
    public let app: NimbusServerApp
    public let dataDir: String
    /// What the server logged at info level and above.
    public let log: LogCapture

    /// Creates a device and returns its token.
    public func token(account: String = "alice", device: String = "laptop") async throws -> String {
        let token = TokenHash.newToken()
        _ = try await app.store.addDevice(account: account, deviceName: device, tokenHash: TokenHash.of(token))
        return token
    }

    /// `history` is the server's retention (`nimbus serve --keep-versions/--keep-days`);
    /// `configure` sets anything else of the app before it starts (its clock, garbage collection).
    public static func with<T: Sendable>(history: HistoryRetention = .default, limits: ServerLimits = ServerLimits(),
                                         configure: (inout NimbusServerApp) -> Void = { _ in },
                                         _ body: @Sendable (LiveServer) async throws -> T) async throws -> T {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-live-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let app = try {
            var app = try NimbusServerApp.embedded(dataDir: dir, history: history)
            app.limits = limits
            configure(&app)
            return app
        }()
        let capture = LogCapture()
        let logger = {
            var l = Logger(label: "nimbus.test-server") { _ in capture }
            l.logLevel = .info
            return l
        }()
        let (ports, portSink) = AsyncStream.makeStream(of: Int.self)
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask {
                try await app.run(host: "127.0.0.1", port: 0, logger: logger) { port in portSink.yield(port) }
                return nil
            }
            var it = ports.makeAsyncIterator()
            guard let port = await it.next() else { throw FixtureError("server did not start") }
            let server = LiveServer(url: "http://127.0.0.1:\(port)", app: app, dataDir: dir, log: capture)
            do {
                let result = try await body(server)
                group.cancelAll()
                return result
            } catch {
                group.cancelAll()
                throw error
            }
        }
    }
}

/// A log handler that keeps each message (`LEVEL message`) for a test to read. A value type, as
/// swift-log expects: every `Logger` copy that adds metadata (Hummingbird does per request, on
/// many threads at once) mutates its own copy; only the captured lines are shared, behind a lock.
public struct LogCapture: LogHandler, Sendable {
    private final class Lines: Sendable {
        let lines = Mutex<[String]>([])
    }
    private let store = Lines()
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level = .info

    public init() {}

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String,
                    file: String, function: String, line: UInt) {
        store.lines.withLock { $0.append("\(level) \(message)") }
    }

    public var messages: [String] { store.lines.withLock { $0 } }
}
