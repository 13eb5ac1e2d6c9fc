import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NimbusCore

/// Chunks in an S3-compatible object store (MinIO, Ceph RGW, Garage, AWS S3), one object per chunk
/// at `PREFIX/HASH`, so any number of `nimbus serve` instances share them.
///
/// Configured by `--chunks s3://BUCKET/PREFIX` and the usual environment: AWS_ENDPOINT_URL (e.g.
/// http://minio:9000; default https://s3.REGION.amazonaws.com), AWS_REGION (default us-east-1),
/// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY. Requests are path-style and SigV4-signed (`S3Signer`).
///
/// Integrity: a put checks the bytes hash to their name and sends that hash as
/// x-amz-content-sha256, so the object store refuses bytes damaged on the way; a whole-chunk read
/// is hashed again before it is served. Objects appear whole or not at all (S3 PUT semantics), so
/// a killed server leaves no partial chunk.
public struct S3ChunkStore: ChunkStore {
    public let endpoint: URL
    public let bucket: String
    public let prefix: String
    let signer: S3Signer
    let http: HTTPClient
    let logger: Logger
    static let timeout: TimeAmount = .seconds(60)

    public init(url: String, environment: [String: String], logger: Logger = Logger(label: "nimbus.s3")) throws {
        let usage = "write the chunk store as s3://BUCKET/PREFIX and set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION and (for anything but AWS) AWS_ENDPOINT_URL"
        guard url.hasPrefix("s3://") else { throw APIError(.badRequest, "\(url.debugDescription) is not an s3:// URL; \(usage)") }
        let rest = url.dropFirst(5)
        let bucket = String(rest.prefix { $0 != "/" })
        guard !bucket.isEmpty else { throw APIError(.badRequest, "the s3:// URL names no bucket; \(usage)") }
        let prefix = rest.dropFirst(bucket.count).split(separator: "/").joined(separator: "/")
        guard let key = environment["AWS_ACCESS_KEY_ID"], !key.isEmpty,
              let secret = environment["AWS_SECRET_ACCESS_KEY"], !secret.isEmpty else {
            throw APIError(.badRequest, "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set; \(usage)")
        }
        let region = environment["AWS_REGION"].flatMap { $0.isEmpty ? nil : $0 } ?? environment["AWS_DEFAULT_REGION"] ?? "us-east-1"
        let endpointText = environment["AWS_ENDPOINT_URL_S3"] ?? environment["AWS_ENDPOINT_URL"] ?? "https://s3.\(region).amazonaws.com"
        guard let endpoint = URL(string: endpointText), endpoint.host != nil, ["http", "https"].contains(endpoint.scheme ?? "") else {
            throw APIError(.badRequest, "AWS_ENDPOINT_URL \(endpointText.debugDescription) is not an http(s) URL; e.g. http://127.0.0.1:9000")
        }
        self.init(endpoint: endpoint, bucket: bucket, prefix: prefix,
                  signer: S3Signer(accessKey: key, secretKey: secret, region: region), logger: logger)
    }

    init(endpoint: URL, bucket: String, prefix: String, signer: S3Signer, logger: Logger) {
        self.endpoint = endpoint
        self.bucket = bucket
        self.prefix = prefix
        self.signer = signer
        self.logger = logger
        http = HTTPClient.shared
    }

    func objectPath(_ hash: ContentHash) -> String {
        "/" + ([bucket] + (prefix.isEmpty ? [] : [prefix]) + [hash.hex]).map { S3Signer.encode($0, keepSlash: true) }.joined(separator: "/")
    }

    // MARK: ChunkStore

    public func put(_ hash: ContentHash, bytes: ByteBuffer, ifStored: IfStored) async throws {
        guard ChunkHashing.sha256(bytes) == hash else {
            throw APIError(.hashMismatch, "the uploaded bytes do not hash to \(hash); nothing was stored — re-read the chunk and upload it again")
        }
        // Content-addressed: an object already there holds these very bytes.
        if ifStored == .skip, try await size(of: hash) == Int64(bytes.readableBytes) { return }
        let r = try await send(.PUT, objectPath(hash), body: bytes, payloadHash: hash.hex)
        guard r.status == .ok else { throw unexpected(r, "store chunk \(hash)") }
    }

