import Crypto
import Foundation
import GRDB
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import NIOHTTP1
import NimbusCore
import NimbusProtocol
import Synchronization

/// Turns every error into the protocol's JSON error body with a stable code, counts requests and
/// stamps the protocol version. Errors that are not `APIError` never show their text to a client:
/// they are logged with a request id and answered with a generic `internal` error.
struct ErrorMiddleware: RouterMiddleware {
    typealias Context = NimbusContext
    let metrics: ServerMetrics

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        var response: Response
        do {
            response = try await next(request, context)
        } catch {
            response = Self.response(for: Self.apiError(error, request: request, logger: context.logger))
        }
        response.headers[HTTPField.Name(NimbusProtocolVersion.header)!] = String(NimbusProtocolVersion.current)
        metrics.request(method: request.method.rawValue, status: response.status.code)
        return response
    }

    static func apiError(_ error: any Error, request: Request, logger: Logger) -> APIError {
        switch error {
        case let e as APIError:
            if e.code == .internal || e.code == .unavailable { logger.error("\(request.method) \(request.uri.path): \(e)") }
            return e
        case let e as HTTPParserError:
            // The client sent a malformed request or went away mid-body: its fault, not ours.
            let what = e == .invalidEOFState ? "the request ended before its body was complete" : "the request is not valid HTTP/1.1 (\(e.debugDescription))"
            logger.info("\(request.method) \(request.uri.path): \(what)")
            return APIError(.badRequest, "\(what); nothing was applied — send it again")
        case is NIOTooManyBytesError:
            return APIError(.bodyTooLarge, "the request body is larger than this endpoint accepts (\(ProtocolLimits.maxJSONBody) bytes for JSON, \(ProtocolLimits.maxChunkListBody) for a commit or chunk list, \(ProtocolLimits.maxChunkSize) for a chunk); split it")
        case let e as HTTPError:
            switch e.status.code {
            case 404: return APIError(.notFound, "there is no \(request.method) \(request.uri.path) in protocol v\(NimbusProtocolVersion.current); see docs/protocol.md")
            case 405: return APIError(.methodNotAllowed, "\(request.method) is not allowed on \(request.uri.path)")
            case 413: return APIError(.bodyTooLarge, "the request body is too large")
            case 400..<500: return APIError(.badRequest, e.body ?? "the request is malformed")
            default: break
            }
        case is DecodingError:
            return APIError(.invalidJSON, "the body is not valid JSON for this request: \(describe(error))")
        case let e as DatabaseError:
            // The metadata database refused: say what the operator can do; nothing was applied.
            switch e.resultCode {
            case .SQLITE_FULL:
                logger.error("metadata database full: \(e)")
                return APIError(.storageFull, "the server's metadata disk is full; nothing was applied — free space on the server and retry")
            case .SQLITE_BUSY, .SQLITE_LOCKED:
                logger.warning("metadata database busy: \(e)")
                return APIError(.unavailable, "the server's database is busy; nothing was applied — retry in a moment")
            case .SQLITE_IOERR, .SQLITE_CANTOPEN, .SQLITE_READONLY:
                logger.error("metadata database I/O error: \(e)")
                return APIError(.unavailable, "the server cannot write its database right now; nothing was applied — retry later")
            default: break
            }
        default: break
        }
        let id = UUID().uuidString.prefix(8)
        logger.error("internal error \(id) in \(request.method) \(request.uri.path): \(String(reflecting: error))")
        return APIError(.internal, "the server failed to handle this request (reference \(id) in its log); retry later and report it if it persists")
    }

    static func response(for error: APIError) -> Response {
        JSONResponse.make(body(for: error), status: .init(code: error.code.httpStatus))
    }

    static func body(for error: APIError) -> ErrorBody {
        ErrorBody(code: error.code.rawValue, message: error.message, missing: error.missing,
                  usage: error.quota?.usage, quota: error.quota?.quota)
    }

    /// A short, client-safe description of a decoding failure: what is wrong and where.
    static func describe(_ error: any Error) -> String {
        guard let e = error as? DecodingError else { return "invalid JSON" }
        func path(_ c: DecodingError.Context) -> String {
            let p = c.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: ".")
            return p.isEmpty ? "" : " at \(p)"
        }
        switch e {
        case .dataCorrupted(let c):
            if c.codingPath.isEmpty { return "the body is not well-formed UTF-8 JSON" }
            return "\(c.debugDescription)\(path(c))"
        case .keyNotFound(let key, let c): return "missing field \"\(key.stringValue)\"\(path(c))"
        case .typeMismatch(_, let c): return "wrong type\(path(c))"
        case .valueNotFound(_, let c): return "missing value\(path(c))"
        @unknown default: return "invalid JSON"
        }
    }
}

