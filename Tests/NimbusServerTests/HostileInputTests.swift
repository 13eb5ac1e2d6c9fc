import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A device with a valid token, or anyone who can open a connection, trying to crash, stall,
/// starve or probe the server (docs/security.md "Another account", "A device").
@Suite struct HostileInputTests {
    static let container = "com.example.notes"

    static func code(_ r: NimbusClient.RawResponse) -> String {
        (try? JSONDecoder().decode(ErrorBody.self, from: Data(buffer: r.body)).error.code) ?? "(no error body: \(r.status))"
    }

    static func commitBody(_ id: ItemID, modified: String = "1", mode: String = "420", extra: String? = nil,
                           base: String? = nil, seen: String? = nil) -> ByteBuffer {
        var s = "{\"item\":\"\(id)\""
        if let base { s += ",\"baseVersion\":\(base)" }
        if let seen { s += ",\"seenCursor\":\(seen)" }
        s += ",\"state\":{\"kind\":\"file\",\"parent\":\"\(ItemID.root)\",\"name\":\"f-\(id.description.prefix(8))\",\"chunks\":[],\"mode\":\(mode),\"modified\":\(modified),\"deleted\":false"
        if let extra { s += ",\"extra\":\(extra)" }
        return ByteBuffer(string: s + "}}")
    }

