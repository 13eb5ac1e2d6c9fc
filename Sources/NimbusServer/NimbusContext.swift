import Hummingbird
import NIOCore
import NimbusProtocol

/// The request context: Hummingbird's core storage plus the device authenticated by `Authenticator`.
public struct NimbusContext: RequestContext {
    public var coreContext: CoreRequestContextStorage
    public var device: DeviceRecord?
    /// The client's address without its port (what pairing rate limits count by).
    public var clientAddress: String
    /// Completes when the client's connection closes (a long-poll of a client gone ends then).
    public var connectionClosed: EventLoopFuture<Void>

    public init(source: ApplicationRequestContextSource) {
        coreContext = .init(source: source)
        device = nil
        clientAddress = source.channel.remoteAddress?.ipAddress ?? "unknown"
        connectionClosed = source.channel.closeFuture
    }

    public var maxUploadSize: Int { ProtocolLimits.maxJSONBody }

    /// The authenticated device; routes registered through `DeviceRoutes` always have one.
    func requireDevice() throws -> DeviceRecord {
        guard let device else { throw APIError(.unauthorized, "this request needs a device token") }
        return device
    }
}
