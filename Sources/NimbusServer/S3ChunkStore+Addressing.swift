import Foundation
import NIOHTTP1

/// How a request names its bucket.
/// - `virtual`: in the host, `https://BUCKET.s3.REGION.amazonaws.com/KEY` — what AWS wants (it is
///   phasing path-style out for new buckets);
/// - `path`: in the path, `ENDPOINT/BUCKET/KEY` — what MinIO, Ceph RGW, Garage and moto serve
///   without wildcard DNS.
///
/// `AWS_S3_FORCE_PATH_STYLE=1` (or `true`) forces `path`, `=0` (or `false`) forces `virtual`;
/// unset, AWS endpoints (`*.amazonaws.com`) get `virtual` and every other endpoint `path`.
public enum S3Addressing: String, Sendable {
    case path, virtual

    /// The style for `bucket` at `endpoint` given the AWS_S3_FORCE_PATH_STYLE value `force`
    /// (nil when unset). Throws a sentence for a value it does not know or a bucket name that
    /// cannot be a host name label when virtual-hosted style is forced.
    static func choose(endpoint: URL, bucket: String, force: String?) throws(S3ConfigError) -> S3Addressing {
        let hostable = hostable(bucket, https: endpoint.scheme == "https")
        switch force?.lowercased() {
        case nil, "":
            let aws = (endpoint.host ?? "").lowercased().hasSuffix(".amazonaws.com")
            // A bucket name that cannot be a host name (dots under https, capitals, underscores) is
            // addressed by path even on AWS, as the AWS SDKs do.
            return aws && hostable ? .virtual : .path
        case "1", "true":
            return .path
        case "0", "false":
            guard hostable else {
                throw S3ConfigError("bucket \(bucket.debugDescription) cannot be addressed virtual-hosted style (it is not a DNS label\(endpoint.scheme == "https" ? " without dots, as a TLS certificate for *.HOST needs" : "")); unset AWS_S3_FORCE_PATH_STYLE or set it to 1")
            }
            return .virtual
        case let other?:
            throw S3ConfigError("AWS_S3_FORCE_PATH_STYLE=\(other.prefix(40).debugDescription) is neither 1/true (path-style: ENDPOINT/BUCKET/KEY) nor 0/false (virtual-hosted: BUCKET.HOST/KEY); leave it unset for the endpoint's usual style")
        }
    }

    /// Whether `bucket` can be the first label of a host name: lower-case letters, digits and
    /// hyphens (dots too over plain http), 3…63 characters, starting and ending with a letter or digit.
    static func hostable(_ bucket: String, https: Bool) -> Bool {
        let chars = Array(bucket.utf8)
        guard (3...63).contains(chars.count) else { return false }
        func alnum(_ c: UInt8) -> Bool { (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(c) || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(c) }
        guard alnum(chars.first!), alnum(chars.last!) else { return false }
        return chars.allSatisfy { alnum($0) || $0 == UInt8(ascii: "-") || (!https && $0 == UInt8(ascii: ".")) }
    }
}

/// A setting of the object store that cannot work, said in one sentence.
struct S3ConfigError: Error {
    let message: String
    init(_ message: String) { self.message = message }
}

/// Where one S3 request goes and how it is signed: the URL to send it to, the Host header, and the
/// canonical URI that SigV4 signs — which differ by addressing style:
///
/// | style | URL | Host | canonical URI |
/// | --- | --- | --- | --- |
/// | path | `ENDPOINT/BUCKET/KEY` | endpoint host[:port] | `/BUCKET/KEY` |
/// | virtual | `SCHEME://BUCKET.HOST[:port]/KEY` | BUCKET.HOST[:port] | `/KEY` |
///
/// A path in the endpoint (`http://gateway/s3`) comes first in both the URL and the canonical URI.
struct S3Target: Equatable {
    var url: String
    var host: String
    var path: String

    /// The target of `key` (nil: the bucket itself). `connectTo` replaces the host and port the
    /// connection is made to, leaving the Host header and signature alone (curl's `--resolve`;
    /// tests use it to reach a virtual host name that has no DNS record).
    static func of(endpoint: URL, bucket: String, key: String?, addressing: S3Addressing, connectTo: (host: String, port: Int)? = nil) -> S3Target {
        let scheme = endpoint.scheme ?? "https"
        let endpointHost = endpoint.host ?? ""
        var base = endpoint.path
        while base.hasSuffix("/") { base.removeLast() }
        base = base.split(separator: "/").map { S3Signer.encode(String($0)) }.map { "/" + $0 }.joined()
        let keyPath = key.map { "/" + S3Signer.encode($0, keepSlash: true) }
        let hostName: String, path: String
        switch addressing {
        case .path:
            hostName = endpointHost
            path = base + "/" + S3Signer.encode(bucket) + (keyPath ?? "")
        case .virtual:
            hostName = bucket + "." + endpointHost
            path = base + (keyPath ?? "/")
        }
        let port = endpoint.port.map { ":\($0)" } ?? ""
        let connect = connectTo.map { "\($0.host):\($0.port)" } ?? hostName + port
        return S3Target(url: "\(scheme)://\(connect)\(path)", host: hostName + port, path: path)
    }
}
