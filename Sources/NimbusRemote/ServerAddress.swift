import AsyncHTTPClient
import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization

/// A server address or trust setting this device cannot use, with what to do about it.
public struct ConnectionSetupError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

/// How a device reaches its server: the URL is checked before anything is sent (device tokens
/// and file contents never cross a network in clear text unless `insecure` says so), and the
/// HTTP client trusts the system's CAs plus the ones given with `--ca-file`.
public enum ServerAddress {
    /// The HTTP client type, for callers that do not import AsyncHTTPClient.
    public typealias HTTPClientType = HTTPClient

    /// The URL as the client will use it, or an error that says what is wrong: only http and
    /// https; plain http only to this machine (127.0.0.0/8, ::1, localhost) unless `insecure`.
    public static func check(_ url: String, insecure: Bool) throws -> String {
        guard let u = URLComponents(string: url), let scheme = u.scheme?.lowercased(), let host = u.host, !host.isEmpty else {
            throw ConnectionSetupError("\(url.debugDescription) is not a server address; give https://HOST[:PORT] (or http://127.0.0.1:PORT for a server on this machine)")
        }
        guard scheme == "https" || scheme == "http" else {
            throw ConnectionSetupError("\(url): the address must start with https:// (or http:// for a server on this machine)")
        }
        if u.user != nil || u.password != nil {
            throw ConnectionSetupError("\(url): no user or password in the address; the device token goes in --token-file")
        }
        if scheme == "http", !insecure, !isLoopback(host) {
            throw ConnectionSetupError("refusing http://\(host): the device token and file contents would cross the network in clear text. "
                + "Use https:// (nimbus serve --tls-cert/--tls-key, or a TLS proxy: docs/deploy.md), or pass --insecure on a network you trust completely")
        }
        return url.hasSuffix("/") ? String(url.dropLast()) : url
    }

    /// This machine: the loopback addresses and `localhost`.
    public static func isLoopback(_ host: String) -> Bool {
        let h = host.lowercased().trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        if h == "localhost" || h.hasSuffix(".localhost") || h == "::1" || h == "0:0:0:0:0:0:0:1" { return true }
        let parts = h.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127" && parts.allSatisfy { UInt8($0) != nil }
    }

    /// The HTTP client for a server: the shared one (system CAs), or with `caFile` one that also
    /// trusts the CA certificates in that PEM file. One per setting and process, kept for the
    /// process's life (like `.shared`). `retryConnects: false` fails a request at its first
    /// failed connection instead of retrying for the connect timeout (10 s): for tools and tests
    /// that want a certificate problem reported at once; a device keeps retrying.
    public static func httpClient(caFile: String?, retryConnects: Bool = true) throws -> HTTPClient {
        if caFile == nil && retryConnects { return .shared }
        let key = "\(retryConnects) \(caFile ?? "")"
        return try clients.withLock { made in
            if let c = made[key] { return c }
            let c = try makeClient(caFile: caFile, retryConnects: retryConnects)
            made[key] = c
            return c
        }
    }

    private static let clients = Mutex<[String: HTTPClient]>([:])

    private static func makeClient(caFile: String?, retryConnects: Bool) throws -> HTTPClient {
        var config = HTTPClient.Configuration()
        config.connectionPool.retryConnectionEstablishment = retryConnects
        guard let caFile else { return HTTPClient(eventLoopGroupProvider: .singleton, configuration: config) }
        guard FileManager.default.isReadableFile(atPath: caFile) else {
            throw ConnectionSetupError("cannot read the CA file \(caFile)")
        }
        let certs: [NIOSSLCertificate]
        do { certs = try NIOSSLCertificate.fromPEMFile(caFile) } catch {
            throw ConnectionSetupError("\(caFile) holds no PEM certificate (\(error)); give the certificate of the CA that signed the server's")
        }
        guard !certs.isEmpty else { throw ConnectionSetupError("\(caFile) holds no certificate") }
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.additionalTrustRoots = [.certificates(certs)]
        config.tlsConfiguration = tls
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: config)
    }
}

