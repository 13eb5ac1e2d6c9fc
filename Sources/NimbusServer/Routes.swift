import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import NimbusCore
import NimbusProtocol
import Synchronization

/// The v1 API (docs/protocol.md). Handlers validate at the edge, call the store, and answer JSON;
/// errors are `APIError`s that `ErrorMiddleware` renders.
struct Routes: Sendable {
    let store: any ServerStore
    let chunks: any ChunkStore
    let notifier: CommitNotifier
    let revocations: Revocations
    let metrics: ServerMetrics
    let clock: @Sendable () -> Int64
    let bodies: BodyBudget
    let containers = LockedDictionary<ContainerRecord>()
    let pairing = PairingGuard()
    /// A new authenticator (its cache of known tokens is its own).
    func authenticator() -> Authenticator { Authenticator(store: store, revocations: revocations) }
    let trustedProxies: Set<String>
    /// How long Recently Deleted keeps a deleted item (seconds).
    let trashKeepSeconds: Int64

    /// The client's address: the connection's peer, or, when the peer is a trusted proxy, the
    /// address it appended last to `X-Forwarded-For` (what nginx's `$proxy_add_x_forwarded_for`
    /// adds; entries before it come from the client and are not believed).
    func client(_ req: Request, _ ctx: NimbusContext) -> String {
        guard trustedProxies.contains(ctx.clientAddress), let name = HTTPField.Name("X-Forwarded-For"),
              let header = req.headers[values: name].last,
              let last = header.split(separator: ",").last?.trimmingCharacters(in: .whitespaces),
              !last.isEmpty, last.utf8.count <= 64 else { return ctx.clientAddress }
        return last
    }

