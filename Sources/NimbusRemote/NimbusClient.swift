import AsyncHTTPClient
import Crypto
import Foundation
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
import NimbusCore
import NimbusProtocol

/// What went wrong talking to a server: either the server answered an error body (`code` is one of
/// `APIErrorCode`), or the request never got an answer (`transport`), or the server's certificate
/// is not one this device trusts for its address (`certificate`: the reason and what to do).
public enum RemoteError: Error, CustomStringConvertible, Sendable {
    /// `quota` carries the account's usage and quota of a `quota_exceeded` answer.
    case server(status: Int, code: String, message: String, missing: [ContentHash]?, quota: QuotaFigures? = nil)
    case transport(String)
    case certificate(String)
    case unexpected(status: Int, String)

    public var description: String {
        switch self {
        case .server(let status, let code, let message, _, _): return "server answered \(status) \(code): \(message)"
        case .transport(let why): return "cannot reach the server: \(why)"
        case .certificate(let why): return "cannot trust the server: \(why)"
        case .unexpected(let status, let why): return "unexpected answer \(status): \(why)"
        }
    }

    /// The server's error code (docs/errors.md); nil for a transport failure, an answer that is
    /// not a protocol error, or a code this client does not know (a newer server's).
    public var code: APIErrorCode? {
        if case .server(_, let code, _, _, _) = self { return APIErrorCode(rawValue: code) }
        return nil
    }

    /// The account's usage and quota, when the server refused an upload for its quota.
    public var quota: QuotaFigures? {
        if case .server(_, _, _, _, let quota) = self { return quota }
        return nil
    }
}

/// The client of protocol v1 (docs/protocol.md). Every request has a deadline: no call waits
/// forever (a long-poll's deadline is its wait plus `timeout`).
public struct NimbusClient: Sendable {
    public let baseURL: String
    let token: String
    let http: HTTPClient
    public var timeout: TimeAmount = .seconds(30)

    public init(baseURL: String, token: String, http: HTTPClient = .shared) {
        self.baseURL = baseURL.hasSuffix("/") ? String(baseURL.dropLast()) : baseURL
        self.token = token
        self.http = http
    }

    // MARK: API

    public func whoami() async throws -> WhoAmI { try await json(.GET, "/v1/whoami") }

    /// A one-time code for a new device of this account named `device`.
    public func pairingCode(device: String) async throws -> PairingCode {
        try await json(.POST, "/v1/devices/pairing", body: PairingRequest(device: device))
    }

    /// Trades a pairing code for a new device's token (no token needed: this client's is unused).
    public func pair(code: String, device: String?) async throws -> PairResult {
        let data = try JSONEncoder().encode(PairRequest(code: code, device: device))
        let r = try await send(.POST, "/v1/pair", body: ByteBuffer(data: data), contentType: "application/json", authorized: false)
        try check(r)
        return try decode(r)
    }

    public func devices() async throws -> [DeviceInfo] {
        let r: DeviceList = try await json(.GET, "/v1/devices")
        return r.devices
    }

    /// Revokes a device of this account by name or id; its token stops working within a second.
    public func revokeDevice(_ device: String) async throws -> DeviceInfo {
        try await json(.POST, "/v1/devices/\(escape(device))/revoke")
    }

    public func createContainer(_ name: String) async throws -> ContainerInfo {
        try await json(.PUT, "/v1/containers/\(escape(name))")
    }

    public func container(_ name: String) async throws -> ContainerInfo {
        try await json(.GET, "/v1/containers/\(escape(name))")
    }

    public func commit(_ container: String, _ request: CommitRequest) async throws -> CommitResponse {
        // One per change: written and read by hand (FastJSON), as the server does its side.
        let r = try await send(.POST, "/v1/containers/\(escape(container))/commit", body: ByteBuffer(bytes: FastJSON.encode(request)),
                               contentType: "application/json")
        try check(r)
        do { return try FastJSON.decodeCommitResponse(Array(buffer: r.body)) } catch {
            throw RemoteError.unexpected(status: r.status, "the answer is not the expected JSON: \(error)")
        }
    }

