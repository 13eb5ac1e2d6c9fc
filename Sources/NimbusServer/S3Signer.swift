import Crypto
import Foundation

/// AWS Signature Version 4 for S3 requests (header-signed, single chunk), as specified in
/// "Authenticating Requests: Using the Authorization Header". Written against the spec so Nimbus
/// needs no AWS SDK; `S3SignerTests` checks it against the spec's published example.
struct S3Signer: Sendable {
    let accessKey: String
    let secretKey: String
    let region: String
    let service = "s3"

    /// The headers to add to a request: x-amz-date, x-amz-content-sha256 and Authorization.
    /// `path` is the URI path, already percent-encoded as sent; `headers` the other headers that
    /// will be sent and must be signed (host at least); `payloadHash` the hex SHA-256 of the body.
    func sign(method: String, path: String, query: [(String, String)] = [], headers: [(String, String)],
              payloadHash: String, date: Date = Date()) -> [(String, String)] {
        let (amzDate, day) = Self.timestamps(date)
        var all = headers.map { ($0.0.lowercased(), $0.1.trimmingCharacters(in: .whitespaces)) }
        all.append(("x-amz-content-sha256", payloadHash))
        all.append(("x-amz-date", amzDate))
        all.sort { $0.0 < $1.0 }
        let signedHeaders = all.map(\.0).joined(separator: ";")
        let canonicalQuery = query.map { (Self.encode($0.0), Self.encode($0.1)) }.sorted { $0 < $1 }
            .map { "\($0.0)=\($0.1)" }.joined(separator: "&")
        let canonicalRequest = [method, path, canonicalQuery, all.map { "\($0.0):\($0.1)\n" }.joined(), signedHeaders, payloadHash]
            .joined(separator: "\n")
        let scope = "\(day)/\(region)/\(service)/aws4_request"
        let stringToSign = ["AWS4-HMAC-SHA256", amzDate, scope, Self.hex(SHA256.hash(data: Data(canonicalRequest.utf8)))]
            .joined(separator: "\n")
        var key = SymmetricKey(data: Data("AWS4\(secretKey)".utf8))
        for part in [day, region, service, "aws4_request"] {
            key = SymmetricKey(data: Data(HMAC<SHA256>.authenticationCode(for: Data(part.utf8), using: key)))
        }
        let signature = Self.hex(HMAC<SHA256>.authenticationCode(for: Data(stringToSign.utf8), using: key))
        return [
            ("x-amz-date", amzDate),
            ("x-amz-content-sha256", payloadHash),
            ("Authorization", "AWS4-HMAC-SHA256 Credential=\(accessKey)/\(scope), SignedHeaders=\(signedHeaders), Signature=\(signature)"),
        ]
    }

    static let emptyPayloadHash = hex(SHA256.hash(data: Data()))

    /// Percent-encoding of a URI component as SigV4 wants it: everything but A-Z a-z 0-9 - _ . ~.
    static func encode(_ s: String, keepSlash: Bool = false) -> String {
        var out = ""
        for b in s.utf8 {
            let c = Character(UnicodeScalar(b))
            if c.isASCII && (c.isLetter || c.isNumber || "-_.~".contains(c)) || (keepSlash && c == "/") { out.append(c) }
            else { out += String(format: "%%%02X", b) }
        }
        return out
    }

    static func hex<D: Sequence>(_ bytes: D) -> String where D.Element == UInt8 {
        bytes.map { String(format: "%02x", $0) }.joined()
    }

    static func timestamps(_ date: Date) -> (amzDate: String, day: String) {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "UTC")
        f.dateFormat = "yyyyMMdd'T'HHmmss'Z'"
        let amz = f.string(from: date)
        return (amz, String(amz.prefix(8)))
    }
}

