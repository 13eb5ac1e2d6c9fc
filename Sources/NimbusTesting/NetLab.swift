import Foundation

private func q(_ s: String) -> String { "'" + s.replacingOccurrences(of: "'", with: "'\\''") + "'" }

/// Network namespaces for tests of real networks (root only): the server in a namespace of its
/// own, each device in this process's namespace or one of its own, one veth pair per device
/// (server side 10.77.N.1, device side 10.77.N.2), or a TUN pair through a userspace netem when
/// the link has a delay or loss. A link can be cut (a partition: packets vanish,
/// nothing is refused) and mended, and shaped to a rate (tbf). `close()` removes everything.
///
/// Processes enter a namespace with `nsenter --net=…` only (`prefix(_:)`), not `ip netns exec`:
/// that one also makes a new mount namespace, and a FUSE mount made there would be invisible here.
public final class NetLab: @unchecked Sendable {
    // @unchecked: used by one test at a time.
    public struct Link: Sendable {
        public let number: Int
        /// The device's namespace; nil: this process's.
        public let namespace: String?
        public let serverSide: String
        public let deviceSide: String
        /// The server as the device reaches it.
        public var serverAddress: String { "10.77.\(number).1" }
        public var deviceAddress: String { "10.77.\(number).2" }
    }

    public let tag: String
    public let serverNamespace: String
    public private(set) var links: [Link] = []
    private var namespaces: [String] = []

    /// Nil with a reason when this machine cannot make namespaces (not root, no `ip`).
    public static let problem: String? = {
        if getuid() != 0 { return "network namespaces need root" }
        let (s, out) = shellStatus("command -v ip && command -v nsenter && ip netns add nimbus-probe-$$ && ip netns del nimbus-probe-$$")
        return s == 0 ? nil : "cannot make network namespaces here: \(out)"
    }()

    public init() throws {
        tag = String(UUID().uuidString.prefix(4)).lowercased()
        serverNamespace = "nimbus-\(tag)-srv"
        try namespace(serverNamespace)
    }

    @discardableResult
    public func namespace(_ name: String) throws -> String {
        try run("ip netns add \(name) && ip -n \(name) link set lo up")
        namespaces.append(name)
        return name
    }

    /// A new link from `deviceNamespace` (nil: here) to the server's namespace. With a delay or
    /// loss the link is a pair of TUN interfaces joined by scripts/netem-relay.py (a userspace
    /// netem: this kernel has no sch_netem): every packet waits `delayMs` each way, and
    /// `lossPercent` of them are lost each way, seeded.
    public func connect(deviceNamespace: String? = nil, delayMs: Int = 0, lossPercent: Double = 0, seed: Int = 1) throws -> Link {
        if delayMs == 0 && lossPercent == 0 { return try veth(deviceNamespace: deviceNamespace) }
        let n = links.count + 1
        let link = Link(number: n, namespace: deviceNamespace, serverSide: "nb\(tag)s\(n)", deviceSide: "nb\(tag)d\(n)")
        let relay = try Background("exec python3 \(q(Self.relayScript)) \(link.serverSide) \(link.deviceSide) --delay-ms \(delayMs) --loss \(lossPercent) --seed \(seed)")
        relays.append(relay)
        for _ in 0..<200 where !relay.output.contains("ready") {
            guard relay.isRunning else { throw FixtureError("netem-relay.py did not start: \(relay.output)") }
            usleep(10_000)
        }
        let dev = deviceNamespace.map { "-n \($0) " } ?? ""
        try run("""
            ip link set \(link.serverSide) netns \(serverNamespace) && \
            ip -n \(serverNamespace) addr add \(link.serverAddress) peer \(link.deviceAddress) dev \(link.serverSide) && \
            ip -n \(serverNamespace) link set \(link.serverSide) up && \
            \(deviceNamespace.map { "ip link set \(link.deviceSide) netns \($0) && " } ?? "")\
            ip \(dev)addr add \(link.deviceAddress) peer \(link.serverAddress) dev \(link.deviceSide) && \
            ip \(dev)link set \(link.deviceSide) up
            """)
        links.append(link)
        return link
    }

    /// scripts/netem-relay.py of this repository.
    static let relayScript = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("scripts/netem-relay.py").path
    private var relays: [Background] = []

    private func veth(deviceNamespace: String?) throws -> Link {
        let n = links.count + 1
        let link = Link(number: n, namespace: deviceNamespace, serverSide: "nb\(tag)s\(n)", deviceSide: "nb\(tag)d\(n)")
        let dev = deviceNamespace.map { "-n \($0) " } ?? ""
        try run("""
            ip link add \(link.deviceSide) type veth peer name \(link.serverSide) && \
            ip link set \(link.serverSide) netns \(serverNamespace) && \
            ip -n \(serverNamespace) addr add \(link.serverAddress)/24 dev \(link.serverSide) && \
            ip -n \(serverNamespace) link set \(link.serverSide) up && \
            \(deviceNamespace.map { "ip link set \(link.deviceSide) netns \($0) && " } ?? "")\
            ip \(dev)addr add \(link.deviceAddress)/24 dev \(link.deviceSide) && \
            ip \(dev)link set \(link.deviceSide) up
            """)
        links.append(link)
        return link
    }

    /// Cuts the link (both ends down: every packet either way is lost) or mends it.
    public func partition(_ link: Link, _ cut: Bool) throws {
        let state = cut ? "down" : "up"
        let dev = link.namespace.map { "-n \($0) " } ?? ""
        try run("ip -n \(serverNamespace) link set \(link.serverSide) \(state) && ip \(dev)link set \(link.deviceSide) \(state)")
    }

    /// Shapes both directions of the link to `mbit` Mbit/s (token bucket).
    public func shape(_ link: Link, mbit: Int) throws {
        let dev = link.namespace.map { "-n \($0) " } ?? ""
        let tbf = "tbf rate \(mbit)mbit burst \(max(32, mbit * 2))kb latency 100ms"
        try run("tc -n \(serverNamespace) qdisc replace dev \(link.serverSide) root \(tbf) && tc \(dev)qdisc replace dev \(link.deviceSide) root \(tbf)")
    }

    /// `nsenter` into `namespace` (nil: nothing), for a shell command line.
    public static func prefix(_ namespace: String?) -> String {
        namespace.map { "nsenter --net=/run/netns/\($0) " } ?? ""
    }

    /// Removes the links and namespaces (processes still in them keep running; end them first).
    public func close() {
        for r in relays { r.stop() }
        relays = []
        for l in links where l.namespace == nil { _ = shellStatus("ip link del \(l.deviceSide) 2>/dev/null") }
        for ns in namespaces.reversed() { _ = shellStatus("ip netns del \(ns) 2>/dev/null") }
        links = []
        namespaces = []
    }

    deinit { close() }

    private func run(_ script: String) throws {
        let (s, out) = shellStatus(script)
        guard s == 0 else { throw FixtureError("network setup failed (\(s)): \(script)\n\(out)") }
    }
}