    /// Several commits in one request (`POST …/commits`), applied by the server in this order,
    /// each on its own: one answer or error per commit. A failure of the request as a whole (no
    /// answer, a refused token, a server in trouble) is thrown: any of the commits may have been
    /// applied, as with a single commit whose answer was lost.
    public func commitBatch(_ container: String, _ requests: [CommitRequest]) async throws -> [Result<CommitResponse, RemoteError>] {
        let r = try await send(.POST, "/v1/containers/\(escape(container))/commits",
                               body: ByteBuffer(bytes: FastJSON.encode(CommitBatchRequest(commits: requests))), contentType: "application/json")
        try check(r)
        let answer: CommitBatchResponse
        do { answer = try FastJSON.decodeCommitBatchResponse(Array(buffer: r.body)) } catch {
            throw RemoteError.unexpected(status: r.status, "the answer is not the expected JSON: \(error)")
        }
        guard answer.results.count == requests.count else {
            throw RemoteError.unexpected(status: r.status, "\(answer.results.count) answers to \(requests.count) commits")
        }
        return answer.results.map { result in
            if let ok = result.ok { return .success(ok) }
            guard let e = result.error else { return .failure(.unexpected(status: r.status, "an answer with neither a commit nor an error")) }
            let quota = e.usage.map { QuotaFigures(usage: $0, quota: e.quota) }
            return .failure(.server(status: result.status ?? 400, code: e.code, message: e.message, missing: e.missing, quota: quota))
        }
    }

    /// A long-poll (`wait` > 0) is answered by `wait` seconds at the latest; a server silent 10 s
    /// past that (stopped, hung, or a network that drops everything) counts as gone, so the
    /// status says offline within `wait` + 10 s, not `wait` + `timeout`.
    public func changes(_ container: String, since: Int64, wait: Int = 0, limit: Int = 500) async throws -> ChangesResponse {
        let slack = wait > 0 ? min(timeout, .seconds(10)) : timeout
        return try await json(.GET, "/v1/containers/\(escape(container))/changes?since=\(since)&wait=\(wait)&limit=\(limit)",
                              deadline: slack + .seconds(Int64(wait)))
    }

    public func items(_ container: String, after: ItemID? = nil, limit: Int = 500) async throws -> ItemsResponse {
        let a = after.map { "&after=\($0)" } ?? ""
        let r = try await send(.GET, "/v1/containers/\(escape(container))/items?limit=\(limit)\(a)")
        try check(r)
        // A first sync reads 100,000 items this way: the hand-written reader (FastJSON).
        do { return try FastJSON.decodeItemsResponse(Array(buffer: r.body)) } catch {
            throw RemoteError.unexpected(status: r.status, "the answer is not the expected JSON: \(error)")
        }
    }

    public func item(_ container: String, _ id: ItemID) async throws -> ItemRecord {
        try await json(.GET, "/v1/containers/\(escape(container))/items/\(id)")
    }

    /// Every version of the item, newest first, page after page (`next`).
    public func versions(_ container: String, _ id: ItemID) async throws -> [VersionRecord] {
        var all: [VersionRecord] = []
        var before: Int64?
        repeat {
            let page = try await versionsPage(container, id, before: before)
            all += page.versions
            // A server that repeats itself would loop for ever: each page must go further back.
            guard page.next.map({ n in before.map { n < $0 } ?? true }) ?? true else {
                throw RemoteError.unexpected(status: 200, "the server's versions of \(id) did not go further back than \(before ?? 0)")
            }
            before = page.next
        } while before != nil
        return all
    }

    /// A page of the item's versions older than `before` (nil: from the newest).
    public func versionsPage(_ container: String, _ id: ItemID, before: Int64? = nil) async throws -> VersionsResponse {
        try await json(.GET, "/v1/containers/\(escape(container))/items/\(id)/versions" + (before.map { "?before=\($0)" } ?? ""))
    }

    public func resolve(_ container: String, _ id: ItemID, _ request: ResolveRequest) async throws -> CommitResponse {
        try await json(.POST, "/v1/containers/\(escape(container))/items/\(id)/resolve", body: request)
    }

    // MARK: Recently Deleted (docs/trash.md)

    /// Every entry, newest first.
    public func trash(_ container: String) async throws -> TrashResponse {
        var all: [TrashEntry] = []
        var after: String?
        var keep: Int64 = 0
        var pages = 0
        var total: TrashTotals?
        repeat {
            let page = try await trashPage(container, after: after)
            all += page.entries
            keep = page.keepSeconds
            if pages == 0 { total = page.total }
            pages += 1
            // A server that repeats itself would loop for ever.
            guard page.next == nil || page.next != after, pages < 100_000 else {
                throw RemoteError.unexpected(status: 200, "the server's Recently Deleted listing did not move past \(after ?? "the start")")
            }
            after = page.next
        } while after != nil
        return TrashResponse(entries: all, next: nil, keepSeconds: keep, total: total)
    }

