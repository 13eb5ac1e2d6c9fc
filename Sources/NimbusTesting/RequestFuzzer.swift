import Foundation
import NimbusCore
import NimbusProtocol

/// Seeded requests over every route of protocol v1: valid requests, the same with one field
/// replaced by a hostile value (extreme numbers, deep nesting, odd names, wrong types), byte-level
/// mutations, and HTTP-level abuse (a short body, a lying Content-Length, garbage). Among the valid
/// ones, the biggest legal objects: commits of the most chunk references a version may hold (one
/// owned chunk 50,000 times, about 4 MB of JSON) and names of the longest legal length, into the
/// world's deep folders and items with many versions. Request `i` of
/// seed `s` depends on nothing else, so any request of a run is replayed from `(s, i)` alone.
public struct RequestFuzzer: Sendable {
    /// What the fuzzer knows of its account, so valid requests reach past the first checks.
    public struct World: Sendable {
        public var token: String
        public var container: String
        public var items: [ItemID]
        public var chunks: [ChunkRef]
        public var chunkBytes: [[UInt8]]
        public init(token: String, container: String, items: [ItemID], chunks: [ChunkRef], chunkBytes: [[UInt8]]) {
            self.token = token
            self.container = container
            self.items = items
            self.chunks = chunks
            self.chunkBytes = chunkBytes
        }
    }

    /// One request as bytes, and whether it is well-formed HTTP (so it must get an answer).
    public struct Request: Sendable, CustomStringConvertible {
        public var bytes: [UInt8]
        public var wellFormed: Bool
        /// A request to the web view (`/`, `/web/…`): its errors are HTML pages, not JSON.
        public var web = false
        /// A request of the web view's script (`…/upload`, `…/changes`): its errors are JSON
        /// `{"error": "…"}`.
        public var script: Bool {
            let line = String(decoding: bytes.prefix(while: { $0 != UInt8(ascii: "\r") }), as: UTF8.self)
            return web && line.hasPrefix("POST /web/c/") && line.contains("/upload") || web && line.hasPrefix("GET /web/c/") && line.contains("/changes")
        }
        public var description: String {
            let text = String(decoding: bytes.prefix(600), as: UTF8.self)
            return text.debugDescription + (bytes.count > 600 ? " … (\(bytes.count) bytes)" : "")
        }
    }

    public let seed: UInt64
    public let world: World

    public init(seed: UInt64, world: World) {
        self.seed = seed
        self.world = world
    }

