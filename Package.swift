// swift-tools-version:6.1
// Nimbus — the iCloud document store, done right, for Linux.
// Dependencies point one way: NimbusCore <- everything. Heavy packages (Hummingbird, AsyncHTTPClient)
// stay in the targets that need them so the FUSE side builds fast.
import PackageDescription

let strict: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    // Release builds specialize the generic sync rules (SyncCore, generic over the clock's
    // instant) into the engine that calls them, instead of running them through runtime
    // metadata: about 10 % of the daemon's CPU per synced file.
    .unsafeFlags(["-cross-module-optimization"], .when(configuration: .release)),
]

let package = Package(
    name: "nimbus",
    platforms: [.macOS(.v15)],
    products: [
        .executable(name: "nimbus", targets: ["nimbus"]),
        .executable(name: "nimbus-bench", targets: ["NimbusBench"]),
        .library(name: "NimbusKit", targets: ["NimbusKit"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.0"..<"5.0.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.0.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.20.0"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.30.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.0.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.90.0"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.21.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.6.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.29.0"),
    ],
    targets: [
        // Pure domain: ids, versions, hashes, names, the concurrency rules. No I/O, no dependencies.
        .target(name: "NimbusCore", swiftSettings: strict),
        // Daemon log lines on stderr: timestamped, or shaped for the systemd journal.
        .target(name: "NimbusLog", swiftSettings: strict),
        // Wire types shared by server and clients.
        .target(name: "NimbusProtocol", dependencies: ["NimbusCore"], swiftSettings: strict),
        // The server: HTTP app, ServerStore + SQLite engine, chunk store.
        .target(
            name: "NimbusServer",
            dependencies: [
                "NimbusCore", "NimbusProtocol", "Chunking",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                // Scale-out engines: PostgreSQL metadata and S3-compatible chunks.
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // Coordination: the claim/lock state machine (pure) shared by the mount and the sync engine.
        .target(name: "Coordination", dependencies: ["NimbusCore"], swiftSettings: strict),
        .testTarget(name: "CoordinationTests", dependencies: ["Coordination"], swiftSettings: strict),
        // For programs: FileCoordinator / FilePresenter over a mount's presenter socket
        // (docs/presenters.md). Foundation only, so any Swift program can take it.
        .target(name: "NimbusKit", dependencies: ["PresenterProtocol"], swiftSettings: strict),
        // The presenter socket's messages (docs/presenters.md), shared by NimbusKit and the mount
        // daemon. Foundation only.
        .target(name: "PresenterProtocol", swiftSettings: strict),
        .testTarget(name: "PresenterProtocolTests", dependencies: ["PresenterProtocol"], swiftSettings: strict),
        // The HTTP client of the protocol.
        .target(
            name: "NimbusRemote",
            dependencies: [
                "NimbusCore", "NimbusProtocol",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
            ],
            swiftSettings: strict
        ),
        // Shared test support: conformance suites run on every store engine, subprocess helpers.
        .target(
            name: "NimbusTesting",
            dependencies: ["NimbusCore", "NimbusProtocol", "NimbusServer"],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "nimbus",
            dependencies: [
                "NimbusCore", "NimbusServer", "NimbusLog",
                "NimbusProtocol", "NimbusRemote", "FuseKit", "LocalStore", "MountPorts", "ContainerFS", "SyncEngine",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .executableTarget(
            name: "NimbusBench",
            dependencies: [
                "NimbusCore", "NimbusProtocol", "NimbusRemote", "MountPorts",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
            ],
            swiftSettings: strict
        ),
        .testTarget(name: "NimbusCoreTests", dependencies: ["NimbusCore", "NimbusLog"], swiftSettings: strict),
        .testTarget(
            name: "NimbusServerTests",
            dependencies: ["NimbusCore", "NimbusProtocol", "NimbusServer", "NimbusRemote", "NimbusTesting", "Chunking"],
            swiftSettings: strict
        ),
        .testTarget(
            name: "IntegrationTests",
            dependencies: ["NimbusCore", "NimbusProtocol", "NimbusRemote", "NimbusTesting", "NimbusServer"],
            swiftSettings: strict
        ),
        // --- The mount (issue 3) ---
        // libfuse3 through pkg-config; shim.h sets FUSE_USE_VERSION and wraps macros/varargs.
        .systemLibrary(name: "CFuse3", pkgConfig: "fuse3", providers: [.apt(["libfuse3-dev"])]),
        // The kernel's node and handle ids (NodeID, HandleID) and the errno of file operations:
        // FuseKit re-exports them, LocalStore stores each item's node id, the sync engine answers
        // reads with an errno. No dependencies: no Foundation, no libfuse.
        .target(name: "FuseIDs", swiftSettings: strict),
        // Typed binding of the libfuse low-level API; knows nothing of Nimbus.
        // libfuse's channel to /dev/fuse with the INIT flags libfuse 3.14 cannot ask for (C: it
        // keeps per-descriptor state).
        .target(name: "CFuseIO", dependencies: ["CFuse3"]),
        .target(name: "FuseKit", dependencies: ["CFuse3", "CFuseIO", "FuseIDs"], swiftSettings: strict),
        // Client state: SQLite (GRDB, WAL) + the content cache (one file per item).
        .target(
            name: "LocalStore",
            dependencies: ["NimbusCore", "NimbusLog", "FuseIDs", .product(name: "GRDB", package: "GRDB.swift")],
            swiftSettings: strict
        ),
        // What the filesystem and the sync engine say to each other, without libfuse: the ports
        // each implements for the other (ContainerFS calls ContentProvider, ChangeObserver, …;
        // the engine calls MountedTree), the values that cross them, and the services both share
        // (coordinator, event log, presenter hub).
        .target(
            name: "MountPorts",
            dependencies: ["NimbusCore", "LocalStore", "FuseIDs", "Coordination", "PresenterProtocol"],
            swiftSettings: strict
        ),
        // The filesystem over LocalStore: node and handle tables, operations, control files,
        // kernel cache notifications; implements MountPorts' MountedTree.
        .target(
            name: "ContainerFS",
            dependencies: ["NimbusCore", "SyncCore", "LocalStore", "FuseKit", "MountPorts", "Coordination", "PresenterProtocol", .product(name: "Logging", package: "swift-log")],
            swiftSettings: strict
        ),
        // Content-defined chunking: how every device (and the server, for what it receives whole)
        // cuts a file into chunks.
        .target(name: "Chunking", dependencies: ["NimbusCore", "NimbusProtocol", .product(name: "Crypto", package: "swift-crypto")], swiftSettings: strict),
        // The sync core: the engine's decisions as pure state machines (no I/O, no clock, no locks).
        .target(name: "SyncCore", dependencies: ["NimbusCore", "NimbusProtocol"], swiftSettings: strict),
        .testTarget(name: "SyncCoreTests", dependencies: ["SyncCore", "NimbusCore", "NimbusProtocol"], swiftSettings: strict),
        // Placeholders, hydration, uploads and live pull: implements MountPorts' ports for the
        // filesystem. No libfuse: it knows the tree only through MountedTree.
        .target(
            name: "SyncEngine",
            dependencies: [
                "NimbusCore", "NimbusProtocol", "NimbusRemote", "LocalStore", "MountPorts", "FuseIDs", "Coordination", "SyncCore", "PresenterProtocol", "Chunking",
                "NimbusLog", .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strict
        ),
        .testTarget(name: "SyncEngineTests", dependencies: ["SyncEngine", "SyncCore", "Chunking", "NimbusCore", "NimbusProtocol", "NimbusRemote", "LocalStore", "MountPorts"], swiftSettings: strict),
        // Two real mounts (the built binary) on one `nimbus serve`.
        .testTarget(name: "SyncTests", dependencies: ["NimbusCore", "NimbusServer", "NimbusTesting", "NimbusKit"], swiftSettings: strict),
        // Three devices (LocalStore + ContainerFS + SyncEngine, no mount) on one in-process server,
        // driven by a seeded plan (NimbusTesting SimulationPlan.swift); docs/sync.md "Simulation".
        .testTarget(
            name: "EngineSimTests",
            dependencies: [
                "SyncEngine", "ContainerFS", "MountPorts", "LocalStore", "FuseKit", "NimbusCore", "NimbusProtocol", "NimbusRemote", "NimbusTesting",
                "NimbusServer", .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strict
        ),
        .testTarget(name: "FuseKitTests", dependencies: ["FuseKit"], swiftSettings: strict),
        .testTarget(name: "LocalStoreTests", dependencies: ["LocalStore", "NimbusCore", "FuseIDs"], swiftSettings: strict),
        .testTarget(name: "ContainerFSTests", dependencies: ["ContainerFS", "MountPorts", "LocalStore", "NimbusCore"], swiftSettings: strict),
        // Real mounts driven by real tools; runs the built `nimbus` binary as a subprocess.
        .testTarget(name: "MountTests", dependencies: ["NimbusCore", "NimbusTesting"], swiftSettings: strict),
    ]
)

// Developer switch: NIMBUS_SERVER_ONLY=1 leaves the FUSE targets out (and the mount from the CLI),
// so the server side builds and tests on its own while the mount is being changed. NimbusProtocol
// and NimbusRemote stay: the server, its tests and the integration tests need them.
import Foundation
if ProcessInfo.processInfo.environment["NIMBUS_SERVER_ONLY"] != nil {
    let fuse: Set<String> = ["CFuse3", "CFuseIO", "FuseIDs", "FuseKit", "LocalStore", "MountPorts", "ContainerFS", "SyncEngine", "FuseKitTests", "LocalStoreTests", "ContainerFSTests", "MountTests", "SyncEngineTests", "SyncTests", "EngineSimTests"]
    package.targets.removeAll { fuse.contains($0.name) }
    let cli = Context.packageDirectory + "/Sources/nimbus"
    let mountFiles = ((try? FileManager.default.contentsOfDirectory(atPath: cli)) ?? []).filter { $0.hasPrefix("Mount") }
    if let cliTarget = package.targets.first(where: { $0.name == "nimbus" }) {
        cliTarget.exclude.append(contentsOf: mountFiles)
        cliTarget.swiftSettings = (cliTarget.swiftSettings ?? []) + [.define("NIMBUS_SERVER_ONLY")]
    }
    for t in package.targets {
        t.dependencies.removeAll { dep in
            if case .byNameItem(let name, _) = dep { return fuse.contains(name) }
            return false
        }
    }
}
