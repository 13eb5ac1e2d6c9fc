import Foundation
import Logging
import NimbusServer

/// A real server on 127.0.0.1 (port chosen by the kernel) in this process, with a fresh data
/// directory, for the duration of `body`. The server is stopped and its data removed afterwards,
/// also when `body` throws.
public struct LiveServer: Sendable {
    public let url: String
    public let app: NimbusServerApp
    public let dataDir: String

    /// Creates a device and returns its token.
    public func token(account: String = "alice", device: String = "laptop") async throws -> String {
        let token = TokenHash.newToken()
        _ = try await app.store.addDevice(account: account, deviceName: device, tokenHash: TokenHash.of(token))
        return token
    }

    /// `history` is the server's retention (`nimbus serve --keep-versions/--keep-days`).
    public static func with<T: Sendable>(history: HistoryRetention = .default,
                                         _ body: @Sendable (LiveServer) async throws -> T) async throws -> T {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-live-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let app = try NimbusServerApp.embedded(dataDir: dir, history: history)
        let logger = {
            var l = Logger(label: "nimbus.test-server")
            l.logLevel = .critical
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
            let server = LiveServer(url: "http://127.0.0.1:\(port)", app: app, dataDir: dir)
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