    @Test func aRangeEndingAtInt64MaxIsTheRestOfTheChunk() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            let chunk = try await c.upload(Array("0123456789".utf8))
            for (header, want, range) in [("bytes=0-9223372036854775807", "0123456789", "bytes 0-9/10"),
                                          ("bytes=4-9223372036854775806", "456789", "bytes 4-9/10"),
                                          ("bytes=-9223372036854775807", "0123456789", "bytes 0-9/10"),
                                          ("bytes=9-9", "9", "bytes 9-9/10")] {
                let r = try await c.send(.GET, "/v1/chunks/\(chunk.hash)", headers: [("Range", header)])
                #expect(r.status == 206 && r.text == want && r.header("Content-Range") == range, "\(header): \(r.status) \(r.text)")
            }
            for header in ["bytes=9223372036854775807-", "bytes=0-99999999999999999999", "bytes=--1", "bytes=-0", "bytes=5-4"] {
                let r = try await c.send(.GET, "/v1/chunks/\(chunk.hash)", headers: [("Range", header)])
                #expect(r.status == 416 && Self.code(r) == "range_not_satisfiable", "\(header): \(r.status)")
            }
            #expect(try await c.whoami().account == "alice", "the server is still up")
        }
    }

    @Test func timesOutsideTheProtocolRangeAreRefusedAndRestoreCannotOverflow() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await c.createContainer(Self.container)
            let path = "/v1/containers/\(Self.container)/commit"
            for t in [Int64.max, Int64.min, WireRange.time.upperBound + 1, WireRange.time.lowerBound - 1] {
                let r = try await c.send(.POST, path, body: Self.commitBody(ItemID(UUID()), modified: String(t)), contentType: "application/json")
                #expect(r.status == 400 && Self.code(r) == "invalid_time", "\(t): \(r.status) \(r.text)")
            }
            // The latest time the protocol carries, then a restore (which dates the restored state
            // after the current one): no overflow, and the restored state is current.
            let id = ItemID(UUID())
            let top = WireRange.time.upperBound
            let first = try await c.commit(Self.container, CommitRequest(item: id, baseVersion: nil, state: ItemDraft(
                kind: .file, parent: .root, name: ItemName(trusted: "late.txt"), mode: 0o644, modified: top - 5)))
            let second = try await c.commit(Self.container, CommitRequest(item: id, baseVersion: first.item.version, state: ItemDraft(
                kind: .file, parent: .root, name: ItemName(trusted: "late.txt"), chunks: [try await c.upload([1])], mode: 0o644, modified: top)))
            let restored = try await c.resolve(Self.container, id, ResolveRequest(action: .restore, version: first.item.version))
            #expect(restored.item.modified == top, "a restore dates the state at most at the end of the range")
            #expect(restored.item.chunks.isEmpty && restored.item.version > second.item.version)
            let again = try await c.resolve(Self.container, id, ResolveRequest(action: .restore, version: second.item.version))
            #expect(again.item.modified == top)
            // Versions and cursors out of range.
            let cases: [(String, ByteBuffer, String)] = [
                (path, Self.commitBody(id, base: "0"), "invalid_version"),
                (path, Self.commitBody(id, base: "-9223372036854775808"), "invalid_version"),
                (path, Self.commitBody(id, seen: "-1"), "invalid_cursor"),
                (path, Self.commitBody(id, mode: "4294967295"), "invalid_mode"),
                (path, Self.commitBody(id, base: "9223372036854775808"), "invalid_json"),
                ("/v1/containers/\(Self.container)/items/\(id)/resolve", ByteBuffer(string: "{\"action\":\"restore\",\"version\":-1}"), "invalid_version"),
                ("/v1/containers/\(Self.container)/items/\(id)/resolve", ByteBuffer(string: "{\"action\":\"discard\",\"versions\":[0]}"), "invalid_version"),
            ]
            for (p, body, code) in cases {
                let r = try await c.send(.POST, p, body: body, contentType: "application/json")
                #expect(r.status == 400 && Self.code(r) == code, "\(String(buffer: body)): \(r.status) \(r.text)")
            }
            for q in ["since=-1", "since=9223372036854775808", "limit=9223372036854775807", "wait=-1"] {
                let r = try await c.send(.GET, "/v1/containers/\(Self.container)/changes?\(q)")
                #expect(r.status == 400 && Self.code(r) == "invalid_parameter", "\(q): \(r.status)")
            }
            #expect(try await c.whoami().account == "alice", "the server is still up")
        }
    }

    static func nested(_ depth: Int, leaf: String = "1") -> String {
        var s = leaf
        for i in 0..<depth { s = i % 2 == 0 ? "[\(s)]" : "{\"k\":\(s)}" }
        return s
    }

    @Test func deepOrLargeExtraIsRefusedCheaply() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await c.createContainer(Self.container)
            let path = "/v1/containers/\(Self.container)/commit"
            // At the limit: kept and listed back as sent.
            let okExtra = "{\"x\":\(Self.nested(WireRange.extraDepth - 1))}"
            let id = ItemID(UUID())
            let ok = try await c.send(.POST, path, body: Self.commitBody(id, extra: okExtra), contentType: "application/json")
            #expect(ok.status == 200, "\(ok.text)")
            let listed = try await c.item(Self.container, id)
            #expect(listed.extra?.depth == WireRange.extraDepth)
            // One level deeper, 500 levels, and 10,000 levels: refused with a code, quickly.
            for depth in [WireRange.extraDepth, 500, 10_000] {
                let r = try await c.send(.POST, path, body: Self.commitBody(ItemID(UUID()), extra: "{\"x\":\(Self.nested(depth))}"),
                                         contentType: "application/json")
                #expect(r.status == 400, "depth \(depth): \(r.status)")
                #expect(["invalid_extra", "invalid_json"].contains(Self.code(r)), "depth \(depth): \(r.text.prefix(200))")
            }
            // Not an object; too many bytes.
            let big = "{\"x\":\"" + String(repeating: "y", count: ProtocolLimits.maxExtraBytes) + "\"}"
            for extra in ["[1]", "3", big] {
                let r = try await c.send(.POST, path, body: Self.commitBody(ItemID(UUID()), extra: extra), contentType: "application/json")
                #expect(r.status == 400 && Self.code(r) == "invalid_extra", "\(extra.prefix(20)): \(r.text.prefix(200))")
            }
            #expect(try await c.items(Self.container).items.map(\.id) == [id])
        }
    }

    /// A symlink target longer than Linux allows (4,095 bytes) is refused: another device could
    /// not show it (its readlink would fail with EIO).
    @Test func aSymlinkTargetLongerThanLinuxAllowsIsRefused() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await c.createContainer(Self.container)
            func link(_ bytes: Int) -> CommitRequest {
                CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: ItemDraft(
                    kind: .symlink, parent: .root, name: ItemName(trusted: "l\(bytes)"), symlinkTarget: String(repeating: "a/", count: bytes / 2) + (bytes % 2 == 1 ? "b" : ""),
                    mode: 0o777, modified: 1))
            }
            let ok = try await c.commit(Self.container, link(4095))
            #expect(ok.item.symlinkTarget?.utf8.count == 4095)
            do {
                _ = try await c.commit(Self.container, link(4096))
                Issue.record("a 4,096-byte symlink target was accepted")
            } catch let e as RemoteError {
                #expect(e.code == .badRequest, "\(e)")
            }
        }
    }

    @Test func chunkBodiesInFlightAreBoundedPerDeviceAndOverall() async throws {
        var limits = ServerLimits()
        limits.chunkBodiesPerDevice = 3
        limits.chunkBytesInFlight = 5 * ProtocolLimits.maxChunkSize
        try await LiveServer.with(limits: limits) { s in
            let tokenA = try await s.token(device: "a"), tokenB = try await s.token(device: "b")
            let hash = ContentHash(digest: [UInt8](repeating: 7, count: 32))
            func slowPut(_ token: String) throws -> RawConnection {
                let conn = try RawConnection(s.url)
                conn.send("PUT /v1/chunks/\(hash) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\nContent-Length: \(ProtocolLimits.maxChunkSize)\r\n\r\npartial")
                return conn
            }
            // Device A holds three bodies open: its fourth is refused at once, body unread.
            let held = try (0..<3).map { _ in try slowPut(tokenA) }
            try await Task.sleep(for: .milliseconds(300))
            let fourth = try slowPut(tokenA)
            let refused = fourth.readResponse(timeout: .seconds(10))
            #expect(refused?.status == 503, "\(refused?.text ?? "no answer")")
            #expect(refused?.text.contains("\"busy\"") == true)
            // B may have two more (5 bodies in all), then the server is full for everyone.
            let heldB = try (0..<2).map { _ in try slowPut(tokenB) }
            try await Task.sleep(for: .milliseconds(300))
            let overall = try slowPut(tokenB).readResponse(timeout: .seconds(10))
            #expect(overall?.status == 503 && overall?.text.contains("\"busy\"") == true, "\(overall?.text ?? "no answer")")
            // Abandoned bodies give their reservation back; a normal upload then works.
            for conn in held + heldB { conn.close() }
            let c = NimbusClient(baseURL: s.url, token: tokenA)
            var uploaded = false
            for _ in 0..<50 where !uploaded {
                do { try await c.upload(Array("after".utf8)); uploaded = true } catch { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(uploaded)
        }
    }

    /// The flood that once killed the server: thousands of long-polls opened over real sockets
    /// and dropped at random moments, half-sent requests beside them, while commits wake the
    /// polls, revocations wake them all and the garbage collector runs every second. The server
    /// answers throughout, and once the connections are gone no poll is left registered.
    @Test func aFloodOfDroppedLongPollsLeavesNothingBehind() async throws {
        try await LiveServer.with(configure: { $0.gcInterval = .seconds(1); $0.gcGraceSeconds = 0 }) { s in
            let token = try await s.token(device: "flood")
            let c = NimbusClient(baseURL: s.url, token: token)
            let cursor = try await c.createContainer(Self.container).cursor
            let committer = Task {
                var n: Int64 = 0
                while !Task.isCancelled {
                    n += 1
                    _ = try? await c.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: ItemDraft(
                        kind: .file, parent: .root, name: ItemName(trusted: "f\(n).txt"), mode: 0o644, modified: n)))
                    if n % 40 == 0 { _ = try? await s.app.store.revokeDevice(account: "alice", device: "gone-\(n)", now: n) }
                    if n % 40 == 1 { _ = try? await s.token(device: "gone-\(n + 39)") }
                    try? await Task.sleep(for: .milliseconds(5))
                }
            }
            var rng = SystemRandomNumberGenerator()
            for wave in 0..<8 {
                var open: [RawConnection] = []
                for k in 0..<250 {
                    guard let conn = try? RawConnection(s.url) else { continue }
                    if k % 5 == 0 {
                        _ = conn.send("GET /v1/containers/\(Self.container)/changes?since=\(cursor)&wait=25 HTTP/1.1\r\nHost: x\r\nAuthor")
                    } else {
                        _ = conn.send("GET /v1/containers/\(Self.container)/changes?since=\(Int.random(in: 0...(Int(cursor) + 50), using: &rng))&wait=25 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\n\r\n")
                    }
                    open.append(conn)
                }
                try await Task.sleep(for: .milliseconds(Int.random(in: 0...200, using: &rng)))
                for conn in open.shuffled() { conn.close() }
                // The server still answers between the waves.
                _ = try await c.changes(Self.container, since: 0, limit: 1)
                if wave % 2 == 1 { try await Task.sleep(for: .milliseconds(300)) }
            }
            committer.cancel()
            _ = await committer.value
            let health = try await c.whoami()
            #expect(health.deviceName == "flood")
            // Polls with nothing to wake them, dropped: their waits end with their connections,
            // not at their 25 s timeout.
            let now = try await c.createContainer(Self.container).cursor
            var last: [RawConnection] = []
            for _ in 0..<200 {
                guard let conn = try? RawConnection(s.url) else { continue }
                _ = conn.send("GET /v1/containers/\(Self.container)/changes?since=\(now)&wait=25 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\n\r\n")
                last.append(conn)
            }
            for _ in 0..<50 where s.app.notifier.waitingCount < last.count { try await Task.sleep(for: .milliseconds(100)) }
            #expect(s.app.notifier.waitingCount >= last.count, "the polls are waiting: \(s.app.notifier.waitingCount)")
            for conn in last { conn.close() }
            var left = s.app.notifier.registeredCount
            for _ in 0..<100 where left > 0 {
                try await Task.sleep(for: .milliseconds(100))
                left = s.app.notifier.registeredCount
            }
            #expect(left == 0, "\(left) long-poll entries left after every connection went")
        }
    }

    @Test func halfSentHeadsAndTrickledBodiesAreCut() async throws {
        var limits = ServerLimits()
        limits.idleTimeout = .seconds(1)
        limits.requestReadTimeout = .seconds(2)
        try await LiveServer.with(limits: limits) { s in
            let token = try await s.token()
            // Half a head, no token needed.
            let head = try RawConnection(s.url)
            head.send("GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthor")
            #expect(head.read(timeout: .seconds(8)).closed, "a half-sent head is cut after the idle timeout")
            // A body sent a byte at a time: every byte resets the idle timer, not the request's deadline.
            let body = try RawConnection(s.url)
            body.send("PUT /v1/chunks/\(String(repeating: "a", count: 64)) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\nContent-Length: 100\r\n\r\n")
            var cut = false
            for _ in 0..<40 where !cut {
                if !body.send("x") { cut = true; break }
                cut = body.read(timeout: .milliseconds(250)).closed
            }
            #expect(cut, "a trickled body is cut at the request deadline")
            // A long-poll is not idle: it waits its full time and answers.
            let c = NimbusClient(baseURL: s.url, token: token)
            _ = try await c.createContainer(Self.container)
            let page = try await c.changes(Self.container, since: 1, wait: 3)
            #expect(page.changes.isEmpty)
        }
    }

    @Test func anotherAccountCannotTellThatAChunkExists() async throws {
        try await LiveServer.with { s in
            let alice = NimbusClient(baseURL: s.url, token: try await s.token(account: "alice"))
            let bob = NimbusClient(baseURL: s.url, token: try await s.token(account: "bob"))
            let bytes = Array("alice's private chunk".utf8)
            let chunk = try await alice.upload(bytes)
            let path = (s.app.chunks as! DirectoryChunkStore).path(chunk.hash)
            func inode() -> UInt64 {
                var st = stat()
                return stat(path, &st) == 0 ? UInt64(st.st_ino) : 0
            }
            let first = inode()
            // Alice again (she owns it): nothing to do, the file stays.
            try await alice.putChunk(chunk.hash, bytes)
            #expect(inode() == first)
            // Bob: the same answer as for bytes nobody has, after the same durable write (the
            // file is replaced), so its timing does not tell him either.
            let known = try await bob.send(.PUT, "/v1/chunks/\(chunk.hash)", body: ByteBuffer(bytes: bytes), contentType: "application/octet-stream")
            let fresh = Array("bob's own chunk".utf8)
            let unknown = try await bob.send(.PUT, "/v1/chunks/\(ChunkHashing.sha256(ByteBuffer(bytes: fresh)))", body: ByteBuffer(bytes: fresh),
                                             contentType: "application/octet-stream")
            #expect(known.status == 201 && unknown.status == 201)
            #expect(known.text == unknown.text)
            #expect(inode() != first, "the durable write was done again for an account that did not own the chunk")
            #expect(try await alice.getChunk(chunk.hash) == bytes)
        }
    }

    @Test func aBodyCutShortIsTheClientsErrorNotAnInternalOne() async throws {
        try await LiveServer.with { s in
            let token = try await s.token()
            let c = NimbusClient(baseURL: s.url, token: token)
            _ = try await c.createContainer(Self.container)
            for (method, path) in [("PUT", "/v1/chunks/\(String(repeating: "b", count: 64))"), ("POST", "/v1/containers/\(Self.container)/commit")] {
                let conn = try RawConnection(s.url)
                conn.send("\(method) \(path) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\nContent-Length: 1000\r\n\r\n{\"item\":")
                try await Task.sleep(for: .milliseconds(200))
                conn.close()
            }
            try await Task.sleep(for: .milliseconds(500))
            let lines = s.log.messages
            #expect(!lines.contains { $0.contains("internal error") }, "\(lines)")
            #expect(lines.filter { $0.contains("ended before its body was complete") }.count == 2, "\(lines)")
        }
    }

    @Test func serverDataIsPrivate() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            let chunk = try await c.upload(Array("private".utf8))
            let chunkPath = (s.app.chunks as! DirectoryChunkStore).path(chunk.hash)
            func mode(_ p: String) -> mode_t {
                var st = stat()
                return stat(p, &st) == 0 ? st.st_mode & 0o7777 : 0o7777
            }
            #expect(mode(s.dataDir) == 0o700)
            #expect(mode(s.dataDir + "/metadata.sqlite") == 0o600)
            #expect(mode(s.dataDir + "/chunks") == 0o700)
            #expect(mode(chunkPath) == 0o600)
            #expect(mode((chunkPath as NSString).deletingLastPathComponent) == 0o700)
        }
    }
}