    public func request(_ index: Int) -> Request {
        // One request in 30 goes to the web view, drawn from a stream of its own: the API
        // requests of a seed are the same with or without it.
        var webRng = SplitMix64(seed: (seed ^ 0x5745_4256_4945_5721) &* 0x9E37_79B9_7F4A_7C15 ^ UInt64(index) &* 0x94D0_49BB_1331_11EB)
        if webRng.chance(1.0 / 30) { return webRequest(&webRng) }
        var rng = SplitMix64(seed: seed &* 0x9E37_79B9_7F4A_7C15 ^ UInt64(index) &* 0xBF58_476D_1CE4_E5B9)
        var method: String
        var path: String
        var headers: [(String, String)] = []
        var body: [UInt8]? = nil
        let (c, item) = target(&rng)
        switch rng.next() % 14 {
        case 0: (method, path) = ("GET", pick(["/healthz", "/metrics", "/v1/whoami", "/v2/whoami", "/v1/", "/"], &rng))
        case 1: (method, path) = (pick(["PUT", "GET"], &rng), "/v1/containers/\(c)")
        case 2: (method, path) = ("GET", "/v1/containers/\(c)/items?\(query(["after": item, "limit": number(&rng)], &rng))")
        case 3: (method, path) = ("GET", "/v1/containers/\(c)/items/\(item)")
        case 4: (method, path) = ("GET", "/v1/containers/\(c)/items/\(item)/versions")
        case 5:
            (method, path) = ("POST", "/v1/containers/\(c)/commit")
            body = json(commitBody(&rng), &rng)
        case 6:
            // A batch: none, a few (one of them maybe twice), or one too many.
            (method, path) = ("POST", "/v1/containers/\(c)/commits")
            let n = rng.chance(0.05) ? 65 : Int(rng.next() % 5)
            var commits = (0..<n).map { _ in commitBody(&rng) }
            if let first = commits.first, rng.chance(0.1) { commits.append(first) }
            body = json(.object([("commits", .array(commits))]), &rng)
        case 7:
            (method, path) = ("POST", "/v1/containers/\(c)/items/\(item)/resolve")
            body = json(resolveBody(&rng), &rng)
        case 8:
            let wait = rng.chance(0.9) ? pick(["0", "0", "0", "0", "1"], &rng) : number(&rng)
            (method, path) = ("GET", "/v1/containers/\(c)/changes?\(query(["since": number(&rng), "wait": wait, "limit": number(&rng)], &rng))")
        case 9:
            (method, path) = ("POST", "/v1/chunks/missing")
            body = json(.object([("hashes", .array((0..<Int(rng.next() % 4)).map { _ in .string(hash(&rng)) }))]), &rng)
        case 10:
            let i = Int(rng.next() % UInt64(max(1, world.chunkBytes.count)))
            let bytes = world.chunkBytes.isEmpty ? [1] : world.chunkBytes[i]
            (method, path) = ("PUT", "/v1/chunks/\(rng.chance(0.7) && !world.chunks.isEmpty ? world.chunks[i].hash.hex : hash(&rng))")
            body = rng.chance(0.8) ? bytes : mutate(bytes, &rng)
        case 11:
            (method, path) = ("GET", "/v1/chunks/\(element(world.chunks, &rng)?.hash.hex ?? hash(&rng))")
            headers.append(("Range", "bytes=\(rng.chance(0.3) ? "" : number(&rng))-\(rng.chance(0.3) ? "" : number(&rng))"))
        case 12:
            // Recently Deleted: the listing with hostile paging, an entry's items, restore, purge.
            switch rng.next() % 5 {
            case 0: (method, path) = ("GET", "/v1/containers/\(c)/trash?\(query(["after": pick(["\(number(&rng)).\(item)", item, "1.", ".x", ""], &rng), "limit": number(&rng)], &rng))")
            case 1: (method, path) = ("GET", "/v1/containers/\(c)/trash/\(item)/items?\(query(["after": item], &rng))")
            case 2:
                (method, path) = ("POST", "/v1/containers/\(c)/trash/\(item)/restore")
                body = json(.object(rng.chance(0.5) ? [] : [("to", .string(rng.chance(0.7) ? (element(world.items, &rng)?.description ?? "x") : pick(Self.hostileSegments, &rng)))]), &rng)
            case 3: (method, path) = ("DELETE", "/v1/containers/\(c)/trash/\(item)")
            default: (method, path) = ("DELETE", "/v1/containers/\(c)/trash")
            }
        default:
            (method, path) = (pick(["DELETE", "PATCH", "OPTIONS", "HEAD", "GET"], &rng), pick(["/v1/containers/\(c)", "/v1/chunks", "/v1/containers/\(c)/commit", "/v1/containers/\(c)/commits"], &rng))
        }
        if rng.chance(0.05) { method = pick(["GET", "POST", "PUT", "DELETE"], &rng) }
        var authorization = "Bearer \(world.token)"
        if rng.chance(0.05) { authorization = pick(["", "Bearer ", "Bearer nim_unknown", "Basic abc", "Bearer " + String(repeating: "A", count: 5000)], &rng) }
        headers.append(("Authorization", authorization))
        return http(method, path, headers, body, &rng)
    }

