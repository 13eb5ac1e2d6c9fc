import Hummingbird
import HTTPTypes
import NIOCore
import NIOHTTPTypes
import NimbusCore
import NimbusProtocol
import Synchronization

/// How much one connection, one device and the whole server may hold at once. The defaults fit
/// one machine serving a household; every bound answers with a stable code (never a hang, never
/// unbounded memory).
public struct ServerLimits: Sendable {
    /// A connection that sends nothing for this long outside a request being answered is closed
    /// (half-sent headers included). Longer than HTTP clients keep idle pooled connections (60 s),
    /// so a client never races the close.
    public var idleTimeout: Duration = .seconds(75)
    /// A request's head and body must have arrived this long after the head began to arrive
    /// (at least 56 KB/s for the largest chunk); otherwise the connection is closed.
    public var requestReadTimeout: Duration = .seconds(300)
    /// Chunk bodies being received at once, over all devices (each reserves its Content-Length,
    /// or the largest chunk size when it has none).
    public var chunkBytesInFlight: Int = 256 << 20
    /// Chunk bodies being received at once from one device.
    public var chunkBodiesPerDevice: Int = 8
    /// A long-poll that has only the asking device's own commits to answer with waits this much
    /// longer for more of them or for another device's change (which answers at once): a
    /// device's burst of uploads is answered a few times a second instead of once per commit.
    public var ownChangesHold: Duration = .milliseconds(200)

    public init() {}
}

/// Reservations of chunk bodies in flight (`ServerLimits.chunkBytesInFlight`,
/// `chunkBodiesPerDevice`). A reservation that does not fit is refused at once with
/// `unavailable` and `Retry-After`: the body is never read into memory.
final class BodyBudget: Sendable {
    private struct State {
        var bytes = 0
        var perDevice: [DeviceID: Int] = [:]
    }
    private let state = Mutex(State())
    let limits: ServerLimits

    init(limits: ServerLimits) { self.limits = limits }

    /// Runs `body` holding a reservation of `bytes` for `device`.
    func withReservation<T: Sendable>(device: DeviceID, bytes: Int, _ body: () async throws -> T) async throws -> T {
        let granted = state.withLock { s -> Bool in
            let mine = s.perDevice[device, default: 0]
            guard mine < limits.chunkBodiesPerDevice, s.bytes + bytes <= limits.chunkBytesInFlight else { return false }
            s.perDevice[device] = mine + 1
            s.bytes += bytes
            return true
        }
        guard granted else {
            throw APIError(.busy, "the server is receiving as many chunks as it holds at once (\(limits.chunkBodiesPerDevice) per device, \(limits.chunkBytesInFlight >> 20) MiB in all); nothing was stored — retry in a second")
        }
        defer {
            state.withLock { s in
                s.bytes -= bytes
                let left = s.perDevice[device, default: 1] - 1
                s.perDevice[device] = left > 0 ? left : nil
            }
        }
        return try await body()
    }

    var bytesInFlight: Int { state.withLock { $0.bytes } }
}

/// Closes a connection whose request has not fully arrived `limit` after its head did, so a
/// body sent a byte at a time cannot hold a connection (and its buffers) for ever. Hummingbird's
/// idle timeout covers the head and the time between requests.
final class RequestReadDeadline: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    private let limit: TimeAmount
    private var timer: Scheduled<Void>?

    init(limit: Duration) { self.limit = TimeAmount(limit) }

    /// Also sizes the connection's receive buffer: it starts at 512 bytes instead of NIO's 2 KiB
    /// and grows while reads fill it (bodies). A connection keeps its buffer between reads, so an
    /// idle device's long-poll holds it for as long as it waits.
    func handlerAdded(context: ChannelHandlerContext) {
        context.channel.setOption(ChannelOptions.recvAllocator,
                                  value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 512, maximum: 65_536))
            .whenFailure { _ in }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            timer?.cancel()
            let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
            timer = context.eventLoop.scheduleTask(in: limit) { bound.value.close(promise: nil) }
        case .end:
            timer?.cancel()
            timer = nil
        case .body:
            break
        }
        context.fireChannelRead(data)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
    }

    /// The client closed its side: it has gone (HTTP clients do not half-close and wait), so the
    /// connection is closed now, and a long-poll waiting on it ends with it instead of holding its
    /// wait for up to a minute after the client left.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let e = event as? ChannelEvent, e == .inputClosed {
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}