    func register(on router: Router<NimbusContext>) {
        router.get("healthz") { _, _ in "ok\n" }
        router.get("metrics") { _, _ in
            var headers = HTTPFields()
            headers[.contentType] = "text/plain; version=0.0.4"
            self.metrics.observe(self.store.databaseRoundTrips)
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: self.metrics.emit())))
        }
        // Enrolling: the new machine has no token yet (docs/protocol.md "Devices").
        router.post("v1/pair") { req, ctx in
            let client = self.client(req, ctx)
            try self.pairing.check(client)
            // Every request that is not a good code counts as a wrong guess, malformed ones too.
            let body: PairRequest
            do { body = try await Self.decode(PairRequest.self, req) } catch {
                self.pairing.wrong(client)
                throw error
            }
            guard let code = PairingLimits.normalize(body.code) else {
                self.pairing.wrong(client)
                throw APIError(.pairingInvalid, "that is not a pairing code (XXXX-XXXX-XXXX); ask for one on an enrolled device with `nimbus device add NAME`")
            }
            let token = TokenHash.newToken()
            guard let d = try await self.store.redeemPairing(codeHash: TokenHash.of(code), deviceName: body.device,
                                                             tokenHash: TokenHash.of(token), now: self.clock() / 1_000_000_000) else {
                self.pairing.wrong(client)
                throw APIError(.pairingInvalid, "this pairing code is unknown, already used or expired (codes work once, for \(PairingLimits.lifetimeSeconds / 60) minutes); ask for a new one with `nimbus device add NAME`")
            }
            return JSONResponse.make(PairResult(token: token, account: d.accountName, device: d.name, deviceID: d.id))
        }
        let auth = authenticator()
        let v1 = DeviceRoutes(router: router, auth: auth)
        v1.post("devices/pairing") { req, ctx in
            let d = try ctx.requireDevice()
            let body = try await Self.decode(PairingRequest.self, req)
            var rng = SystemRandomNumberGenerator()
            let code = String((0..<PairingLimits.length).map { _ in PairingLimits.alphabet.randomElement(using: &rng)! })
            let expires = self.clock() / 1_000_000_000 + PairingLimits.lifetimeSeconds
            try await self.store.addPairing(account: d.accountID, codeHash: TokenHash.of(code), deviceName: body.device, createdBy: d.id, expires: expires)
            return JSONResponse.make(PairingCode(code: PairingLimits.display(code), device: body.device, expires: expires))
        }
        v1.get("devices") { _, ctx in
            let d = try ctx.requireDevice()
            let all = try await self.store.devices(account: d.accountName)
            return JSONResponse.make(DeviceList(devices: all.map { DeviceInfo(id: $0.id, name: $0.name, created: $0.created, revoked: $0.revoked) }))
        }
        v1.post("devices/:device/revoke") { _, ctx in
            let d = try ctx.requireDevice()
            let name = try ctx.parameters.require("device")
            let r = try await self.store.revokeDevice(account: d.accountName, device: name, now: self.clock() / 1_000_000_000)
            try? await self.revocations.check(self.store)  // this instance's polls now; others within a second
            return JSONResponse.make(DeviceInfo(id: r.id, name: r.name, created: r.created, revoked: r.revoked))
        }
        v1.get("whoami") { _, ctx in
            let d = try ctx.requireDevice()
            return JSONResponse.make(WhoAmI(account: d.accountName, device: d.id, deviceName: d.name, protocolVersion: NimbusProtocolVersion.current))
        }
        v1.put("containers/:container") { _, ctx in
            let c = try await self.container(ctx, create: true)
            return JSONResponse.make(ContainerInfo(name: c.name, cursor: try await self.store.cursor(of: c)))
        }
        v1.get("containers/:container") { _, ctx in
            let c = try await self.container(ctx)
            return JSONResponse.make(ContainerInfo(name: c.name, cursor: try await self.store.cursor(of: c)))
        }
        v1.get("containers/:container/items") { req, ctx in
            let c = try await self.container(ctx)
            let after = try req.uri.queryParameters.get("after").map { s -> ItemID in
                guard let id = ItemID(String(s)) else { throw APIError(.invalidParameter, "query parameter \"after\" must be an item id") }
                return id
            }
            let limit = try Self.intParam(req, "limit", default: 500, range: 1...Int64(ProtocolLimits.maxPage))
            return JSONResponse.make(try await self.store.items(in: c, after: after, limit: Int(limit)))
        }
        v1.get("containers/:container/items/:item") { _, ctx in
            let c = try await self.container(ctx)
            let id = try Self.itemID(ctx)
            guard let item = try await self.store.item(id, in: c) else { throw APIError.itemNotFound(id) }
            return JSONResponse.make(item)
        }
        v1.get("containers/:container/items/:item/versions") { req, ctx in
            let c = try await self.container(ctx)
            let id = try Self.itemID(ctx)
            let before = req.uri.queryParameters.get("before") == nil ? nil : try Self.intParam(req, "before", default: 0, range: 1...Int64.max)
            let page = try await self.store.versions(of: id, in: c, before: before)
            if page.versions.isEmpty, before == nil { throw APIError.itemNotFound(id) }
            return JSONResponse.make(page)
        }
        v1.post("containers/:container/items/:item/resolve") { req, ctx in
            let c = try await self.container(ctx)
            let id = try Self.itemID(ctx)
            let body = try await Self.decode(ResolveRequest.self, req)
            let r = try await self.store.resolve(body, item: id, in: c, by: try ctx.requireDevice(), now: self.clock())
            self.committed(c, r)
            return JSONResponse.make(r)
        }
        // Recently Deleted (docs/trash.md).
        v1.get("containers/:container/trash") { req, ctx in
            let c = try await self.container(ctx)
            let after = try req.uri.queryParameters.get("after").map { s -> TrashCursor in
                guard let cursor = TrashCursor(String(s)) else { throw APIError(.invalidParameter, "query parameter \"after\" must be a \"next\" from an earlier page") }
                return cursor
            }
            let limit = Int(try Self.intParam(req, "limit", default: 500, range: 1...Int64(ProtocolLimits.maxPage)))
            let rows = try await self.store.trash(in: c, after: after, limit: limit + 1)
            let page = rows.prefix(limit)
            let next = rows.count > limit ? page.last.map { TrashCursor(deletedAt: $0.row.deletedAt, id: $0.row.item.id).text } : nil
            let total = after == nil ? try await self.store.trashTotals(in: c) : nil
            return JSONResponse.make(TrashResponse(entries: page.map(self.entry), next: next, keepSeconds: self.trashKeepSeconds, total: total))
        }
        v1.get("containers/:container/trash/:item/items") { req, ctx in
            let c = try await self.container(ctx)
            let id = try Self.itemID(ctx)
            let after = try req.uri.queryParameters.get("after").map { s -> ItemID in
                guard let id = ItemID(String(s)) else { throw APIError(.invalidParameter, "query parameter \"after\" must be an item id") }
                return id
            }
            let limit = Int(try Self.intParam(req, "limit", default: 500, range: 1...Int64(ProtocolLimits.maxPage)))
            guard let listed = try await self.store.trashEntry(id, in: c) else { throw Self.notInTrash(id) }
            var budget = PageBudget(limit: limit)
            var items: [ItemRecord] = []
            var next: ItemID?
            for item in listed.items ?? [] where after.map({ item.id.description > $0.description }) ?? true {
                guard budget.admit(256 + item.state.content.chunks.count * 100) else { next = items.last?.id; break }
                items.append(item.record)
            }
            return JSONResponse.make(TrashItemsResponse(entry: self.entry(listed), items: items, next: next))
        }
        v1.post("containers/:container/trash/:item/restore") { req, ctx in
            let c = try await self.container(ctx)
            let id = try Self.itemID(ctx)
            let body = try await Self.decode(TrashRestoreRequest.self, req)
            let r = try await self.store.restoreTrash(id, to: body.to, in: c, by: try ctx.requireDevice(), now: self.clock())
            self.metrics.commits.increment()
            self.notifier.notify(container: c.id, seq: r.cursor)
            return JSONResponse.make(r)
        }
        v1.delete("containers/:container/trash/:item") { _, ctx in
            let c = try await self.container(ctx)
            let id = try Self.itemID(ctx)
            let r = try await self.store.purgeTrash([id], in: c)
            if r.entries == 0 { throw Self.notInTrash(id) }
            self.metrics.purged(r)
            let by = try ctx.requireDevice().id
            ctx.logger.info("Recently Deleted: purged entry \(id) (\(r.items) item(s), \(r.bytes) bytes) at the request of device \(by)")
            return JSONResponse.make(r)
        }
        v1.delete("containers/:container/trash") { _, ctx in
            let c = try await self.container(ctx)
            let r = try await self.store.purgeTrash(nil, in: c)
            self.metrics.purged(r)
            let by = try ctx.requireDevice().id
            ctx.logger.info("Recently Deleted: purged all \(r.entries) entries (\(r.items) item(s), \(r.bytes) bytes) at the request of device \(by)")
            return JSONResponse.make(r)
        }
        v1.post("containers/:container/commit") { req, ctx in
            let c = try await self.container(ctx)
            let body = try await self.decodeChunkList(CommitRequest.self, req, ctx)
            return JSONResponse.make(try await self.commit(body, in: c, by: try ctx.requireDevice(), ctx))
        }
        v1.post("containers/:container/commits") { req, ctx in
            let c = try await self.container(ctx)
            let batch = try await self.decodeChunkList(CommitBatchRequest.self, req, ctx)
            let d = try ctx.requireDevice()
            // In the order sent, each on its own: one refused leaves the others as they would be
            // alone (a device sends a folder's create before its children's). The small files'
            // bytes are stored first (a commit whose bytes are refused is answered that error),
            // then the commits go together (one transaction where the engine groups them).
            let stored = await self.storeInline(batch.commits, account: d.accountID, ctx)
            let ready = zip(batch.commits, stored).compactMap { $1 == nil ? $0 : nil }
            var answers = await self.store.commitAll(ready, in: c, by: d, now: self.clock()).makeIterator()
            var results: [CommitBatchResponse.Result] = []
            results.reserveCapacity(batch.commits.count)
            for failed in stored {
                let outcome: Result<CommitResponse, any Error> = failed.map { .failure($0) } ?? answers.next() ?? .failure(APIError(.internal, "no answer"))
                switch outcome {
                case .success(let r):
                    self.committed(c, r)
                    results.append(.init(ok: r))
                case .failure(let error):
                    let e = ErrorMiddleware.apiError(error, request: req, logger: ctx.logger)
                    results.append(.init(status: e.code.httpStatus, error: ErrorMiddleware.body(for: e).error))
                }
            }
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: FastJSON.encode(CommitBatchResponse(results: results)))))
        }
        v1.get("containers/:container/changes") { req, ctx in
            let c = try await self.container(ctx)
            let since = try Self.intParam(req, "since", default: 0, range: 0...Int64.max)
            let wait = try Self.intParam(req, "wait", default: 0, range: 0...Int64(ProtocolLimits.maxWaitSeconds))
            let limit = Int(try Self.intParam(req, "limit", default: 500, range: 1...Int64(ProtocolLimits.maxPage)))
            if wait > 0, let feed = self.store as? any CommitFeed { try await feed.watch(c) }
            var page = try await self.store.changes(in: c, since: since, limit: limit)
            let deadline = ContinuousClock.now + .seconds(wait)
            if page.changes.isEmpty, wait > 0 {
                self.metrics.longPolls.increment()
                defer { self.metrics.longPolls.decrement() }
                while true {
                    let epoch = self.revocations.epoch
                    await self.notifier.wait(container: c.id, after: page.cursor, timeout: deadline - ContinuousClock.now,
                                             closed: ctx.connectionClosed)
                    // The token is checked again after every wait: a device revoked meanwhile
                    // gets 401, not what was committed after its revocation.
                    _ = try await auth.device(for: req)
                    page = try await self.store.changes(in: c, since: since, limit: limit)
                    // Woken by a revocation (not this device's): nothing new, so wait on.
                    guard page.changes.isEmpty, self.revocations.epoch != epoch, !self.notifier.isClosed,
                          deadline - ContinuousClock.now > .milliseconds(50) else { break }
                }
            }
            if wait > 0, let asker = ctx.device?.id {
                page = try await self.holdOwnChanges(page, asker: asker, c, since: since, limit: limit, deadline: deadline, auth, req, ctx)
            }
            page.inline = await self.inlineChunks(page.changes, for: ctx.device?.id, logger: ctx.logger)
            return JSONResponse.make(page)
        }
        v1.post("chunks/missing") { req, ctx in
            let d = try ctx.requireDevice()
            let body = try await self.decodeChunkList(ChunkList.self, req, ctx)
            // Claims what it reports present: the garbage collector keeps those for its grace
            // period from now, so the device can upload the rest and commit (ChunkCollector).
            let owned = try await self.store.claimChunks(account: d.accountID, hashes: body.hashes, now: self.clock())
            var seen = Set<ContentHash>()
            let missing = body.hashes.filter { owned[$0] == nil && seen.insert($0).inserted }
            return JSONResponse.make(ChunkList(hashes: missing))
        }
        // A chunk streams through in pieces both ways (docs/deploy.md "Bodies"): the store
        // checks size and hash as the bytes pass, so no whole chunk is ever held in memory.
        v1.put("chunks/:hash") { req, ctx in
            let d = try ctx.requireDevice()
            let hash = try Self.hash(ctx)
            let size = try Self.chunkSize(req)
            return try await self.bodies.withReservation(device: d.id, bytes: Int(size)) {
                try await ChunkUploads.store(hash, size: size, body: req.body, account: d.accountID, store: self.store,
                                             chunks: self.chunks, clock: self.clock, makeRoom: self.makeRoom(ctx.logger))
                self.metrics.bytesIn.increment(by: size)
                return Response(status: .created)
            }
        }
        v1.get("chunks/:hash") { req, ctx in
            let d = try ctx.requireDevice()
            let hash = try Self.hash(ctx)
            let notFound = APIError(.chunkNotFound, "chunk \(hash) is not on the server for this account; upload it first")
            guard let size = try await self.store.ownedChunks(account: d.accountID, hashes: [hash])[hash] else { throw notFound }
            var status = HTTPResponse.Status.ok
            var headers = HTTPFields()
            headers[.contentType] = "application/octet-stream"
            headers[.acceptRanges] = "bytes"
            var range: Range<Int64>? = nil
            if let header = req.headers[.range] {
                let r = try ByteRange.parse(header, size: size)
                range = r
                status = .partialContent
                headers[.contentRange] = "bytes \(r.lowerBound)-\(r.upperBound - 1)/\(size)"
            }
            let missing = APIError(.unavailable, "chunk \(hash) is recorded but its bytes are missing on the server; re-upload it")
            guard let reader = try await self.chunks.open(hash, range: range) else { throw missing }
            if range == nil, reader.length != size {
                ctx.logger.error("chunk \(hash) is recorded with \(size) bytes but the chunk store holds \(reader.length)")
                throw APIError(.unavailable, "chunk \(hash) is damaged on the server (\(reader.length) bytes stored, \(size) recorded); re-upload it from a device that has it")
            }
            // The status line is sent before the bytes: a failure while they stream (the store
            // cut off, a damaged chunk caught before its last byte) can only cut the connection,
            // which the device sees as a body shorter than its Content-Length.
            let metrics = self.metrics, logger = ctx.logger
            let body = ResponseBody(contentLength: Int(reader.length)) { writer in
                var pieces = reader.makeAsyncIterator()
                while true {
                    let piece: ByteBuffer?
                    do { piece = try await pieces.next() } catch {
                        let reason = (error as? APIError)?.message ?? "\(error)"
                        logger.error("GET chunk \(hash): cut the response: \(reason)")
                        throw error
                    }
                    guard let piece else { break }
                    try await writer.write(piece)  // waits while the device is slower than the store
                    metrics.bytesOut.increment(by: Int64(piece.readableBytes))
                }
                try await writer.finish(nil)
            }
            return Response(status: status, headers: headers, body: body)
        }
    }

    /// A long-poll's page that holds only the asking device's own commits (it knows them from
    /// their answers) waits up to `ServerLimits.ownChangesHold` for more of them, so a burst of
    /// uploads is answered a few times a second instead of once per commit; another device's
    /// change ends the wait at once, and so do a full page and the poll's own deadline.
    func holdOwnChanges(_ page: ChangesResponse, asker: DeviceID, _ c: ContainerRecord, since: Int64, limit: Int,
                        deadline: ContinuousClock.Instant, _ auth: Authenticator, _ req: Request, _ ctx: NimbusContext) async throws -> ChangesResponse {
        guard !page.changes.isEmpty, !page.more, page.changes.allSatisfy({ $0.device == asker }) else { return page }
        let end = min(ContinuousClock.now + bodies.limits.ownChangesHold, deadline - .milliseconds(50))
        var seen = page.cursor, count = page.changes.count
        while ContinuousClock.now < end, !notifier.isClosed {
            await notifier.wait(container: c.id, after: seen, timeout: end - ContinuousClock.now, closed: ctx.connectionClosed)
            _ = try await auth.device(for: req)
            let newer = try await store.changes(in: c, since: seen, limit: limit)
            guard !newer.changes.isEmpty else { break }  // the hold ended (or a revocation woke it)
            seen = newer.cursor
            count += newer.changes.count
            if count >= limit || newer.changes.contains(where: { $0.device != asker }) { break }
        }
        return seen == page.cursor ? page : try await store.changes(in: c, since: since, limit: limit)
    }

    /// The bytes of the small files of a changes page (`ChangesResponse.inline`): each live file
    /// of one chunk of at most `inlineFileBytes`, its last state in the page only, each chunk
    /// once, up to `inlinePageBytes` and `inlinePageChunks` in all, the newest changes first (a
    /// page that ends a burst carries what was written last). A chunk the store cannot read is left out (the
    /// device fetches it, and is told then what is wrong); nil when there is none. Changes the
    /// asking device made itself carry nothing: it has their bytes.
    func inlineChunks(_ changes: [Change], for asker: DeviceID?, logger: Logger) async -> [InlineChunk]? {
        var last: [ItemID: ItemRecord] = [:]
        for c in changes { last[c.item.id] = c.item }
        var out: [InlineChunk] = []
        var seen = Set<ContentHash>()
        var total = 0
        for c in changes.reversed() where last[c.item.id]?.version == c.item.version && c.device != asker {
            if out.count == ProtocolLimits.inlinePageChunks { break }
            let item = c.item
            guard item.kind == .file, !item.deleted, item.chunks.count == 1, let chunk = item.chunks.first,
                  chunk.size <= Int64(ProtocolLimits.inlineFileBytes), total + Int(chunk.size) <= ProtocolLimits.inlinePageBytes,
                  seen.insert(chunk.hash).inserted else { continue }
            do {
                guard let reader = try await chunks.open(chunk.hash, range: nil), reader.length == chunk.size else { continue }
                var bytes = Data(capacity: Int(chunk.size))
                for try await piece in reader { bytes.append(contentsOf: piece.readableBytesView) }
                guard bytes.count == Int(chunk.size) else { continue }
                out.append(InlineChunk(hash: chunk.hash, bytes: bytes))
                total += bytes.count
            } catch {
                logger.warning("changes: chunk \(chunk.hash) of \(item.id) not sent inline: \(error)")
            }
        }
        return out.isEmpty ? nil : out
    }

    func entry(_ l: TrashListed) -> TrashEntry {
        let (at, overflow) = l.row.deletedAt.addingReportingOverflow(trashKeepSeconds * 1_000_000_000)
        return TrashEntry(item: l.row.item.record, path: l.path, deletedAt: l.row.deletedAt, deletedBy: l.row.deletedBy,
                          expires: overflow ? Int64.max : at, items: l.row.items, bytes: l.row.bytes)
    }

    /// An upload over the account's quota: the oldest of its Recently Deleted entries are purged
    /// first (until their bytes cover what is missing) and their chunks freed at once; logged and
    /// counted in `/metrics`.
    func makeRoom(_ logger: Logger) -> ChunkUploads.MakeRoom {
        { account, bytes in
            let (r, chunks) = try await self.store.purgeOldestTrash(account: account, bytes: bytes)
            guard r.entries > 0 else { return false }
            self.metrics.purged(r)
            let freed = try await ChunkCollector(store: self.store, chunks: self.chunks, graceSeconds: 0).reclaim(chunks, now: self.clock())
            self.metrics.collected(freed)
            logger.notice("account \(account) is over its quota: purged its \(r.entries) oldest Recently Deleted entr\(r.entries == 1 ? "y" : "ies") (\(r.items) item(s), \(r.bytes) bytes) to make room; \(freed)")
            return freed.released > 0 || freed.chunks > 0
        }
    }

    static func notInTrash(_ id: ItemID) -> APIError {
        APIError(.notInTrash, "item \(id) is not in Recently Deleted: it is live, it was purged, or it went with a deleted folder (restore or purge the folder); list the entries with GET …/trash")
    }

    /// One commit (alone or in a batch): a small file's bytes that came with it are stored as an
    /// upload first (hash checked as they pass, quota counted), so the commit finds its chunk.
    private func commit(_ body: CommitRequest, in c: ContainerRecord, by d: DeviceRecord, _ ctx: NimbusContext) async throws -> CommitResponse {
        try await storeInline(body, account: d.accountID, ctx)
        let r = try await store.commit(body, in: c, by: d, now: clock())
        committed(c, r)
        return r
    }

    /// The bytes of a small file that came inside its commit, stored as a `PUT` of them would be.
    private func storeInline(_ body: CommitRequest, account: Int64, _ ctx: NimbusContext) async throws {
        if let wrong = InlineChunk.checkCommit(body) { throw APIError(.badRequest, wrong) }
        for chunk in body.inline ?? [] {
            try await ChunkUploads.store(ByteBuffer(bytes: chunk.bytes), as: chunk.hash, account: account, store: store,
                                         chunks: chunks, clock: clock, makeRoom: makeRoom(ctx.logger))
            metrics.bytesIn.increment(by: Int64(chunk.bytes.count))
        }
    }

    /// The small files' bytes of a batch's commits, stored together (`ChunkUploads.storeAll`):
    /// for each commit, nil or why its bytes were refused.
    private func storeInline(_ commits: [CommitRequest], account: Int64, _ ctx: NimbusContext) async -> [(any Error)?] {
        var out: [(any Error)?] = commits.map { c in InlineChunk.checkCommit(c).map { APIError(.badRequest, $0) } }
        var carried: [(commit: Int, hash: ContentHash, bytes: ByteBuffer)] = []
        for (i, c) in commits.enumerated() where out[i] == nil {
            for chunk in c.inline ?? [] { carried.append((i, chunk.hash, ByteBuffer(bytes: chunk.bytes))) }
        }
        guard !carried.isEmpty else { return out }
        let stored = await ChunkUploads.storeAll(carried.map { ($0.hash, $0.bytes) }, account: account, store: store, chunks: chunks,
                                                 clock: clock, makeRoom: makeRoom(ctx.logger))
        for (c, error) in zip(carried, stored) {
            if let error { out[c.commit] = error } else { metrics.bytesIn.increment(by: Int64(c.bytes.readableBytes)) }
        }
        return out
    }

    func committed(_ c: ContainerRecord, _ r: CommitResponse) {
        metrics.commits.increment()
        if r.outcome == .conflict { metrics.conflicts.increment() }
        notifier.notify(container: c.id, seq: r.cursor)
    }

    /// The named container of the caller's account. Another account's container of the same name
    /// is a different container; one that does not exist for this account is `container_not_found`,
    /// whoever else may have it.
    private func container(_ ctx: NimbusContext, create: Bool = false) async throws -> ContainerRecord {
        let d = try ctx.requireDevice()
        let name = try ctx.parameters.require("container")
        if let problem = ContainerName.problem(name) { throw APIError(.invalidContainerName, problem) }
        let key = "\(d.accountID)/\(name)"
        if let c = containers[key] { return c }
        guard let c = try await store.container(account: d.accountID, name: name, create: create) else {
            throw APIError.containerNotFound(name)
        }
        containers[key] = c
        return c
    }

    /// `decode` for the bodies that carry a chunk list (commits, `chunks/missing`): up to
    /// `maxChunkListBody`. A body larger than an ordinary JSON body (or of no declared length)
    /// is read under a reservation of the bodies in flight, like a chunk: a device cannot make
    /// the server hold many of them at once.
    func decodeChunkList<T: WireChecked & Sendable>(_ type: T.Type, _ req: Request, _ ctx: NimbusContext) async throws -> T {
        let declared = try Self.contentLength(req)
        if let declared, declared > ProtocolLimits.maxChunkListBody {
            throw APIError(.bodyTooLarge, "this body can be at most \(ProtocolLimits.maxChunkListBody) bytes of JSON; split it")
        }
        if let declared, declared <= ProtocolLimits.maxJSONBody { return try await Self.decode(type, req) }
        return try await bodies.withReservation(device: try ctx.requireDevice().id, bytes: declared ?? ProtocolLimits.maxChunkListBody) {
            try await Self.decode(type, req, limit: ProtocolLimits.maxChunkListBody)
        }
    }

    /// Reads, decodes and checks a JSON body: past this point its numbers are in range (WireChecks).
    static func decode<T: WireChecked>(_ type: T.Type, _ req: Request, limit: Int = ProtocolLimits.maxJSONBody) async throws -> T {
        let body = try await req.body.collect(upTo: limit)
        let value: T
        do {
            value = try T.decodeBody(Array(buffer: body))
        } catch {
            if let api = error as? APIError { throw api }
            if case DecodingError.dataCorrupted(let c) = error, c.debugDescription.hasPrefix("invalid name") {
                throw APIError(.invalidName, "\(c.debugDescription); rename the item (names cannot be empty, \".\", \"..\", contain \"/\" or NUL, or exceed 255 bytes)")
            }
            throw APIError(.invalidJSON, "the body is not valid JSON for this request: \(ErrorMiddleware.describe(error))")
        }
        do {
            try value.check()
        } catch {
            throw APIError(error.code, error.message)
        }
        return value
    }

    static func itemID(_ ctx: NimbusContext) throws -> ItemID {
        let s = try ctx.parameters.require("item")
        guard let id = ItemID(s) else { throw APIError(.badRequest, "\(s.prefix(64).debugDescription) is not an item id (a UUID)") }
        return id
    }

    static func hash(_ ctx: NimbusContext) throws -> ContentHash {
        let s = try ctx.parameters.require("hash")
        guard let h = ContentHash(hex: s) else { throw APIError(.badRequest, "a chunk is named by the SHA-256 of its bytes in hex (64 digits)") }
        return h
    }

    /// A chunk upload's size, from its Content-Length: 1 … `maxChunkSize`. The body streams to
    /// the store, which needs its length before the first byte (one plain S3 PUT), so a body
    /// without one (chunked) is refused; so is one over the limit, before a byte of it is read.
    static func chunkSize(_ req: Request) throws -> Int64 {
        guard let declared = try contentLength(req) else {
            if req.headers[.transferEncoding] == nil { throw APIError(.badRequest, "a chunk cannot be empty") }
            throw APIError(.badRequest, "a chunk upload needs its Content-Length (1 … \(ProtocolLimits.maxChunkSize) bytes); send the body with its length, not chunked")
        }
        if declared > ProtocolLimits.maxChunkSize {
            throw APIError(.bodyTooLarge, "a chunk can be at most \(ProtocolLimits.maxChunkSize) bytes; split it")
        }
        guard declared > 0 else { throw APIError(.badRequest, "a chunk cannot be empty") }
        return Int64(declared)
    }

    /// The declared body size, if any; a malformed Content-Length is refused.
    static func contentLength(_ req: Request) throws -> Int? {
        guard let s = req.headers[.contentLength] else { return nil }
        guard let n = Int(s), n >= 0 else { throw APIError(.badRequest, "Content-Length \(s.prefix(32).debugDescription) is not a byte count") }
        return n
    }

    static func intParam(_ req: Request, _ name: String, default value: Int64, range: ClosedRange<Int64>) throws -> Int64 {
        guard let s = req.uri.queryParameters.get(name) else { return value }
        guard let n = Int64(s), range.contains(n) else {
            throw APIError(.invalidParameter, "query parameter \"\(name)\" must be an integer in \(range.lowerBound)…\(range.upperBound)")
        }
        return n
    }
}

/// One HTTP byte range (`bytes=a-b`, `bytes=a-`, `bytes=-n`) resolved against a size.
enum ByteRange {
    static func parse(_ header: String, size: Int64) throws -> Range<Int64> {
        let bad = APIError(.rangeNotSatisfiable, "Range \(header.prefix(80).debugDescription) is not one satisfiable byte range of this \(size)-byte chunk; use bytes=START-END")
        guard header.hasPrefix("bytes="), !header.contains(",") else { throw bad }
        let spec = header.dropFirst(6)
        let parts = spec.split(separator: "-", maxSplits: 1, omittingEmptySubsequences: false)
        guard parts.count == 2 else { throw bad }
        if parts[0].isEmpty {
            guard let n = Int64(parts[1]), n > 0 else { throw bad }
            return max(0, size - n)..<size
        }
        guard let a = Int64(parts[0]), a >= 0, a < size else { throw bad }
        if parts[1].isEmpty { return a..<size }
        guard let b = Int64(parts[1]), b >= a else { throw bad }
        // `b` may be any Int64 (a client may ask for "the rest" with a huge end): clamp before + 1.
        return a..<(b >= size - 1 ? size : b + 1)
    }
}
