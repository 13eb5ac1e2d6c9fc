import Chunking
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import NimbusCore
import NimbusProtocol

/// What the web view's script does with the server (docs/web.md "Upload", "Live refresh"):
/// uploads streamed into chunks and committed like a device's, and the wait for the next change
/// of a container. Both answer JSON; a change carries the session's CSRF value in a header
/// (`X-Nimbus-CSRF`), which no other site's page can set without a CORS answer this server
/// never gives.
extension WebRoutes {
    static let csrfHeader = HTTPField.Name("X-Nimbus-CSRF")!
    /// Longest wait of `…/changes`, in seconds (a browser's request stays well under any proxy's
    /// read timeout).
    static let liveWaitSeconds = 25

    func registerLive(on router: Router<NimbusContext>) {
        asset(router, "web/app.js", type: "text/javascript; charset=utf-8", WebScript.source)
        router.post("web/c/:container/upload") { req, ctx in
            try await self.json(req, ctx, change: true) { session in try await self.upload(req, ctx, session) }
        }
        router.get("web/c/:container/changes") { req, ctx in
            try await self.json(req, ctx, change: false) { session in try await self.changes(req, ctx, session) }
        }
    }

    /// Runs a script's request: signed in (else 401), from this origin with the session's CSRF
    /// header when it changes something (else 403); errors are `{"error": "…"}` with their status.
    func json(_ req: Request, _ ctx: NimbusContext, change: Bool,
              _ body: (WebSession) async throws -> [String: JSONValue]) async throws -> Response {
        do {
            // The live wait is the page's own asking, no use of the session (idle expiry).
            guard let session = try await self.signedIn(req, change ? .use : .check) else {
                return Self.jsonResponse(["error": .string("you are signed out; reload the page to sign in again")], status: .unauthorized)
            }
            if change {
                guard Self.sameOrigin(req), req.headers[Self.csrfHeader] == session.csrf else {
                    return Self.jsonResponse(["error": .string("this change did not come from this site's page; nothing was done — reload the page")],
                                             status: .forbidden)
                }
            }
            return Self.jsonResponse(try await body(session))
        } catch {
            let e = ErrorMiddleware.apiError(error, request: req, logger: ctx.logger)
            return Self.jsonResponse(["error": .string(e.message), "code": .string(e.code.rawValue)], status: .init(code: e.code.httpStatus))
        }
    }

    /// The session, nil when signed out or expired.
    func signedIn(_ req: Request, _ use: WebSessionUse = .use) async throws -> WebSession? {
        do { return try await session(req, use) } catch is Expired { return nil }
    }