    /// What the container's Recently Deleted holds (nil: a server that does not say).
    public func trashTotals(_ container: String) async throws -> TrashTotals? {
        try await trashPage(container, limit: 1).total
    }

    public func trashPage(_ container: String, after: String? = nil, limit: Int = 500) async throws -> TrashResponse {
        let a = after.map { "&after=\(escape($0))" } ?? ""
        return try await json(.GET, "/v1/containers/\(escape(container))/trash?limit=\(limit)\(a)")
    }

    /// Entry `id` and every item in it.
    public func trashItems(_ container: String, _ id: ItemID) async throws -> TrashItemsResponse {
        var page: TrashItemsResponse = try await json(.GET, "/v1/containers/\(escape(container))/trash/\(id)/items")
        var items = page.items
        while let next = page.next {
            page = try await json(.GET, "/v1/containers/\(escape(container))/trash/\(id)/items?after=\(next)")
            guard page.next.map({ $0.description > next.description }) ?? true else {
                throw RemoteError.unexpected(status: 200, "the server's items of Recently Deleted entry \(id) did not move past \(next)")
            }
            items += page.items
        }
        return TrashItemsResponse(entry: page.entry, items: items, next: nil)
    }

    public func restoreTrash(_ container: String, _ id: ItemID, to folder: ItemID? = nil) async throws -> TrashRestoreResponse {
        try await json(.POST, "/v1/containers/\(escape(container))/trash/\(id)/restore", body: TrashRestoreRequest(to: folder))
    }

    /// Purges entry `id`, or every entry when nil.
    public func purgeTrash(_ container: String, _ id: ItemID?) async throws -> TrashPurgeResponse {
        try await json(.DELETE, "/v1/containers/\(escape(container))/trash" + (id.map { "/\($0)" } ?? ""))
    }

    public func missingChunks(_ hashes: [ContentHash]) async throws -> [ContentHash] {
        let r: ChunkList = try await json(.POST, "/v1/chunks/missing", body: ChunkList(hashes: hashes))
        return r.hashes
    }

    public func putChunk(_ hash: ContentHash, _ bytes: [UInt8]) async throws {
        let r = try await send(.PUT, "/v1/chunks/\(hash)", body: ByteBuffer(bytes: bytes), contentType: "application/octet-stream")
        try check(r)
    }

    /// Hashes and uploads `bytes` as one chunk; returns its reference.
    @discardableResult
    public func upload(_ bytes: [UInt8]) async throws -> ChunkRef {
        let hash = ContentHash(digest: SHA256.hash(data: bytes))
        try await putChunk(hash, bytes)
        return ChunkRef(hash: hash, size: Int64(bytes.count))
    }

    public func getChunk(_ hash: ContentHash, range: Range<Int64>? = nil) async throws -> [UInt8] {
        var headers: [(String, String)] = []
        if let range { headers.append(("Range", "bytes=\(range.lowerBound)-\(range.upperBound - 1)")) }
        let r = try await send(.GET, "/v1/chunks/\(hash)", headers: headers)
        try check(r)
        return Array(buffer: r.body)
    }

    /// Streams a chunk's bytes to `part` as they arrive from the socket — no copy of the whole
    /// chunk is made (hydration hashes and writes each part where it lands). Returns the number
    /// of bytes. Errors thrown by `part` come back as they are (not as `transport`); more bytes
    /// than a chunk may hold end the transfer with `unexpected`.
    public func streamChunk(_ hash: ContentHash, _ part: (UnsafeRawBufferPointer) throws -> Void) async throws -> Int64 {
        var request = HTTPClientRequest(url: baseURL + "/v1/chunks/\(hash)")
        request.method = .GET
        request.headers.add(name: "Authorization", value: "Bearer \(token)")
        var partError: (any Error)?
        var total: Int64 = 0
        do {
            let response = try await http.execute(request, timeout: timeout)
            guard response.status.code == 200 else {
                let body = try await response.body.collect(upTo: 1 << 20)
                let r = RawResponse(status: Int(response.status.code), headers: response.headers.map { ($0.name, $0.value) }, body: body)
                try check(r)
                throw RemoteError.unexpected(status: r.status, "a chunk was asked for and this came back: \(r.text.prefix(200))")
            }
            for try await buffer in response.body {
                total += Int64(buffer.readableBytes)
                guard total <= Int64(ProtocolLimits.maxChunkSize) else {
                    throw RemoteError.unexpected(status: 200, "chunk \(hash) came with more than \(ProtocolLimits.maxChunkSize) bytes")
                }
                do { try buffer.withUnsafeReadableBytes(part) } catch {
                    partError = error
                    throw error
                }
            }
            return total
        } catch {
            if let partError { throw partError }
            if let e = error as? RemoteError { throw e }
            throw await transportError(error, "GET \(baseURL)/v1/chunks/\(hash)")
        }
    }