/// Why a TLS connection to the server failed, in words that say what to do.
enum TLSDiagnosis {
    /// Nil when `error` is not a certificate problem.
    static func explain(_ error: any Error, url: String) async -> String? {
        let text = String(reflecting: error)
        guard let u = URLComponents(string: url), u.scheme?.lowercased() == "https", let host = u.host else { return nil }
        let port = u.port ?? 443
        if text.contains("failedToValidateHostname") || text.contains("serverHostnameImpossibleToMatch") {
            let cn = await peerCertificate(host: host, port: port).flatMap(commonName)
            return "the server's certificate is not for \(host)\(cn.map { " (it is for \($0))" } ?? ""): "
                + "use the name the certificate was issued for, or give the server a certificate for \(host)"
        }
        guard text.contains("CERTIFICATE_VERIFY_FAILED") else { return nil }
        guard let cert = await peerCertificate(host: host, port: port) else {
            return "the server's certificate could not be verified (expired, not yet valid, or signed by a CA this device does not trust)"
        }
        let now = time(nil)
        if cert.notValidAfter < now {
            return "the server's certificate expired on \(date(cert.notValidAfter)): renew it on the server (nimbus serve reads it again on SIGHUP)"
        }
        if cert.notValidBefore > now {
            return "the server's certificate is not valid before \(date(cert.notValidBefore)): check this machine's clock"
        }
        let issuer = cert.issuerName.first { $0.type == .commonName }?.value
        return "the server's certificate\(commonName(cert).map { " (\($0))" } ?? "") is signed by \(issuer.map { "\"\($0)\"" } ?? "a CA"), "
            + "which this device does not trust: pass --ca-file with that CA's certificate, or use a certificate from a public CA"
    }

    static func commonName(_ c: NIOSSLCertificate) -> String? {
        c.subjectName.first { $0.type == .commonName }.map { "CN=\($0.value)" }
    }

    static func date(_ t: time_t) -> String {
        ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: TimeInterval(t)))
    }

    /// The certificate the server shows, read without verifying it (for the message only;
    /// nothing is sent on this connection). Bounded: 3 s.
    static func peerCertificate(host: String, port: Int) async -> NIOSSLCertificate? {
        do {
            var config = TLSConfiguration.makeClientConfiguration()
            config.certificateVerification = .none
            let context = try NIOSSLContext(configuration: config)
            let loop = MultiThreadedEventLoopGroup.singleton.next()
            let done = OnceResult(loop.makePromise(of: NIOSSLCertificate?.self))
            let sni = ServerAddress.isLoopback(host) || host.contains(":") || host.allSatisfy({ $0.isNumber || $0 == "." }) ? nil : host
            let channel = try await ClientBootstrap(group: loop)
                .connectTimeout(.seconds(3))
                .channelInitializer { ch in
                    ch.eventLoop.makeCompletedFuture {
                        try ch.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: context, serverHostname: sni))
                        try ch.pipeline.syncOperations.addHandler(HandshakeWatcher(done: done))
                    }
                }
                .connect(host: host, port: port).get()
            loop.scheduleTask(in: .seconds(3)) { done.succeed(nil) }
            let cert = try await done.promise.futureResult.get()
            try? await channel.close()
            return cert
        } catch {
            return nil
        }
    }

    /// A promise fulfilled by the first of the handshake, an error, the connection closing or the
    /// deadline.
    final class OnceResult: Sendable {
        let promise: EventLoopPromise<NIOSSLCertificate?>
        private let done = Mutex(false)
        init(_ p: EventLoopPromise<NIOSSLCertificate?>) { promise = p }
        func succeed(_ c: NIOSSLCertificate?) {
            if done.withLock({ d in defer { d = true }; return !d }) { promise.succeed(c) }
        }
    }

    final class HandshakeWatcher: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let done: OnceResult
        init(done: OnceResult) { self.done = done }

        func channelInactive(context: ChannelHandlerContext) {
            done.succeed(nil)
            context.fireChannelInactive()
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case .handshakeCompleted = event as? TLSUserEvent {
                done.succeed(try? context.pipeline.syncOperations.nioSSL_peerCertificate())
            }
            context.fireUserInboundEventTriggered(event)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            done.succeed(nil)
            context.close(promise: nil)
        }
    }
}
