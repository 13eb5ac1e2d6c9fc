import Foundation
import Logging
import NIOSSL
import ServiceLifecycle
import Synchronization

/// The server's certificate and key (`nimbus serve --tls-cert FILE --tls-key FILE`), read again
/// on SIGHUP: every handshake takes the pair loaded last, so a renewed certificate is used by new
/// connections without a restart, and connections already open keep theirs.
public final class ServerTLS: Sendable {
    public let certFile: String
    public let keyFile: String
    private let current: Mutex<Loaded>

    struct Loaded {
        var chain: [NIOSSLCertificate]
        var key: NIOSSLPrivateKey
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Reads and checks the pair; a problem is a `Failure` that says which file and what to do.
    public init(certFile: String, keyFile: String) throws {
        self.certFile = certFile
        self.keyFile = keyFile
        current = Mutex(try Self.load(certFile: certFile, keyFile: keyFile))
    }

    /// Reads the files again. On a problem the pair in use stays and the error says why.
    @discardableResult
    public func reload() throws -> String {
        let fresh = try Self.load(certFile: certFile, keyFile: keyFile)
        current.withLock { $0 = fresh }
        return Self.summary(fresh.chain[0])
    }

    /// How long before its end a certificate in use is reported at every check.
    public static let expiryNotice: time_t = 14 * 86_400

    /// What to tell the operator about the end of the certificate in use at `now`: an error once
    /// it has expired (devices refuse the server), a warning within `expiryNotice` of its end;
    /// nil when it is good for longer.
    public func expiryWarning(now: time_t = time(nil)) -> (expired: Bool, message: String)? {
        let end = current.withLock { $0.chain[0].notValidAfter }
        if end < now {
            return (true, "the certificate in \(certFile) expired on \(Self.date(end)): devices refuse this server; renew it and send SIGHUP (kill -HUP \(getpid()))")
        }
        guard end - now < Self.expiryNotice else { return nil }
        return (false, "the certificate in \(certFile) expires on \(Self.date(end)), in \((end - now) / 86_400) days; renew it and send SIGHUP (kill -HUP \(getpid()))")
    }

    /// Subject and end of validity of the certificate in use.
    public var summary: String { Self.summary(current.withLock { $0.chain[0] }) }

    /// The server-side configuration: the pair is chosen at each handshake.
    public var configuration: TLSConfiguration {
        let now = current.withLock { $0 }
        var c = TLSConfiguration.makeServerConfiguration(certificateChain: now.chain.map { .certificate($0) }, privateKey: .privateKey(now.key))
        c.minimumTLSVersion = .tlsv12
        c.sslContextCallback = { [self] _, promise in
            let pair = current.withLock { $0 }
            var o = NIOSSLContextConfigurationOverride()
            o.certificateChain = pair.chain.map { .certificate($0) }
            o.privateKey = .privateKey(pair.key)
            promise.succeed(o)
        }
        return c
    }

    static func load(certFile: String, keyFile: String) throws -> Loaded {
        guard FileManager.default.isReadableFile(atPath: certFile) else {
            throw Failure(description: "cannot read the certificate file \(certFile)")
        }
        guard FileManager.default.isReadableFile(atPath: keyFile) else {
            throw Failure(description: "cannot read the key file \(keyFile)")
        }
        let chain: [NIOSSLCertificate]
        do { chain = try NIOSSLCertificate.fromPEMFile(certFile) } catch {
            throw Failure(description: "\(certFile) holds no PEM certificate (\(error)); give the certificate chain, server certificate first")
        }
        guard let leaf = chain.first else { throw Failure(description: "\(certFile) holds no certificate") }
        let key: NIOSSLPrivateKey
        do { key = try NIOSSLPrivateKey(file: keyFile, format: .pem) } catch {
            throw Failure(description: "\(keyFile) holds no PEM private key without a passphrase (\(error))")
        }
        // The context checks that the key belongs to the certificate.
        do {
            _ = try NIOSSLContext(configuration: .makeServerConfiguration(certificateChain: chain.map { .certificate($0) }, privateKey: .privateKey(key)))
        } catch {
            throw Failure(description: "the key in \(keyFile) does not belong to the certificate in \(certFile) (\(error))")
        }
        if leaf.notValidAfter < time(nil) {
            throw Failure(description: "the certificate in \(certFile) expired on \(Self.date(leaf.notValidAfter)); renew it")
        }
        return Loaded(chain: chain, key: key)
    }

    static func summary(_ c: NIOSSLCertificate) -> String {
        let name = c.subjectName.first { $0.type == .commonName }.map { "CN=\($0.value)" } ?? "certificate"
        return "\(name), valid until \(date(c.notValidAfter))"
    }

    static func date(_ t: time_t) -> String {
        ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: TimeInterval(t)))
    }
}

/// Reloads the certificate on SIGHUP while the server runs.
struct CertificateReloader: Service {
    let tls: ServerTLS
    let logger: Logger

    func run() async throws {
        signal(SIGHUP, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: SIGHUP, queue: .global())
        source.setEventHandler { [tls, logger] in
            do {
                let what = try tls.reload()
                logger.notice("SIGHUP: certificate reloaded from \(tls.certFile) (\(what)); new connections use it")
            } catch {
                logger.error("SIGHUP: the certificate was not reloaded: \(error); the one loaded before stays in use")
            }
        }
        source.resume()
        defer { source.cancel() }
        // The end of the certificate in use, at the start and every hour while serving.
        let checks = Task { [tls, logger] in
            while !Task.isCancelled {
                if let w = tls.expiryWarning() {
                    if w.expired { logger.error("\(w.message)") } else { logger.warning("\(w.message)") }
                }
                try? await Task.sleep(for: .seconds(3600))
            }
        }
        defer { checks.cancel() }
        try? await gracefulShutdown()
    }
}