    static func jsonResponse(_ value: [String: JSONValue], status: HTTPResponse.Status = .ok) -> Response {
        var headers = securityHeaders
        headers[.contentType] = "application/json"
        headers[.cacheControl] = "no-store"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: (try? JSONEncoder().encode(JSONValue.object(value))) ?? Data("{}".utf8))))
    }

    /// `POST …/upload?folder=ID&name=NAME`: the body is a file's bytes (its length declared),
    /// cut into chunks as they arrive exactly as a device cuts them (`Chunker.standard`), each
    /// stored as a device's upload is (hash checked, quota counted), then committed as a new file
    /// by this browser's device. With `kind=folder` (no body): a new folder, for the folders of
    /// an uploaded folder. A name taken in the folder gets another (`name 2.ext`, as for any
    /// device); the answer says which.
    func upload(_ req: Request, _ ctx: NimbusContext, _ s: WebSession) async throws -> [String: JSONValue] {
        let c = try await container(ctx, s)
        let q = req.uri.queryParameters
        let parent: ItemID
        if let f = q.get("folder"), !f.isEmpty {
            guard let id = ItemID(String(f)) else { throw APIError(.invalidParameter, "folder must be an item id") }
            parent = id
        } else {
            parent = .root
        }
        // The folder first (cheap): an upload into a folder that is gone stores nothing.
        if !parent.isRoot {
            guard let p = try await routes.store.place(of: parent, in: c), !p.deleted, p.kind == .folder else {
                throw APIError(.parentNotFound, "the folder to upload into is not in \(c.name) any more (deleted, or moved into Recently Deleted); nothing was stored — reload the page")
            }
        }
        let raw = q.get("name").map { String($0) } ?? ""
        let name: ItemName
        do { name = try ItemName(raw) } catch { throw APIError(.invalidName, "\(error): \(raw.prefix(300).debugDescription)") }
        let draft: ItemDraft
        switch q.get("kind").map({ String($0) }) ?? "file" {
        case "folder":
            draft = ItemDraft(kind: .folder, parent: parent, name: name, mode: 0o755, modified: routes.clock())
        case "file":
            guard let declared = try Routes.contentLength(req) else {
                throw APIError(.badRequest, "an upload must declare its length (Content-Length)")
            }
            let chunks = try await storeChunks(of: req.body, length: Int64(declared), account: s.device, ctx)
            draft = ItemDraft(kind: .file, parent: parent, name: name, chunks: chunks, mode: 0o644, modified: routes.clock())
        default:
            throw APIError(.invalidParameter, "kind is file or folder")
        }
        let r = try await routes.store.commit(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: draft), in: c, by: s.device,
                                              now: routes.clock())
        routes.committed(c, r)
        return ["id": .string(r.item.id.description), "name": .string(r.item.name.value), "renamed": .bool(r.renamed),
                "size": .number(Double(r.item.size))]
    }

    /// Cuts `body` (exactly `length` bytes) into chunks and stores each as it is cut: at most one
    /// largest chunk and the piece that arrived are held at a time, under a reservation of the
    /// bodies in flight like a device's chunk upload.
    func storeChunks<Body: AsyncSequence>(of body: Body, length: Int64, account d: DeviceRecord,
                                          _ ctx: NimbusContext) async throws -> [ChunkRef] where Body.Element == ByteBuffer {
        let chunker = Chunker.standard
        guard length / Int64(chunker.minSize) < Int64(ProtocolLimits.maxChunksPerItem) else {
            throw APIError(.bodyTooLarge, "this file is too large to upload (\(length) bytes); a file can have at most \(ProtocolLimits.maxChunksPerItem) chunks")
        }
        let routes = self.routes
        return try await routes.bodies.withReservation(device: d.id, bytes: 2 * chunker.maxSize) {
            var pending = ByteBuffer()
            var out: [ChunkRef] = []
            var received: Int64 = 0
            func cut(final: Bool) async throws {
                while pending.readableBytes >= chunker.maxSize || (final && pending.readableBytes > 0) {
                    let n = pending.withUnsafeReadableBytes { chunker.cut($0) }
                    let piece = pending.readSlice(length: n)!
                    let hash = piece.withUnsafeReadableBytes { ContentHash(digest: SHA256.hash(data: $0)) }
                    try await ChunkUploads.store(piece, as: hash, account: d.accountID, store: routes.store, chunks: routes.chunks,
                                                 clock: routes.clock, makeRoom: routes.makeRoom(ctx.logger))
                    routes.metrics.bytesIn.increment(by: Int64(n))
                    out.append(ChunkRef(hash: hash, size: Int64(n)))
                }
                pending.discardReadBytes()
            }
            for try await var piece in body {
                received += Int64(piece.readableBytes)
                guard received <= length else { throw APIError(.badRequest, "the upload sent more bytes than it declared (\(length)); nothing was committed") }
                pending.writeBuffer(&piece)
                try await cut(final: false)
            }
            guard received == length else {
                throw APIError(.badRequest, "the upload ended after \(received) of its \(length) bytes; nothing was committed — upload it again")
            }
            try await cut(final: true)
            return out
        }
    }

    /// `GET …/changes?since=CURSOR`: answers when the container's journal passes `since`, or
    /// after `liveWaitSeconds`: `{"cursor": N}`. The page's script reloads the page when it moves.
    func changes(_ req: Request, _ ctx: NimbusContext, _ s: WebSession) async throws -> [String: JSONValue] {
        let c = try await container(ctx, s)
        let since = try Routes.intParam(req, "since", default: 0, range: 0...Int64.max)
        var cursor = try await routes.store.cursor(of: c)
        let deadline = ContinuousClock.now + .seconds(Self.liveWaitSeconds)
        while cursor <= since, deadline - ContinuousClock.now > .milliseconds(50) {
            let started = ContinuousClock.now
            await routes.notifier.wait(container: c.id, after: since, timeout: deadline - ContinuousClock.now, closed: ctx.connectionClosed)
            // Woken with nothing new (a revocation elsewhere, a notice this instance saw first):
            // never a busy loop.
            if ContinuousClock.now - started < .milliseconds(100) { try await Task.sleep(for: .milliseconds(100)) }
            // Signed out or revoked meanwhile: the script reloads into the sign-in page.
            guard try await self.signedIn(req, .check) != nil else { throw APIError(.unauthorized, "you are signed out; reload the page") }
            cursor = try await routes.store.cursor(of: c)
            if routes.notifier.isClosed { break }
        }
        return ["cursor": .number(Double(cursor))]
    }
}
