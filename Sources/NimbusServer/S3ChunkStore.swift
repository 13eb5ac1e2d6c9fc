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
/// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_S3_FORCE_PATH_STYLE (`S3Addressing`). Requests
/// are SigV4-signed (`S3Signer`).
///
/// Bodies stream both ways, a piece at a time, with back-pressure: an upload goes from the
/// device's request to the object store's PUT as it arrives (`Content-Length` known, so one
/// plain PUT, no multipart), a read from the store's GET to the device's response. Integrity
/// while streaming:
/// - an upload is sent with its name as `x-amz-content-sha256` (the name *is* the SHA-256 of the
///   bytes), so a store that checks it (AWS, MinIO) refuses bytes that do not match; and the
///   server hashes the bytes as they pass and withholds the last piece when they do not match
///   (`CheckedUpload`), so even a store that does not check (moto) never receives a complete
///   body: a PUT whose body stops short of its Content-Length creates no object;
/// - objects appear whole or not at all (S3 PUT semantics), so a killed server leaves no partial
///   chunk, and a failed rewrite (`IfStored.store`) leaves the old object;
/// - a whole-chunk read is hashed as it streams and cut before its last piece if it does not
///   match (`ChunkReader`); a range is served as the store returns it.
public struct S3ChunkStore: ChunkStore {
    public let endpoint: URL
    public let bucket: String
    public let prefix: String
    public let addressing: S3Addressing
    let signer: S3Signer
    let http: HTTPClient
    let logger: Logger
    /// Where connections go instead of the host the URL names (tests; `S3Target.of`).
    var connectTo: (host: String, port: Int)?
    /// Bound on a small request (HEAD, bucket housekeeping, an answer that is an error).
    static let timeout: TimeAmount = .seconds(60)
    /// Bound on a streamed transfer, whose pace is the device's: as long as a device may take to
    /// send a chunk (`ServerLimits.requestReadTimeout`).
    static let transferTimeout: TimeAmount = .seconds(300)

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
        let addressing: S3Addressing
        do { addressing = try S3Addressing.choose(endpoint: endpoint, bucket: bucket, force: environment["AWS_S3_FORCE_PATH_STYLE"]) } catch {
            throw APIError(.badRequest, error.message)
        }
        self.init(endpoint: endpoint, bucket: bucket, prefix: prefix, addressing: addressing,
                  signer: S3Signer(accessKey: key, secretKey: secret, region: region), logger: logger)
    }

    init(endpoint: URL, bucket: String, prefix: String, addressing: S3Addressing, signer: S3Signer, logger: Logger) {
        self.endpoint = endpoint
        self.bucket = bucket
        self.prefix = prefix
        self.addressing = addressing
        self.signer = signer
        self.logger = logger
        http = HTTPClient.shared
    }

    /// The object key of a chunk: `PREFIX/HASH`.
    func objectKey(_ hash: ContentHash) -> String {
        (prefix.isEmpty ? "" : prefix + "/") + hash.hex
    }

    // MARK: ChunkStore

    public func put<Body: AsyncSequence & Sendable>(_ hash: ContentHash, size: Int64, body: Body, ifStored: IfStored) async throws
        where Body.Element == ByteBuffer {
        let upload = CheckedUpload(base: body, hash: hash, size: size)
        // Content-addressed: an object already there holds these very bytes.
        if ifStored == .skip, try await self.size(of: hash) == size {
            try await upload.drain()
            return
        }
        var request = request(.PUT, key: objectKey(hash), payloadHash: hash.hex)
        if size == 0 {
            try await upload.drain()
            request.body = .bytes(ByteBuffer())
        } else {
            request.body = .stream(upload, length: .known(size))
        }
        let response: HTTPClientResponse
        do {
            response = try await http.execute(request, timeout: Self.transferTimeout)
        } catch {
            // The body's own failure (bytes that do not match, a device gone mid-body) is the
            // reason; the HTTP client only reports that the request was abandoned.
            if let failure = upload.failure.error { throw failure }
            throw unreachable(error)
        }
        let r = try await reply(response, method: .PUT)
        guard r.status == .ok else { throw unexpected(r, "store chunk \(hash)") }
    }

    public func size(of hash: ContentHash) async throws -> Int64? {
        let r = try await send(.HEAD, key: objectKey(hash))
        if r.status == .notFound { return nil }
        guard r.status == .ok, let length = r.headers.first(name: "content-length").flatMap({ Int64($0) }) else {
            throw unexpected(r, "look up chunk \(hash)")
        }
        return length
    }

    public func open(_ hash: ContentHash, range: Range<Int64>?) async throws -> ChunkReader? {
        if let range, range.isEmpty { return try await size(of: hash) == nil ? nil : .empty(hash) }
        var headers: [(String, String)] = []
        if let range { headers.append(("Range", "bytes=\(range.lowerBound)-\(range.upperBound - 1)")) }
        let request = request(.GET, key: objectKey(hash), headers: headers, payloadHash: S3Signer.emptyPayloadHash)
        let response: HTTPClientResponse
        do { response = try await http.execute(request, timeout: Self.transferTimeout) } catch { throw unreachable(error) }
        switch response.status {
        case .ok, .partialContent: break
        case .notFound: return nil
        case .rangeNotSatisfiable: return .empty(hash)
        default: throw unexpected(try await reply(response, method: .GET), "read chunk \(hash)")
        }
        guard let length = response.headers.first(name: "content-length").flatMap({ Int64($0) }), length >= 0 else {
            throw APIError(.unavailable, "the object store answered a read of chunk \(hash) without a Content-Length; it does not look like S3")
        }
        let body = response.body
        return ChunkReader(length: length, of: hash, whole: range == nil, store: "object store") {
            var pieces = body.makeAsyncIterator()
            return { try await pieces.next() }
        }
    }

    public func delete(_ hash: ContentHash) async throws {
        let r = try await send(.DELETE, key: objectKey(hash))
        guard r.status == .noContent || r.status == .ok || r.status == .notFound else { throw unexpected(r, "delete chunk \(hash)") }
    }

    // MARK: HTTP

    /// An answer read whole: small ones only (HEAD, housekeeping, errors).
    struct Reply {
        var status: HTTPResponseStatus
        var headers: HTTPHeaders
        var body: ByteBuffer
    }

    /// The signed request for `key` (nil: the bucket), sent where `addressing` says.
    func request(_ method: HTTPMethod, key: String?, query: [(String, String)] = [], headers extra: [(String, String)] = [],
                 payloadHash: String, date: Date = Date()) -> HTTPClientRequest {
        let target = S3Target.of(endpoint: endpoint, bucket: bucket, key: key, addressing: addressing, connectTo: connectTo)
        let queryText = query.map { "\(S3Signer.encode($0.0))=\(S3Signer.encode($0.1))" }.joined(separator: "&")
        var request = HTTPClientRequest(url: target.url + (queryText.isEmpty ? "" : "?" + queryText))
        request.method = method
        let signed = [("Host", target.host)] + extra
        for (name, value) in signed + signer.sign(method: method.rawValue, path: target.path, query: query, headers: signed, payloadHash: payloadHash, date: date) {
            request.headers.add(name: name, value: value)
        }
        return request
    }

    /// Sends a request with a small body (or none) and reads the answer whole.
    func send(_ method: HTTPMethod, key: String?, query: [(String, String)] = [], headers extra: [(String, String)] = [],
              body: ByteBuffer? = nil) async throws -> Reply {
        var request = request(method, key: key, query: query, headers: extra,
                              payloadHash: body.map { ChunkHashing.sha256($0).hex } ?? S3Signer.emptyPayloadHash)
        if let body { request.body = .bytes(body) }
        let response: HTTPClientResponse
        do { response = try await http.execute(request, timeout: Self.timeout) } catch { throw unreachable(error) }
        return try await reply(response, method: method)
    }

    /// Reads an answer whole (bounded: a listing or an error document, never a chunk).
    func reply(_ response: HTTPClientResponse, method: HTTPMethod) async throws -> Reply {
        do {
            let bytes = method == .HEAD ? ByteBuffer() : try await response.body.collect(upTo: 4 << 20)
            return Reply(status: response.status, headers: response.headers, body: bytes)
        } catch {
            throw unreachable(error)
        }
    }

    func unreachable(_ error: any Error) -> APIError {
        APIError(.unavailable, "the object store at \(endpoint.absoluteString) did not answer (\(error)); retry later")
    }

    func unexpected(_ r: Reply, _ what: String) -> APIError {
        let detail = String(buffer: r.body).prefix(300)
        if r.status == .forbidden {
            return APIError(.unavailable, "the object store refused to \(what) (403): check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION. \(detail)")
        }
        if r.status == .notFound {
            return APIError(.unavailable, "cannot \(what): bucket \(bucket) does not exist at \(endpoint.absoluteString) (\(addressing.rawValue)-style addressing); create it. \(detail)")
        }
        return APIError(.unavailable, "the object store could not \(what): HTTP \(r.status.code). \(detail)")
    }
}