    /// A request to the web view, signed in with the fuzzer's token as its cookie (or a hostile
    /// one): pages with hostile paging, downloads with hostile ranges, form posts without the
    /// session's CSRF value (refused: the fuzzer never signs itself out), sign-in codes.
    private func webRequest(_ rng: inout SplitMix64) -> Request {
        var (method, path) = ("GET", "/")
        var headers: [(String, String)] = []
        var body: [UInt8]? = nil
        let (c, item) = target(&rng)
        let folder = rng.chance(0.8) ? item : pick(Self.hostileSegments, &rng)
        switch rng.next() % 10 {
        case 0: (method, path) = ("GET", pick(["/", "/web/devices", "/web/style.css", "/web/", "/web/c/", "/web/app.js", "/web/usage", "/web/c/\(c)/trash"], &rng))
        case 1: (method, path) = ("GET", "/web/c/\(c)?\(query(["folder": folder, "after": pick(Self.hostileSegments + ["", "a"], &rng)], &rng))")
        case 2:
            (method, path) = ("GET", "/web/c/\(c)/file/\(item)")
            if rng.chance(0.7) { headers.append(("Range", "bytes=\(rng.chance(0.3) ? "" : number(&rng))-\(rng.chance(0.3) ? "" : number(&rng))")) }
        case 3:
            (method, path) = ("POST", "/web/sign-in")
            body = Array("code=\(pick(["AAAA-AAAA-AAAA", "", "%00", String(repeating: "A", count: 20_000), hash(&rng)], &rng))".utf8)
        case 4:
            (method, path) = ("POST", pick(["/web/sign-out", "/web/devices/d/revoke", "/web/devices/\(pick(Self.hostileSegments, &rng))/revoke",
                                              "/web/c/\(c)/new-folder", "/web/c/\(c)/items/\(item)/rename", "/web/c/\(c)/items/\(item)/delete"], &rng))
            body = Array("csrf=\(rng.chance(0.5) ? hash(&rng) : "")&version=\(number(&rng))&cursor=\(number(&rng))&name=\(pick(Self.hostileSegments, &rng))&folder=\(item)".utf8)
            if rng.chance(0.5) { headers.append(("Origin", pick(["http://evil.example", "null", "http://fuzz"], &rng))) }
        case 6:
            // Pages of an item (versions, moving) and of Recently Deleted, with hostile paging;
            // the live wait only where it answers at once (a cursor behind, or a hostile one).
            (method, path) = ("GET", pick(["/web/c/\(c)/items/\(item)?\(query(["before": number(&rng)], &rng))",
                                           "/web/c/\(c)/items/\(item)/move?\(query(["to": folder, "after": pick(Self.hostileSegments, &rng)], &rng))",
                                           "/web/c/\(c)/trash?\(query(["after": pick(Self.hostileSegments + ["1.\(item)"], &rng)], &rng))",
                                           "/web/c/\(c)/file/\(item)?\(query(["version": number(&rng)], &rng))",
                                           "/web/c/\(c)/changes?since=\(pick(["0", "-1", "abc", "", "99999999999999999999"], &rng))"], &rng))
        case 7:
            // An upload, mostly without the page's CSRF header (refused), with hostile names,
            // folders, kinds and lengths.
            (method, path) = ("POST", "/web/c/\(c)/upload?\(query(["folder": folder, "name": pick(Self.hostileSegments + ["a.txt"], &rng), "kind": pick(["file", "folder", "", "link"], &rng)], &rng))")
            body = rng.chance(0.7) ? Array(repeating: UInt8(ascii: "x"), count: Int(rng.next() % 4096)) : nil
            headers.append(("X-Nimbus-CSRF", rng.chance(0.5) ? hash(&rng) : ""))
            if rng.chance(0.5) { headers.append(("Origin", pick(["http://evil.example", "null", "http://fuzz"], &rng))) }
        case 8:
            (method, path) = ("POST", pick(["/web/c/\(c)/items/\(item)/resolve", "/web/c/\(c)/items/\(item)/move", "/web/c/\(c)/trash/\(item)/restore",
                                            "/web/c/\(c)/trash/\(item)/purge", "/web/c/\(c)/trash/purge", "/web/devices/pairing"], &rng))
            body = Array("csrf=\(rng.chance(0.5) ? hash(&rng) : "")&action=\(pick(["restore", "keep_version", "keep_current", "discard", "x"], &rng))&version=\(number(&rng))&to=\(folder)&name=\(pick(Self.hostileSegments, &rng))".utf8)
            if rng.chance(0.5) { headers.append(("Origin", pick(["http://evil.example", "null", "http://fuzz"], &rng))) }
        default: (method, path) = (pick(["GET", "POST", "PUT", "DELETE"], &rng), "/web/c/\(c)/file/\(pick(Self.hostileSegments, &rng))")
        }
        let cookie = rng.chance(0.85) ? "nimbus_web=\(world.token)" : pick(["nimbus_web=", "nimbus_web=nim_unknown", "a=b; nimbus_web=\(String(repeating: "A", count: 5000))", "nimbus_web"], &rng)
        headers.append(("Cookie", cookie))
        var r = http(method, path, headers, body, form: true, &rng)
        r.web = true
        return r
    }

