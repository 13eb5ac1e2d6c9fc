import Foundation
import NIOSSL
import PostgresNIO

/// TLS to PostgreSQL, from libpq's `sslmode` (and `sslrootcert`) in the `--database` URL:
///
/// | sslmode | encrypted | server certificate checked |
/// | --- | --- | --- |
/// | `disable` (also: no sslmode) | no | — |
/// | `prefer` | if the server offers it | no |
/// | `require` | yes, or no connection | no — unless `sslrootcert` is given: then as `verify-ca` (libpq does the same) |
/// | `verify-ca` | yes | signed by a CA of `sslrootcert` |
/// | `verify-full` | yes | as `verify-ca`, and made for the host in the URL (its name or IP address) |
///
/// `sslrootcert=FILE` is a PEM file of CA certificates, read when the URL is parsed (a missing
/// or unreadable file stops `nimbus serve` with the reason); without it (or with
/// `sslrootcert=system`) the system's CAs are trusted. `allow` (plain first, TLS if refused) is
/// not offered: PostgresNIO cannot fall back that way, and it protects nothing.
public struct PostgresTLS: Sendable {
    public enum Mode: String, Sendable, CaseIterable {
        case disable, prefer, require
        case verifyCA = "verify-ca"
        case verifyFull = "verify-full"
    }

    public let mode: Mode
    /// The CA file given as `sslrootcert` (nil: the system's CAs).
    public let rootCert: String?
    let configuration: TLSConfiguration?
    let context: NIOSSLContext?

    public static let disable = PostgresTLS(mode: .disable, rootCert: nil, configuration: nil, context: nil)

    /// The TLS settings for `mode` and `rootCert` as they appear in the URL (nil: absent).
    /// Unknown modes, a CA file that cannot be read, and `sslrootcert` without a mode that uses
    /// it are refused with a sentence saying what to write instead.
    static func parse(mode text: String?, rootCert: String?) throws -> PostgresTLS {
        let modes = Mode.allCases.map(\.rawValue).joined(separator: ", ")
        guard let mode = Mode(rawValue: text ?? "disable") else {
            let hint = text == "allow" ? " (allow, plain text unless the server insists, is not offered: use require or verify-full)" : ""
            throw APIError(.badRequest, "sslmode=\(text ?? "") is not a TLS mode nimbus knows\(hint); use one of \(modes) (verify-full with sslrootcert=CA-FILE is the safe choice)")
        }
        if mode == .disable {
            if rootCert != nil { throw APIError(.badRequest, "sslrootcert is given but sslmode is \(text == nil ? "not set (plain text)" : "disable"); add sslmode=verify-full to use it") }
            return .disable
        }
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        let file = rootCert.flatMap { $0.isEmpty || $0 == "system" ? nil : $0 }
        if let file {
            do {
                let certificates = try NIOSSLCertificate.fromPEMFile(file)
                guard !certificates.isEmpty else { throw APIError(.badRequest, "no certificate in it") }
                tls.trustRoots = .certificates(certificates)
            } catch {
                let why = (error as? APIError)?.message ?? (FileManager.default.isReadableFile(atPath: file) ? "not a PEM certificate file (\(error))" : "cannot be read")
                throw APIError(.badRequest, "sslrootcert \(file): \(why); give the PEM file of the CA that signed the PostgreSQL server's certificate")
            }
        }
        switch mode {
        case .verifyFull: tls.certificateVerification = .fullVerification
        case .verifyCA: tls.certificateVerification = .noHostnameVerification
        case .require where file != nil: tls.certificateVerification = .noHostnameVerification
        default: tls.certificateVerification = .none
        }
        let context: NIOSSLContext
        do { context = try NIOSSLContext(configuration: tls) } catch {
            throw APIError(.badRequest, "cannot set up TLS to PostgreSQL with sslmode=\(mode.rawValue)\(file.map { " and sslrootcert \($0)" } ?? ""): \(error)")
        }
        return PostgresTLS(mode: mode, rootCert: file, configuration: tls, context: context)
    }

    /// The URL's query that gives these settings back ("" for none), for `PostgresLocation.description`.
    var query: String {
        guard mode != .disable else { return "" }
        return "?sslmode=\(mode.rawValue)" + (rootCert.map { "&sslrootcert=\($0)" } ?? "")
    }

    var client: PostgresClient.Configuration.TLS {
        switch (mode, configuration) {
        case (.prefer, let c?): return .prefer(c)
        case (_, let c?): return .require(c)
        default: return .disable
        }
    }

    var connection: PostgresConnection.Configuration.TLS {
        switch (mode, context) {
        case (.prefer, let c?): return .prefer(c)
        case (_, let c?): return .require(c)
        default: return .disable
        }
    }

    /// What a failure to connect means, when it is about TLS: a sentence naming the problem and
    /// what to do; nil for other failures.
    func explain(_ error: any Error, host: String) -> String? {
        let text = String(reflecting: error)
        let ca = rootCert.map { "the CA certificates in sslrootcert \($0)" } ?? "the system's CAs (give sslrootcert=CA-FILE for a private CA)"
        if text.contains("failedToValidateHostname") || text.contains("serverHostnameImpossibleToMatch") || text.contains("unableToValidateCertificate") {
            return "the PostgreSQL server's certificate is not made for \(host) (sslmode=verify-full checks the name): connect by a name or address the certificate lists, or give the server a certificate for \(host)"
        }
        if text.contains("CERTIFICATE_VERIFY_FAILED") {
            return "the PostgreSQL server's certificate failed verification (CERTIFICATE_VERIFY_FAILED): it is not signed by \(ca), or it has expired or is not yet valid"
        }
        if mode == .disable, text.contains("28000"), text.contains("no encryption") {
            return "the PostgreSQL server refuses connections without TLS (pg_hba.conf allows only hostssl): add sslmode=verify-full&sslrootcert=CA-FILE (or sslmode=require) to the --database URL"
        }
        if mode != .disable, text.contains("sslUnsupported") {
            return "the PostgreSQL server does not offer TLS (ssl = off in postgresql.conf) but sslmode=\(mode.rawValue) requires it: enable ssl on the server, or use sslmode=disable on a private network"
        }
        return nil
    }
}
