import Crypto
import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Testing

/// The protocol against a live server on 127.0.0.1: authentication, isolation, validation,
/// chunk integrity, limits, long-polls, and that every rejection is a stable code, never a 500.
@Suite struct HTTPTests {
    static let container = "com.example.notes"

    static func error(of r: NimbusClient.RawResponse) throws -> ErrorBody {
        let body = try JSONDecoder().decode(ErrorBody.self, from: Data(buffer: r.body))
        #expect(APIErrorCode(rawValue: body.error.code) != nil, "unknown code \(body.error.code)")
        #expect(!body.error.message.isEmpty)
        return body
    }

    static func draft(_ name: String, chunks: [ChunkRef] = [], kind: ItemKind = .file, parent: ItemID = .root) -> ItemDraft {
        ItemDraft(kind: kind, parent: parent, name: ItemName(trusted: name), chunks: chunks, mode: 0o644, modified: 1_000)
    }

    @Test func healthAndMetricsNeedNoToken() async throws {
        try await LiveServer.with { s in
            let anon = NimbusClient(baseURL: s.url, token: "")
            let h = try await anon.send(.GET, "/healthz", authorized: false)
            #expect(h.status == 200 && h.text == "ok\n")
            let client = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await client.createContainer(Self.container)
            try await client.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("a")))
            let m = try await anon.send(.GET, "/metrics", authorized: false)
            #expect(m.status == 200)
            #expect(m.text.contains("nimbus_commits_total 1"))
            #expect(m.text.contains("nimbus_http_requests_total"))
            #expect(m.text.contains("nimbus_longpolls_waiting"))
            #expect(m.header("Nimbus-Protocol") == "1")
        }
    }

    /// A changes page carries the bytes of its small files (`inline`): live files of one chunk
    /// of at most 64 KiB, their last state only, newest first, at most 16 chunks per page; not a
    /// bigger file, a deleted one or a folder; and nothing of the asking device's own changes.
    @Test func aChangesPageCarriesTheBytesOfItsSmallFiles() async throws {
        try await LiveServer.with { s in
            let client = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await client.createContainer(Self.container)
            var small: [ChunkRef] = []
            for i in 0..<20 {
                let chunk = try await client.upload(Array("small file \(i)\n".utf8))
                small.append(chunk)
                try await client.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("s\(i).txt", chunks: [chunk])))
            }
            let big = try await client.upload([UInt8](repeating: 7, count: ProtocolLimits.inlineFileBytes + 1))
            try await client.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("big.bin", chunks: [big])))
            let gone = ItemID(UUID())
            let goneChunk = try await client.upload(Array("deleted\n".utf8))
            let v = try await client.commit(Self.container, CommitRequest(item: gone, baseVersion: nil, state: Self.draft("gone.txt", chunks: [goneChunk]))).item.version
            var d = Self.draft("gone.txt", chunks: [goneChunk])
            d.deleted = true
            try await client.commit(Self.container, CommitRequest(item: gone, baseVersion: v, state: d))
            try await client.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("folder", kind: .folder)))

            #expect(try await client.changes(Self.container, since: 0).inline == nil, "the writer has its own bytes")
            let reader = NimbusClient(baseURL: s.url, token: try await s.token(device: "phone"))
            let page = try await reader.changes(Self.container, since: 0)
            let inline = page.inline ?? []
            #expect(inline.map(\.hash) == small.suffix(16).reversed().map(\.hash), "the 16 newest small files, newest first")
            for c in inline { #expect(ContentHash(digest: SHA256.hash(data: c.bytes)) == c.hash) }
            #expect(try await reader.changes(Self.container, since: page.cursor).inline == nil, "an empty page carries nothing")
        }
    }

    /// A small file's bytes inside its commit: stored as an upload (hash checked, the account's
    /// own), so other devices can fetch them; bad inline bytes are refused with nothing committed.
    @Test func aCommitCarriesTheBytesOfASmallFile() async throws {
        try await LiveServer.with { s in
            let client = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await client.createContainer(Self.container)
            func inline(_ bytes: [UInt8]) -> (ChunkRef, InlineChunk) {
                let hash = ContentHash(digest: SHA256.hash(data: bytes))
                return (ChunkRef(hash: hash, size: Int64(bytes.count)), InlineChunk(hash: hash, bytes: Data(bytes)))
            }
            func refused(_ r: CommitRequest, _ code: APIErrorCode, _ why: Comment) async throws {
                do {
                    let a = try await client.commit(Self.container, r)
                    Issue.record("committed as v\(a.item.version): \(why)")
                } catch let e as RemoteError {
                    #expect(e.code == code, "\(why): \(e)")
                }
                do {
                    _ = try await client.item(Self.container, r.item)
                    Issue.record("the item exists after a refused commit: \(why)")
                } catch let e as RemoteError { #expect(e.code == .itemNotFound || e.code == .notFound, "\(e)") }
            }

            let (ref, chunk) = inline(Array("one small file\n".utf8))
            let id = ItemID(UUID())
            let r = try await client.commit(Self.container, CommitRequest(item: id, baseVersion: nil, state: Self.draft("small.txt", chunks: [ref]), inline: [chunk]))
            #expect(r.outcome == .applied && r.item.chunks == [ref])
            let phone = NimbusClient(baseURL: s.url, token: try await s.token(device: "phone"))
            #expect(try await phone.getChunk(ref.hash) == Array(chunk.bytes), "another device fetches what came inline")

            let (ref2, chunk2) = inline(Array("another\n".utf8))
            var wrongBytes = chunk2
            wrongBytes.bytes = Data("not the bytes of that hash\n".utf8)
            try await refused(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("a.txt", chunks: [ChunkRef(hash: ref2.hash, size: Int64(wrongBytes.bytes.count))]), inline: [wrongBytes]),
                              .hashMismatch, "bytes that are not the hash's")
            try await refused(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("b.txt", chunks: [ref]), inline: [chunk2]),
                              .badRequest, "an inline chunk the state does not have")
            try await refused(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("c.txt", chunks: [ref2]), inline: [chunk2, chunk2]),
                              .badRequest, "two inline chunks")
            let (bigRef, bigChunk) = inline([UInt8](repeating: 1, count: ProtocolLimits.inlineFileBytes + 1))
            try await refused(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("d.bin", chunks: [bigRef]), inline: [bigChunk]),
                              .badRequest, "more than 64 KiB inline")
            try await refused(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("e.txt", chunks: [ChunkRef(hash: ref2.hash, size: 99)]), inline: [chunk2]),
                              .badRequest, "a size other than the state's")
            try await refused(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("f", kind: .folder), inline: [chunk2]),
                              .badRequest, "inline bytes on a folder")
        }
    }

    /// `POST …/commits`: the commits of one request applied in the order sent, each on its own
    /// (a refused one leaves the others as they would be alone, and is answered with the error it
    /// would have had alone); a batch that is empty, too long or names an item twice is refused
    /// whole, before anything is applied.
    @Test func aBatchAppliesItsCommitsInOrderEachOnItsOwn() async throws {
        try await LiveServer.with { s in
            let client = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await client.createContainer(Self.container)
            func inline(_ text: String) -> (ChunkRef, InlineChunk) {
                let bytes = Array(text.utf8)
                let hash = ContentHash(digest: SHA256.hash(data: bytes))
                return (ChunkRef(hash: hash, size: Int64(bytes.count)), InlineChunk(hash: hash, bytes: Data(bytes)))
            }
            let folder = ItemID(UUID()), inside = ItemID(UUID()), wrong = ItemID(UUID()), orphan = ItemID(UUID()), last = ItemID(UUID())
            let (ref, chunk) = inline("inside the new folder\n")
            var bad = inline("these bytes\n").1
            bad.bytes = Data("other bytes\n".utf8)
            let batch = [
                CommitRequest(item: folder, baseVersion: nil, state: Self.draft("new folder", kind: .folder)),
                CommitRequest(item: inside, baseVersion: nil, state: Self.draft("a.txt", chunks: [ref], parent: folder), inline: [chunk]),
                CommitRequest(item: wrong, baseVersion: nil, state: Self.draft("b.txt", chunks: [ChunkRef(hash: bad.hash, size: Int64(bad.bytes.count))]), inline: [bad]),
                CommitRequest(item: orphan, baseVersion: nil, state: Self.draft("c.txt", parent: ItemID(UUID()))),
                CommitRequest(item: last, baseVersion: nil, state: Self.draft("a.txt", kind: .folder, parent: folder)),
            ]
            let results = try await client.commitBatch(Self.container, batch)
            #expect(results.count == 5)
            #expect((try? results[0].get())?.outcome == .applied, "the folder first")
            #expect((try? results[1].get())?.item.parent == folder, "then the file in it (the folder was there)")
            guard case .failure(let e2) = results[2], case .failure(let e3) = results[3] else {
                Issue.record("refused commits answered: \(results[2]), \(results[3])")
                return
            }
            #expect(e2.code == .hashMismatch, "\(e2)")
            #expect(e3.code == .parentNotFound, "\(e3)")
            if case .server(let status, _, _, _, _) = e3 { #expect(status == APIErrorCode.parentNotFound.httpStatus) }
            let renamed = try results[4].get()
            #expect(renamed.renamed && renamed.item.name.value == "a 2.txt", "the last one saw the file before it: \(renamed.item.name)")
            for (id, there) in [(folder, true), (inside, true), (wrong, false), (orphan, false), (last, true)] {
                let found: Bool
                do { _ = try await client.item(Self.container, id); found = true } catch let e as RemoteError where e.code == .itemNotFound { found = false }
                #expect(found == there, "\(id)")
            }
            let cursor = try await client.changes(Self.container, since: 0).cursor

            // Refused whole: nothing applied.
            func refusedWhole(_ requests: [CommitRequest], _ why: Comment) async throws {
                do {
                    _ = try await client.commitBatch(Self.container, requests)
                    Issue.record("a batch went through: \(why)")
                } catch let e as RemoteError {
                    #expect(e.code == .badRequest, "\(why): \(e)")
                }
            }
            let one = CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("d.txt"))
            try await refusedWhole([], "empty")
            try await refusedWhole([one, one], "the same item twice")
            try await refusedWhole((0...ProtocolLimits.maxBatchCommits).map { i in
                CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("f\(i)"))
            }, "more than \(ProtocolLimits.maxBatchCommits)")
            try await refusedWhole([one, CommitRequest(item: .root, baseVersion: nil, state: Self.draft("root"))], "one of them unacceptable")
            #expect(try await client.changes(Self.container, since: 0).cursor == cursor, "nothing of a refused batch was applied")
            let raw = try await client.send(.POST, "/v1/containers/\(Self.container)/commits", body: ByteBuffer(string: #"{"commits":[{"item":1}]}"#),
                                            contentType: "application/json")
            let body = try Self.error(of: raw)
            #expect(raw.status == 400 && body.error.code == APIErrorCode.invalidJSON.rawValue, "\(raw.text)")
        }
    }

    @Test func requestsWithoutAValidTokenAre401() async throws {
        try await LiveServer.with { s in
            for (token, authorized) in [("", false), ("nim_not-a-real-token", true)] {
                let c = NimbusClient(baseURL: s.url, token: token)
                for path in ["/v1/whoami", "/v1/containers/\(Self.container)", "/v1/containers/\(Self.container)/changes?since=0"] {
                    let r = try await c.send(.GET, path, authorized: authorized)
                    #expect(r.status == 401)
                    #expect(try Self.error(of: r).error.code == "unauthorized")
                }
            }
            let good = NimbusClient(baseURL: s.url, token: try await s.token(account: "alice", device: "laptop"))
            let me = try await good.whoami()
            #expect(me.account == "alice" && me.deviceName == "laptop" && me.protocolVersion == 1)
        }
    }

    @Test func anotherAccountsContainerIs404AndLeaksNothing() async throws {
        try await LiveServer.with { s in
            let alice = NimbusClient(baseURL: s.url, token: try await s.token(account: "alice"))
            let bob = NimbusClient(baseURL: s.url, token: try await s.token(account: "bob"))
            let secret = "com.example.secret"
            _ = try await alice.createContainer(secret)
            let chunk = try await alice.upload(Array("alice's diary".utf8))
            let id = ItemID(UUID())
            try await alice.commit(secret, CommitRequest(item: id, baseVersion: nil, state: Self.draft("diary-entry.txt", chunks: [chunk])))
            for path in ["/v1/containers/\(secret)", "/v1/containers/\(secret)/items", "/v1/containers/\(secret)/items/\(id)",
                         "/v1/containers/\(secret)/items/\(id)/versions", "/v1/containers/\(secret)/changes?since=0",
                         "/v1/chunks/\(chunk.hash)"] {
                let r = try await bob.send(.GET, path)
                #expect(r.status == 404, "\(path)")
                let code = try Self.error(of: r).error.code
                #expect(code == "container_not_found" || code == "chunk_not_found", "\(path): \(code)")
                #expect(!r.text.contains("diary") && !r.text.contains(id.description) && !r.text.contains("alice"))
            }
            #expect(try await bob.missingChunks([chunk.hash]) == [chunk.hash], "bob is told alice's chunk is missing")
            // Bob's container of the same name is his own, and empty.
            _ = try await bob.createContainer(secret)
            #expect(try await bob.items(secret).items.isEmpty)
            #expect(try await alice.items(secret).items.count == 1)
        }
    }

    @Test func hostileNamesAreRejected() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await c.createContainer(Self.container)
            let id = ItemID(UUID())
            func body(nameJSON: String) -> ByteBuffer {
                ByteBuffer(string: """
                    {"item":"\(id)","state":{"kind":"file","parent":"\(ItemID.root)","name":\(nameJSON),"chunks":[],"mode":420,"modified":1,"deleted":false}}
                    """)
            }
            let hostile = ["\"a/b\"", "\"/\"", "\"a\\u0000b\"", "\".\"", "\"..\"", "\"\"", "\"" + String(repeating: "x", count: 256) + "\""]
            for name in hostile {
                let r = try await c.send(.POST, "/v1/containers/\(Self.container)/commit", body: body(nameJSON: name), contentType: "application/json")
                #expect(r.status == 400, "\(name.prefix(20))")
                let e = try Self.error(of: r)
                #expect(e.error.code == "invalid_name", "\(name.prefix(20)): \(e.error.code) \(e.error.message)")
            }
            // Invalid UTF-8 in the body: not JSON at all.
            var raw = ByteBuffer(string: "{\"item\":\"\(id)\",\"state\":{\"kind\":\"file\",\"parent\":\"\(ItemID.root)\",\"name\":\"")
            raw.writeBytes([0xff, 0xfe, 0x41])
            raw.writeString("\",\"chunks\":[],\"mode\":420,\"modified\":1,\"deleted\":false}}")
            let r = try await c.send(.POST, "/v1/containers/\(Self.container)/commit", body: raw, contentType: "application/json")
            #expect(r.status == 400)
            #expect(try Self.error(of: r).error.code == "invalid_json")
            // A lone surrogate escape is not a valid name either.
            let s2 = try await c.send(.POST, "/v1/containers/\(Self.container)/commit", body: body(nameJSON: "\"\\ud800\""), contentType: "application/json")
            #expect(s2.status == 400)
            // Hostile container names.
            for name in ["..", ".hidden", "a%2Fb", "a%00b", String(repeating: "c", count: 256)] {
                let r = try await c.send(.PUT, "/v1/containers/\(name)")
                #expect(r.status == 400 || r.status == 404, "\(name)")
                _ = try Self.error(of: r)
            }
            #expect(try await c.items(Self.container).items.isEmpty, "nothing was created")
        }
    }

    @Test func uploadWithWrongHashIsRejectedAndNotStored() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            let claimed = ChunkHashing.sha256(ByteBuffer(string: "the real bytes"))
            let r = try await c.send(.PUT, "/v1/chunks/\(claimed)", body: ByteBuffer(string: "other bytes"), contentType: "application/octet-stream")
            #expect(r.status == 400)
            #expect(try Self.error(of: r).error.code == "hash_mismatch")
            #expect(try await c.missingChunks([claimed]) == [claimed])
            #expect(!FileManager.default.fileExists(atPath: (s.app.chunks as! DirectoryChunkStore).path(claimed)))
            let get = try await c.send(.GET, "/v1/chunks/\(claimed)")
            #expect(get.status == 404)
            // The right bytes are accepted, and ranges work.
            try await c.putChunk(claimed, Array("the real bytes".utf8))
            #expect(try await c.missingChunks([claimed]).isEmpty)
            #expect(try await c.getChunk(claimed, range: 4..<8) == Array("real".utf8))
            let suffix = try await c.send(.GET, "/v1/chunks/\(claimed)", headers: [("Range", "bytes=-5")])
            #expect(suffix.status == 206 && suffix.text == "bytes" && suffix.header("Content-Range") == "bytes 9-13/14")
            let bad = try await c.send(.GET, "/v1/chunks/\(claimed)", headers: [("Range", "bytes=100-")])
            #expect(bad.status == 416)
            #expect(try Self.error(of: bad).error.code == "range_not_satisfiable")
        }
    }

    @Test func oversizeBodiesAreRejected() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await c.createContainer(Self.container)
            let big = ByteBuffer(repeating: 0x61, count: ProtocolLimits.maxChunkSize + 1)
            let hash = ChunkHashing.sha256(big)
            let r = try await c.send(.PUT, "/v1/chunks/\(hash)", body: big, contentType: "application/octet-stream")
            #expect(r.status == 413)
            #expect(try Self.error(of: r).error.code == "body_too_large")
            // A commit carries a chunk list: up to maxChunkListBody; other JSON up to maxJSONBody.
            let json = ByteBuffer(string: "{\"pad\":\"" + String(repeating: "x", count: ProtocolLimits.maxChunkListBody) + "\"}")
            let r2 = try await c.send(.POST, "/v1/containers/\(Self.container)/commit", body: json, contentType: "application/json")
            #expect(r2.status == 413)
            #expect(try Self.error(of: r2).error.code == "body_too_large")
            let resolve = ByteBuffer(string: "{\"pad\":\"" + String(repeating: "x", count: ProtocolLimits.maxJSONBody) + "\"}")
            let r3 = try await c.send(.POST, "/v1/containers/\(Self.container)/items/\(ItemID(UUID()))/resolve", body: resolve, contentType: "application/json")
            #expect(r3.status == 413)
            #expect(try Self.error(of: r3).error.code == "body_too_large")
            #expect(try await c.missingChunks([hash]) == [hash])
        }
    }

    @Test func longPollWakesWhenAnotherDeviceCommits() async throws {
        try await LiveServer.with { s in
            let a = NimbusClient(baseURL: s.url, token: try await s.token(device: "a"))
            let b = NimbusClient(baseURL: s.url, token: try await s.token(device: "b"))
            let start = try await a.createContainer(Self.container).cursor
            let id = ItemID(UUID())
            let began = ContinuousClock.now
            async let polled = b.changes(Self.container, since: start, wait: 30)
            try await Task.sleep(for: .milliseconds(300))
            try await a.commit(Self.container, CommitRequest(item: id, baseVersion: nil, state: Self.draft("new.txt")))
            let page = try await polled
            let waited = ContinuousClock.now - began
            #expect(page.changes.map(\.item.id) == [id])
            #expect(page.cursor == start + 1)
            // It returned because of the commit, not because the 30 s wait ran out.
            #expect(waited < .seconds(15), "long-poll took \(waited)")
            // A poll with nothing new times out with an empty page at the same cursor.
            let empty = try await b.changes(Self.container, since: page.cursor, wait: 1)
            #expect(empty.changes.isEmpty && empty.cursor == page.cursor)
        }
    }

    /// A device revoked while its long-poll waits gets nothing made after the revocation: the
    /// poll is answered 401 (the token is checked again after the wait), and the revocation
    /// wakes it, so it does not wait out its time.
    @Test func aRevokedDevicesLongPollGetsNothingNew() async throws {
        try await LiveServer.with { s in
            let a = NimbusClient(baseURL: s.url, token: try await s.token(device: "a"))
            let b = NimbusClient(baseURL: s.url, token: try await s.token(device: "b"))
            let start = try await a.createContainer(Self.container).cursor
            let began = ContinuousClock.now
            let polled = Task { try await b.changes(Self.container, since: start, wait: 20) }
            try await Task.sleep(for: .milliseconds(300))
            _ = try await s.app.store.revokeDevice(account: "alice", device: "b", now: 1)
            try await Task.sleep(for: .milliseconds(1_200))  // past the authenticator's recheck
            try await a.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("after-revoke.txt")))
            do {
                let page = try await polled.value
                Issue.record("the revoked device's long-poll was answered with \(page.changes.map(\.item.name.value))")
            } catch let e as RemoteError {
                #expect(e.code == .unauthorized, "\(e)")
            }
            #expect(ContinuousClock.now - began < .seconds(15))
        }
    }

    /// A long-poll with only the asking device's own commits to answer waits (here up to 20 s)
    /// for more of them: a burst of five is one answer. Another device's change ends that wait
    /// at once, and a request that does not wait is never held.
    @Test func aLongPollGathersTheAskersOwnCommitsAndAnswersAnotherDevicesChangeAtOnce() async throws {
        var limits = ServerLimits()
        limits.ownChangesHold = .seconds(20)
        try await LiveServer.with(limits: limits) { s in
            let a = NimbusClient(baseURL: s.url, token: try await s.token(device: "a"))
            let b = NimbusClient(baseURL: s.url, token: try await s.token(device: "b"))
            let start = try await a.createContainer(Self.container).cursor
            let polled = Task { try await a.changes(Self.container, since: start, wait: 40) }
            try await Task.sleep(for: .milliseconds(200))
            for i in 0..<5 {
                try await a.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("own-\(i).txt")))
            }
            let page = try await polled.value
            #expect(page.changes.map(\.item.name.value) == (0..<5).map { "own-\($0).txt" }, "one answer for the burst")

            // Not waiting: answered with a's own change at once.
            let quick = ContinuousClock.now
            #expect(try await a.changes(Self.container, since: start, wait: 0).changes.count == 5)
            #expect(ContinuousClock.now - quick < .seconds(10))

            // a's own commit is held; b's change ends the hold.
            let next = Task { try await a.changes(Self.container, since: page.cursor, wait: 40) }
            try await Task.sleep(for: .milliseconds(200))
            try await a.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("own-5.txt")))
            try await Task.sleep(for: .milliseconds(200))
            let sent = ContinuousClock.now
            try await b.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: Self.draft("from-b.txt")))
            let answer = try await next.value
            #expect(ContinuousClock.now - sent < .seconds(10), "another device's change answers the held poll at once")
            #expect(answer.changes.map(\.item.name.value) == ["own-5.txt", "from-b.txt"])
        }
    }

    /// A revocation made outside the HTTP routes (`nimbus admin revoke-device` writes the
    /// database) answers the revoked device's open long-poll with 401 within a second or so, while
    /// another device's poll waits on.
    @Test func aRevocationAnswersTheRevokedDevicesOpenLongPollAtOnce() async throws {
        try await LiveServer.with { s in
            let a = NimbusClient(baseURL: s.url, token: try await s.token(device: "a"))
            let b = NimbusClient(baseURL: s.url, token: try await s.token(device: "b"))
            let start = try await a.createContainer(Self.container).cursor
            let other = Task { try await a.changes(Self.container, since: start, wait: 5) }
            let polled = Task { try await b.changes(Self.container, since: start, wait: 25) }
            try await Task.sleep(for: .milliseconds(300))
            let revoked = ContinuousClock.now
            _ = try await s.app.store.revokeDevice(account: "alice", device: "b", now: 1)
            do {
                let page = try await polled.value
                Issue.record("the revoked device's long-poll was answered with \(page.changes.count) changes")
            } catch let e as RemoteError {
                #expect(e.code == .unauthorized, "\(e)")
            }
            let answered = ContinuousClock.now - revoked
            #expect(answered < .seconds(3), "answered \(answered) after the revocation")
            let page = try await other.value
            #expect(page.changes.isEmpty)
            #expect(ContinuousClock.now - revoked > .seconds(4), "the other device's poll waited its whole time")
        }
    }

    @Test func malformedRequestsGetStableCodesNever500() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await c.createContainer(Self.container)
            let base = "/v1/containers/\(Self.container)"
            let json = "application/json"
            let cases: [(HTTPVerb, String, String?)] = [
                (.POST, base + "/commit", "not json"),
                (.POST, base + "/commit", "{}"),
                (.POST, base + "/commit", "[1,2,3]"),
                (.POST, base + "/commit", "{\"item\":\"nope\",\"state\":{}}"),
                (.POST, base + "/commit", "{\"item\":\"\(ItemID.root)\",\"state\":{\"kind\":\"file\",\"parent\":\"\(ItemID.root)\",\"name\":\"x\",\"chunks\":[],\"mode\":420,\"modified\":1,\"deleted\":false}}"),
                (.POST, base + "/commit", "{\"item\":\"\(UUID())\",\"state\":{\"kind\":\"weird\",\"parent\":\"\(ItemID.root)\",\"name\":\"x\",\"chunks\":[],\"mode\":420,\"modified\":1,\"deleted\":false}}"),
                (.POST, base + "/commit", "{\"item\":\"\(UUID())\",\"state\":{\"kind\":\"file\",\"parent\":\"\(UUID())\",\"name\":\"x\",\"chunks\":[],\"mode\":420,\"modified\":1,\"deleted\":false}}"),
                (.POST, base + "/commit", "{\"item\":\"\(UUID())\",\"state\":{\"kind\":\"file\",\"parent\":\"\(ItemID.root)\",\"name\":\"x\",\"chunks\":[],\"mode\":99999999,\"modified\":1,\"deleted\":false}}"),
                (.POST, base + "/commit", "{\"item\":\"\(UUID())\",\"state\":{\"kind\":\"file\",\"parent\":\"\(ItemID.root)\",\"name\":\"x\",\"chunks\":[],\"mode\":420,\"modified\":1e400,\"deleted\":false}}"),
                (.POST, base + "/commit", "{\"item\":\"\(UUID())\",\"state\":{\"kind\":\"symlink\",\"parent\":\"\(ItemID.root)\",\"name\":\"x\",\"chunks\":[],\"mode\":420,\"modified\":1,\"deleted\":false}}"),
                (.POST, base + "/items/\(UUID())/resolve", "{\"action\":\"keep_current\"}"),
                (.POST, base + "/items/not-an-id/resolve", "{\"action\":\"keep_current\"}"),
                (.GET, base + "/changes?since=-1", nil),
                (.GET, base + "/changes?since=abc", nil),
                (.GET, base + "/changes?wait=100000", nil),
                (.GET, base + "/items?limit=0", nil),
                (.GET, base + "/items?after=zzz", nil),
                (.GET, "/v1/chunks/xyz", nil),
                (.GET, "/v1/chunks/" + String(repeating: "a", count: 64), nil),
                (.POST, "/v1/chunks/missing", "{\"hashes\":[\"bad\"]}"),
                (.GET, "/v1/nothing-here", nil),
                (.GET, "/v2/containers", nil),
                (.DELETE, base, nil),
                (.GET, "/v1/containers/com.example.none/items", nil),
            ]
            for (method, path, body) in cases {
                let r = try await c.send(method, path, body: body.map { ByteBuffer(string: $0) }, contentType: json)
                #expect((400..<500).contains(r.status), "\(method) \(path) \(body ?? ""): \(r.status) \(r.text)")
                let e = try Self.error(of: r)
                #expect(!e.error.message.contains("Swift") && !e.error.message.contains("/work/"), "internals leaked: \(e.error.message)")
            }
        }
    }

    @Test func commitsAndChangesEndToEnd() async throws {
        try await LiveServer.with { s in
            let a = NimbusClient(baseURL: s.url, token: try await s.token(device: "a"))
            let b = NimbusClient(baseURL: s.url, token: try await s.token(device: "b"))
            _ = try await a.createContainer(Self.container)
            let folder = ItemID(UUID()), file = ItemID(UUID())
            try await a.commit(Self.container, CommitRequest(item: folder, baseVersion: nil, state: Self.draft("Docs", kind: .folder)))
            let bytes = Array(repeating: UInt8(7), count: 100_000)
            let missing = try await a.missingChunks([ChunkHashing.sha256(ByteBuffer(bytes: bytes))])
            #expect(missing.count == 1)
            let chunk = try await a.upload(bytes)
            let r = try await a.commit(Self.container, CommitRequest(item: file, baseVersion: nil, state: Self.draft("big.bin", chunks: [chunk], parent: folder)))
            #expect(r.outcome == .applied && r.item.size == 100_000)
            // Unknown fields in `extra` survive a round trip.
            var d = ItemDraft(r.item)
            d.extra = .object(["com.example.tags": .array([.string("red")]), "future": .number(2)])
            let r2 = try await a.commit(Self.container, CommitRequest(item: file, baseVersion: r.item.version, state: d))
            let seen = try await b.changes(Self.container, since: 0)
            #expect(seen.changes.map(\.kind) == [.create, .create, .update])
            #expect(seen.changes.last?.item.extra == d.extra)
            #expect(try await b.item(Self.container, file).version == r2.item.version)
            #expect(try await b.getChunk(chunk.hash) == bytes)
            let versions = try await b.versions(Self.container, file)
            #expect(versions.count == 2 && versions[0].role == .current && versions[0].deviceName == "a")
        }
    }

    /// With --keep-versions 1 --keep-days 0 the versions listing shows the current version and the
    /// last earlier one; restoring a pruned version answers 404 `version_not_found`.
    @Test func prunedVersionsAreNotListedAndNotRestorable() async throws {
        try await LiveServer.with(history: HistoryRetention(keepVersions: 1, keepDays: 0)!) { s in
            let a = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await a.createContainer(Self.container)
            let file = ItemID(UUID())
            var versions: [Int64] = []
            for i in 0..<3 {
                let chunk = try await a.upload(Array(repeating: UInt8(i + 1), count: 10))
                let r = try await a.commit(Self.container, CommitRequest(item: file, baseVersion: versions.last, state: Self.draft("p.txt", chunks: [chunk])))
                versions.append(r.item.version)
            }
            let listed = try await a.versions(Self.container, file)
            #expect(listed.map(\.version) == [versions[2], versions[1]] && listed.map(\.role) == [.current, .previous], "\(listed)")
            let body = try JSONEncoder().encode(ResolveRequest(action: .restore, version: versions[0]))
            let r = try await a.send(.POST, "/v1/containers/\(Self.container)/items/\(file)/resolve",
                                     body: ByteBuffer(bytes: body), contentType: "application/json")
            #expect(r.status == 404, "\(r.status) \(r.text)")
            #expect(try Self.error(of: r).error.code == APIErrorCode.versionNotFound.rawValue)
            #expect(try await s.app.store.consistencyProblems().isEmpty)
        }
    }
}