    /// The container and item a request names: mostly the world's, sometimes hostile.
    private func target(_ rng: inout SplitMix64) -> (container: String, item: String) {
        let c = rng.chance(0.9) ? world.container : pick(Self.hostileSegments, &rng)
        let item = rng.chance(0.85) ? (element(world.items, &rng)?.description ?? "x") : pick(Self.hostileSegments, &rng)
        return (c, item)
    }

    // MARK: HTTP

    private func http(_ method: String, _ path: String, _ headers: [(String, String)], _ body: [UInt8]?, form: Bool = false,
                      _ rng: inout SplitMix64) -> Request {
        var wellFormed = true
        var declared = body.map { String($0.count) }
        var sent = body ?? []
        if body != nil, rng.chance(0.03) {
            // A lying Content-Length: more than is sent (the server waits, then the client closes).
            declared = String((body?.count ?? 0) + 10)
            wellFormed = false
        }
        if rng.chance(0.02) {
            sent = Array(sent.prefix(sent.count / 2))
            wellFormed = false
        }
        var head = "\(method) \(path) HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n"
        for (k, v) in headers where !v.isEmpty { head += "\(k): \(v)\r\n" }
        if let declared { head += "Content-Length: \(declared)\r\nContent-Type: \(form ? "application/x-www-form-urlencoded" : "application/json")\r\n" }
        head += "\r\n"
        var bytes = Array(head.utf8) + sent
        if rng.chance(0.02) {
            bytes = mutate(bytes, &rng)  // garbage at the HTTP level
            wellFormed = false
        }
        return Request(bytes: bytes, wellFormed: wellFormed)
    }

    private func query(_ params: [String: String], _ rng: inout SplitMix64) -> String {
        params.sorted { $0.key < $1.key }.filter { _ in rng.chance(0.7) }
            .map { "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")" }.joined(separator: "&")
    }

    // MARK: bodies

    /// A JSON tree with sorted keys, so a run is the same on every machine.
    indirect enum Tree {
        case raw(String)
        case string(String)
        case array([Tree])
        case object([(String, Tree)])

        var text: String {
            switch self {
            case .raw(let s): return s
            case .string(let s): return Self.quote(s)
            case .array(let a): return "[" + a.map(\.text).joined(separator: ",") + "]"
            case .object(let o): return "{" + o.map { Self.quote($0.0) + ":" + $0.1.text }.joined(separator: ",") + "}"
            }
        }

        static func quote(_ s: String) -> String {
            var out = "\""
            for u in s.unicodeScalars {
                switch u {
                case "\"": out += "\\\""
                case "\\": out += "\\\\"
                case _ where u.value < 0x20: out += String(format: "\\u%04x", u.value)
                default: out.unicodeScalars.append(u)
                }
            }
            return out + "\""
        }
    }

