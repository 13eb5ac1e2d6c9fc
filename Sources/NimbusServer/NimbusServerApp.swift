import Foundation
import Hummingbird
import HummingbirdCore
import HummingbirdTLS
import Logging
import NIOCore
import NimbusProtocol
import ServiceLifecycle

/// A configured server: store, chunks, notifier, metrics and the HTTP app around them.
/// `nimbus serve` runs one until SIGINT/SIGTERM; tests run one in process on port 0.
public struct NimbusServerApp: Sendable {
    public let store: any ServerStore
    public let chunks: any ChunkStore
    public let notifier: CommitNotifier
    public let revocations: Revocations
    public let metrics: ServerMetrics
    public var clock: @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1_000_000_000) }
    /// Addresses of reverse proxies whose `X-Forwarded-For` names the client (`--trusted-proxy`):
    /// pairing's wrong-code limit then counts by the real client, not by the proxy.
    public var trustedProxies: Set<String> = []
    /// Periodic chunk garbage collection (`--gc-interval`; nil: off) and its grace in seconds
    /// (`--gc-grace`): see `ChunkCollector`.
    public var gcInterval: Duration? = nil
    public var gcGraceSeconds: Int64 = 3_600
    /// How long Recently Deleted keeps a deleted item (`--keep-deleted-days`), in seconds.
    public var trashKeepSeconds: Int64 = TrashRetention.seconds(days: TrashRetention.defaultDays)
    /// A web view session unused this long is revoked (`--web-idle`), in seconds.
    public var webIdleSeconds: Int64 = NimbusServerApp.defaultWebIdleSeconds
    public static let defaultWebIdleSeconds: Int64 = 12 * 3_600
    public var limits = ServerLimits() {
        didSet { bodies = BodyBudget(limits: limits) }
    }
    private(set) var bodies: BodyBudget

    public init(store: any ServerStore, chunks: any ChunkStore) {
        self.store = store
        self.chunks = chunks
        let metrics = ServerMetrics()
        self.metrics = metrics
        self.bodies = BodyBudget(limits: ServerLimits())
        let notifier = CommitNotifier(onAnnounce: { metrics.announced($0) })
        self.notifier = notifier
        self.revocations = Revocations(notifier: notifier)
    }

    /// The embedded configuration: `DIR/metadata.sqlite` and `DIR/chunks`.
    /// The data directory is made private (0700) and the database file 0600 (SQLite gives its
    /// -wal and -shm files the database's mode), whatever the umask: names, xattrs and chunks
    /// are the account's data.
    public static func embedded(dataDir: String, history: HistoryRetention = .default) throws -> NimbusServerApp {
        try PrivateFiles.directory(dataDir)
        let store = try SQLiteStore(path: dataDir + "/metadata.sqlite", history: history)
        PrivateFiles.restrict(dataDir + "/metadata.sqlite")
        return NimbusServerApp(store: store, chunks: try DirectoryChunkStore(root: dataDir + "/chunks"))
    }

    /// Purges the Recently Deleted entries older than the retention now (as the periodic run does).
    public func expireTrash() async throws -> TrashPurgeResponse {
        let r = try await store.expireTrash(deletedBefore: clock() - trashKeepSeconds * 1_000_000_000)
        metrics.purged(r)
        return r
    }

    /// The collector over this app's store and chunks, with its grace.
    public var collector: ChunkCollector {
        ChunkCollector(store: store, chunks: chunks, graceSeconds: gcGraceSeconds)
    }

    /// Runs one collection now (as the periodic one does) and counts what it freed in `/metrics`.
    public func collectGarbage(dryRun: Bool = false) async throws -> CollectionReport {
        let report = try await collector.run(now: clock(), dryRun: dryRun)
        metrics.collected(report)
        return report
    }

    /// `tls`: the listener speaks TLS (the web view's cookie is then `Secure`).
    public func router(tls: Bool = false) -> Router<NimbusContext> {
        let router = Router(context: NimbusContext.self)
        router.add(middleware: ErrorMiddleware(metrics: metrics))
        let routes = Routes(store: store, chunks: chunks, notifier: notifier, revocations: revocations, metrics: metrics, clock: clock,
                            bodies: bodies, trustedProxies: trustedProxies, trashKeepSeconds: trashKeepSeconds)
        routes.register(on: router)
        WebRoutes(routes: routes, auth: routes.authenticator(), tls: tls, idleSeconds: webIdleSeconds).register(on: router)
        return router
    }

    /// Serves until cancelled or signalled (SIGINT/SIGTERM shut down gracefully).
    /// `onReady` receives the bound port once the server accepts connections.
    /// With `tls`, HTTPS only (the pair is read again on SIGHUP).
    public func run(host: String, port: Int, tls: ServerTLS? = nil, logger: Logger,
                    onReady: @escaping @Sendable (Int) async -> Void) async throws {
        let http1 = HTTPServerBuilder.http1(configuration: .init(
            additionalChannelHandlers: [RequestReadDeadline(limit: limits.requestReadTimeout)],
            idleTimeout: TimeAmount(limits.idleTimeout)))
        let app = Application(
            router: router(tls: tls != nil),
            server: try tls.map { try .tls(http1, tlsConfiguration: $0.configuration) } ?? http1,
            configuration: .init(address: .hostname(host, port: port), serverName: "nimbus"),
            onServerRunning: { channel in await onReady(channel.localAddress?.port ?? port) },
            logger: logger)
        // On SIGTERM/SIGINT the services stop last to first: open long-polls are answered
        // before the HTTP server waits for the requests in flight, so a stop takes as long as
        // the slowest ordinary request, not a device's 25 s poll.
        var services: [any Service] = [app, LongPollCloser(notifier: notifier),
                                       RevocationWatch(revocations: revocations, store: store, logger: logger)]
        if let tls { services.append(CertificateReloader(tls: tls, logger: logger)) }
        services.append(TrashExpiry(store: store, keepSeconds: trashKeepSeconds, clock: clock, metrics: metrics, logger: logger))
        if let gcInterval {
            services.append(ChunkCollectorService(collector: collector, interval: gcInterval, clock: clock, metrics: metrics, logger: logger))
        }
        let group = ServiceGroup(configuration: .init(
            services: services,
            gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        guard let feed = store as? any CommitFeed else {
            try await group.run()
            return
        }
        // A shared store: follow the other instances' commits for as long as we serve.
        let follower = Task { await feed.follow(into: notifier) }
        defer { follower.cancel() }
        try await group.run()
    }
}

/// Answers every open long-poll as soon as the server begins a graceful stop.
struct LongPollCloser: Service {
    let notifier: CommitNotifier
    func run() async throws {
        try? await gracefulShutdown()
        notifier.close()
    }
}