/// Authenticates `Authorization: Bearer TOKEN`. Tokens are looked up by their SHA-256. A known
/// device is remembered for `recheck`, or until a revocation is seen (`Revocations`), and then
/// looked up again, so a device revoked by `nimbus admin revoke-device` or `nimbus device revoke`
/// (on this instance or any other sharing the database) is refused within that time.
struct Authenticator: Sendable {
    struct Known: Sendable {
        var device: DeviceRecord
        var checked: ContinuousClock.Instant
        var epoch: UInt64
    }
    static let recheck: Duration = .seconds(1)
    let store: any ServerStore
    let revocations: Revocations
    let cache = LockedDictionary<Known>()

    func device(for request: Request) async throws -> DeviceRecord {
        guard let header = request.headers[.authorization], header.hasPrefix("Bearer ") else {
            throw APIError(.unauthorized, "this request needs a device token: send \"Authorization: Bearer TOKEN\" (create one with `nimbus admin add-device`)")
        }
        let token = header.dropFirst("Bearer ".count).trimmingCharacters(in: .whitespaces)
        guard let device = try await known(token: token) else {
            throw APIError(.unauthorized, "this device token is not known to the server or was revoked; enroll this device again: on an enrolled device run `nimbus device add NAME`, then here `nimbus login SERVER --code CODE --state DIR` with this device's state directory (its queued changes are kept)")
        }
        return device
    }
}

extension Authenticator {
    /// The device whose token this is; nil when unknown or revoked.
    func known(token: String) async throws -> DeviceRecord? {
        let hash = TokenHash.of(token)
        let now = ContinuousClock.now, epoch = revocations.epoch
        if let known = cache[hash], now - known.checked < Self.recheck, known.epoch == epoch { return known.device }
        let device = try await store.device(tokenHash: hash)
        cache[hash] = device.map { Known(device: $0, checked: now, epoch: epoch) }
        return device
    }
}

/// Registers routes under `v1/` that need a device: each handler runs with the authenticated
/// device in its context. Authentication runs before the handler rather than around it (as a
/// middleware would), so its frames are gone by the time a handler waits: a long-poll holds the
/// deepest chain of async frames its connection's task ever reached for as long as it waits, and
/// 10,000 idle devices hold 10,000 of them (scripts/bench-server).
struct DeviceRoutes {
    let router: Router<NimbusContext>
    let auth: Authenticator

    typealias Handler = @Sendable (Request, NimbusContext) async throws -> Response

    func on(_ path: String, _ method: HTTPRequest.Method, _ handler: @escaping Handler) {
        let auth = auth
        router.on(RouterPath("v1/" + path), method: method) { request, context in
            var context = context
            context.device = try await auth.device(for: request)
            return try await handler(request, context)
        }
    }

    func get(_ path: String, _ handler: @escaping Handler) { on(path, .get, handler) }
    func put(_ path: String, _ handler: @escaping Handler) { on(path, .put, handler) }
    func post(_ path: String, _ handler: @escaping Handler) { on(path, .post, handler) }
    func delete(_ path: String, _ handler: @escaping Handler) { on(path, .delete, handler) }
}

public enum TokenHash {
    /// The stored form of a token: SHA-256, hex.
    public static func of(_ token: some StringProtocol) -> String {
        ContentHash(digest: SHA256.hash(data: Data(token.utf8))).hex
    }

    /// A new random token: `nim_` and 43 base64url characters (256 bits).
    public static func newToken() -> String {
        var rng = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let b64 = Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        return "nim_" + b64
    }
}

enum JSONResponse {
    static func make(_ value: some Encodable, status: HTTPResponse.Status = .ok) -> Response {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.withoutEscapingSlashes]
        let data = (try? encoder.encode(value)) ?? Data("{\"error\":{\"code\":\"internal\",\"message\":\"encoding failed\"}}".utf8)
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// A listing page, written by `FastJSON` (the same document, much faster).
    static func make(_ page: ItemsResponse) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: FastJSON.encode(page))))
    }

    /// A commit's answer, written by `FastJSON`.
    static func make(_ answer: CommitResponse) -> Response {
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: FastJSON.encode(answer))))
    }
}