    private func commitBody(_ rng: inout SplitMix64) -> Tree {
        let kind = pick(["file", "folder", "symlink"], &rng)
        var chunks: [Tree] = []
        if kind == "file", rng.chance(0.03), let c = element(world.chunks, &rng) {
            // The most references a version may hold: legal, and the heaviest record there is.
            let ref = Tree.object([("hash", .string(c.hash.hex)), ("size", .raw(String(c.size)))])
            chunks = Array(repeating: ref, count: ProtocolLimits.maxChunksPerItem)
        } else if kind == "file" {
            for _ in 0..<Int(rng.next() % 3) {
                if let c = element(world.chunks, &rng) {
                    chunks.append(.object([("hash", .string(c.hash.hex)), ("size", .raw(String(c.size)))]))
                }
            }
        }
        var state: [(String, Tree)] = [
            ("kind", .string(kind)), ("parent", .string(rng.chance(0.8) ? ItemID.root.description : (element(world.items, &rng)?.description ?? ""))),
            ("name", .string(rng.chance(0.8) ? "f\(rng.next() % 20).txt"
                             : rng.chance(0.3) ? "L\(rng.next() % 10)" + String(repeating: "n", count: 253) : pick(Self.hostileNames, &rng))),
            ("chunks", .array(chunks)), ("mode", .raw(rng.chance(0.8) ? "420" : number(&rng))),
            ("modified", .raw(rng.chance(0.7) ? String(1_700_000_000_000_000_000 + Int64(rng.next() % 1_000_000)) : number(&rng))),
            ("deleted", .raw(rng.chance(0.85) ? "false" : "true")),
        ]
        if kind == "symlink" { state.append(("symlinkTarget", .string(rng.chance(0.8) ? "target" : pick(Self.hostileNames, &rng)))) }
        if rng.chance(0.3) { state.append(("extra", extra(&rng))) }
        var fields: [(String, Tree)] = [
            ("item", .string(rng.chance(0.5) ? (element(world.items, &rng)?.description ?? "") : UUID(rng: &rng).uuidString)),
            ("state", .object(state)),
        ]
        if rng.chance(0.6) { fields.append(("baseVersion", .raw(rng.chance(0.6) ? String(1 + rng.next() % 60) : number(&rng)))) }
        if rng.chance(0.2) { fields.append(("seenCursor", .raw(number(&rng)))) }
        return .object(fields)
    }

    private func resolveBody(_ rng: inout SplitMix64) -> Tree {
        var fields: [(String, Tree)] = [("action", .string(pick(["keep_current", "keep_version", "discard", "restore", "nope"], &rng)))]
        if rng.chance(0.6) { fields.append(("version", .raw(rng.chance(0.5) ? String(1 + rng.next() % 60) : number(&rng)))) }
        if rng.chance(0.4) { fields.append(("versions", .array((0..<Int(rng.next() % 4)).map { _ in .raw(number(&rng)) }))) }
        return .object(fields)
    }

    private func extra(_ rng: inout SplitMix64) -> Tree {
        switch rng.next() % 5 {
        case 0: return .object([("app", .string("notes")), ("n", .raw(number(&rng)))])
        case 1:
            var t = Tree.raw("1")
            for i in 0..<Int(1 + rng.next() % 800) { t = i % 2 == 0 ? .array([t]) : .object([("k", t)]) }
            return .object([("deep", t)])
        case 2: return .object([("big", .string(String(repeating: "x", count: Int(rng.next() % 40_000))))])
        case 3: return .raw(pick(["[]", "1", "null", "\"s\"", "true"], &rng))
        default: return .object((0..<Int(rng.next() % 50)).map { ("k\($0)", .raw(number(&rng))) })
        }
    }

    /// `tree` as JSON, sometimes with one value replaced by a hostile one or a key dropped.
    private func json(_ tree: Tree, _ rng: inout SplitMix64) -> [UInt8] {
        var t = tree
        if rng.chance(0.5) { t = replaceOne(t, &rng) }
        var bytes = Array(t.text.utf8)
        if rng.chance(0.08) { bytes = mutate(bytes, &rng) }
        return bytes
    }