    // MARK: raw access (tests and tools)

    public struct RawResponse: Sendable {
        public var status: Int
        public var headers: [(String, String)]
        public var body: ByteBuffer
        public func header(_ name: String) -> String? { headers.first { $0.0.lowercased() == name.lowercased() }?.1 }
        public var text: String { String(buffer: body) }
    }

    /// Sends a request as given (no JSON encoding) and returns whatever comes back.
    public func send(_ method: HTTPMethod, _ path: String, body: ByteBuffer? = nil, contentType: String? = nil,
                     headers: [(String, String)] = [], authorized: Bool = true, deadline: TimeAmount? = nil) async throws -> RawResponse {
        var request = HTTPClientRequest(url: baseURL + path)
        request.method = method
        if authorized { request.headers.add(name: "Authorization", value: "Bearer \(token)") }
        for (k, v) in headers { request.headers.add(name: k, value: v) }
        if let body {
            request.body = .bytes(body)
            if let contentType { request.headers.add(name: "Content-Type", value: contentType) }
        }
        do {
            let response = try await http.execute(request, timeout: deadline ?? timeout)
            let bytes = try await response.body.collect(upTo: ProtocolLimits.maxChunkSize + 1024 * 1024)
            return RawResponse(status: Int(response.status.code), headers: response.headers.map { ($0.name, $0.value) }, body: bytes)
        } catch let e as RemoteError {
            throw e
        } catch {
            throw await transportError(error, "\(method) \(baseURL)\(path.prefix(120))")
        }
    }

    func json<R: Decodable>(_ method: HTTPMethod, _ path: String, deadline: TimeAmount? = nil) async throws -> R {
        let r = try await send(method, path, deadline: deadline)
        try check(r)
        return try decode(r)
    }

    func json<R: Decodable>(_ method: HTTPMethod, _ path: String, body: some Encodable) async throws -> R {
        let data = try JSONEncoder().encode(body)
        let r = try await send(method, path, body: ByteBuffer(data: data), contentType: "application/json")
        try check(r)
        return try decode(r)
    }

    private func decode<R: Decodable>(_ r: RawResponse) throws -> R {
        do { return try JSONDecoder().decode(R.self, from: Data(buffer: r.body)) } catch {
            throw RemoteError.unexpected(status: r.status, "the answer is not the expected JSON: \(error)")
        }
    }

    private func check(_ r: RawResponse) throws {
        guard r.status >= 300 else { return }
        if let e = try? JSONDecoder().decode(ErrorBody.self, from: Data(buffer: r.body)) {
            let quota = e.error.usage.map { QuotaFigures(usage: $0, quota: e.error.quota) }
            throw RemoteError.server(status: r.status, code: e.error.code, message: e.error.message, missing: e.error.missing, quota: quota)
        }
        throw RemoteError.unexpected(status: r.status, String(r.text.prefix(200)))
    }

    /// `text` without the token: errors end up in logs and `.nimbus/status`.
    /// What a request that got no answer ran into: a certificate problem in words that say what
    /// to do (`TLSDiagnosis`), else the error as it came.
    func transportError(_ error: any Error, _ request: String) async -> RemoteError {
        if let why = await TLSDiagnosis.explain(error, url: baseURL) { return .certificate(redacted("\(why) (\(request))")) }
        return .transport(redacted("\(error) (\(request))"))
    }

    func redacted(_ text: String) -> String {
        token.isEmpty ? text : text.replacingOccurrences(of: token, with: "[token]")
    }

    private func escape(_ s: String) -> String {
        s.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "/"))) ?? s
    }
}

/// The HTTP method type of `NimbusClient.send`, re-exported so callers need not import NIOHTTP1.
public typealias HTTPVerb = HTTPMethod