    public func size(of hash: ContentHash) async throws -> Int64? {
        let r = try await send(.HEAD, objectPath(hash))
        if r.status == .notFound { return nil }
        guard r.status == .ok, let length = r.headers.first(name: "content-length").flatMap({ Int64($0) }) else {
            throw unexpected(r, "look up chunk \(hash)")
        }
        return length
    }

    public func read(_ hash: ContentHash, range: Range<Int64>?) async throws -> ByteBuffer? {
        if let range, range.isEmpty { return try await size(of: hash) == nil ? nil : ByteBuffer() }
        var headers: [(String, String)] = []
        if let range { headers.append(("Range", "bytes=\(range.lowerBound)-\(range.upperBound - 1)")) }
        let r = try await send(.GET, objectPath(hash), headers: headers)
        switch r.status {
        case .notFound: return nil
        case .rangeNotSatisfiable: return ByteBuffer()
        case .ok, .partialContent: break
        default: throw unexpected(r, "read chunk \(hash)")
        }
        if range == nil, ChunkHashing.sha256(r.body) != hash {
            logger.error("chunk \(hash) in the object store does not hash to its name")
            throw APIError(.unavailable, "chunk \(hash) is damaged in the object store; re-upload it from a device that has it")
        }
        return r.body
    }

    public func delete(_ hash: ContentHash) async throws {
        let r = try await send(.DELETE, objectPath(hash))
        guard r.status == .noContent || r.status == .ok || r.status == .notFound else { throw unexpected(r, "delete chunk \(hash)") }
    }

    // MARK: HTTP

    struct Reply {
        var status: HTTPResponseStatus
        var headers: HTTPHeaders
        var body: ByteBuffer
    }

    func send(_ method: HTTPMethod, _ path: String, query: [(String, String)] = [], headers extra: [(String, String)] = [],
              body: ByteBuffer? = nil, payloadHash: String? = nil) async throws -> Reply {
        let host = endpoint.port.map { "\(endpoint.host!):\($0)" } ?? endpoint.host!
        let base = endpoint.absoluteString.hasSuffix("/") ? String(endpoint.absoluteString.dropLast()) : endpoint.absoluteString
        let queryText = query.map { "\(S3Signer.encode($0.0))=\(S3Signer.encode($0.1))" }.joined(separator: "&")
        var request = HTTPClientRequest(url: base + path + (queryText.isEmpty ? "" : "?" + queryText))
        request.method = method
        let signed = [("Host", host)] + extra
        let hash = payloadHash ?? (body.map { ChunkHashing.sha256($0).hex } ?? S3Signer.emptyPayloadHash)
        for (name, value) in signed + signer.sign(method: method.rawValue, path: path, query: query, headers: signed, payloadHash: hash) {
            request.headers.add(name: name, value: value)
        }
        if let body {
            request.headers.add(name: "Content-Length", value: String(body.readableBytes))
            request.body = .bytes(body)
        }
        do {
            let response = try await http.execute(request, timeout: Self.timeout)
            let bytes = method == .HEAD ? ByteBuffer() : try await response.body.collect(upTo: 64 << 20)
            return Reply(status: response.status, headers: response.headers, body: bytes)
        } catch {
            throw APIError(.unavailable, "the object store at \(endpoint.absoluteString) did not answer (\(error)); retry later")
        }
    }

    func unexpected(_ r: Reply, _ what: String) -> APIError {
        let detail = String(buffer: r.body).prefix(300)
        if r.status == .forbidden {
            return APIError(.unavailable, "the object store refused to \(what) (403): check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION. \(detail)")
        }
        if r.status == .notFound {
            return APIError(.unavailable, "cannot \(what): bucket \(bucket) does not exist at \(endpoint.absoluteString); create it. \(detail)")
        }
        return APIError(.unavailable, "the object store could not \(what): HTTP \(r.status.code). \(detail)")
    }
}