    private func replaceOne(_ tree: Tree, _ rng: inout SplitMix64) -> Tree {
        switch tree {
        case .object(var o) where !o.isEmpty:
            let i = Int(rng.next() % UInt64(o.count))
            if rng.chance(0.15) { o.remove(at: i); return .object(o) }
            o[i].1 = rng.chance(0.5) ? replaceOne(o[i].1, &rng) : hostileValue(&rng)
            return .object(o)
        case .array(var a) where !a.isEmpty:
            let i = Int(rng.next() % UInt64(a.count))
            a[i] = rng.chance(0.5) ? replaceOne(a[i], &rng) : hostileValue(&rng)
            return .array(a)
        default:
            return hostileValue(&rng)
        }
    }

    private func hostileValue(_ rng: inout SplitMix64) -> Tree {
        switch rng.next() % 4 {
        case 0: return .raw(number(&rng))
        case 1: return .string(pick(Self.hostileNames, &rng))
        case 2: return .raw(pick(["null", "true", "[]", "{}", "\"\"", "[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]"], &rng))
        default: return .raw(String(repeating: "[", count: 600) + String(repeating: "]", count: 600))
        }
    }

    private func mutate(_ bytes: [UInt8], _ rng: inout SplitMix64) -> [UInt8] {
        var b = bytes
        for _ in 0..<Int(1 + rng.next() % 4) {
            guard !b.isEmpty else { return [UInt8(truncatingIfNeeded: rng.next())] }
            let i = Int(rng.next() % UInt64(b.count))
            switch rng.next() % 4 {
            case 0: b[i] = UInt8(truncatingIfNeeded: rng.next())
            case 1: b.remove(at: i)
            case 2: b.insert(pick([0, 0xff, 0x22, 0x5c, 0x7b, 0x5b, 0x0a, 0x0d], &rng), at: i)
            default: b = Array(b.prefix(i))
            }
        }
        return b
    }

    // MARK: values

    static let numbers = ["0", "1", "-1", "9223372036854775807", "-9223372036854775808", "9223372036854775808",
                          "-9223372036854775809", "18446744073709551615", "1e400", "-1e400", "1.5", "1e3", "0x10",
                          "4294967295", "4095", "65535", "9007199254740993", "00", "-0", "\"1\"", "null", "[]", "NaN"]
    static let hostileNames = ["", ".", "..", "a/b", "/", "a\u{0}b", "e\u{301}", "\u{e9}", String(repeating: "n", count: 256),
                               String(repeating: "\u{e9}", count: 128), "\u{202e}txt.exe", "line\nbreak", ".nimbus", "\u{feff}",
                               "con", "x\u{7f}", "😀"]
    static let hostileSegments = ["..", "%2e%2e", "%00", "com.example.other", ".hidden", "a%2Fb", String(repeating: "c", count: 300),
                                  "00000000-0000-0000-0000-000000000000", "not-an-id", "%ff%fe", "x%20y", ""]

    private func number(_ rng: inout SplitMix64) -> String {
        rng.chance(0.7) ? pick(Self.numbers, &rng) : String(Int64(bitPattern: rng.next()))
    }

    private func hash(_ rng: inout SplitMix64) -> String {
        if rng.chance(0.2) { return pick(["", "xyz", String(repeating: "A", count: 64), String(repeating: "0", count: 65)], &rng) }
        return (0..<4).map { _ in String(format: "%016llx", rng.next()) }.joined()
    }

    private func pick<T>(_ options: [T], _ rng: inout SplitMix64) -> T { options[rng.below(options.count)] }
    private func element<T>(_ options: [T], _ rng: inout SplitMix64) -> T? { options.isEmpty ? nil : pick(options, &rng) }
}

extension SplitMix64 {
    /// True with probability `p`.
    public mutating func chance(_ p: Double) -> Bool { Double(next() >> 11) / Double(1 << 53) < p }
}

extension UUID {
    init(rng: inout SplitMix64) {
        let a = rng.next(), b = rng.next()
        var bytes = (0..<8).map { UInt8(truncatingIfNeeded: a >> ($0 * 8)) } + (0..<8).map { UInt8(truncatingIfNeeded: b >> ($0 * 8)) }
        bytes[6] = (bytes[6] & 0x0f) | 0x40
        bytes[8] = (bytes[8] & 0x3f) | 0x80
        self = UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
                           bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
    }
}
