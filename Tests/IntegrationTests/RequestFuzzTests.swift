import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Synchronization
import Testing

/// The request fuzzer (NimbusTesting/RequestFuzzer) against the built `nimbus serve`, with an
/// innocent device of another account committing beside it. Fails on a crash, on any 5xx other
/// than `busy`, on a well-formed request left unanswered, on an error without a stable code, and
/// on a latency outlier of the innocent device.
///
/// NIMBUS_FUZZ_SEED (default 1) and NIMBUS_FUZZ_REQUESTS (default 3000) set the run;
/// NIMBUS_FUZZ_ONLY=I replays request I of the seed alone. `scripts/fuzz` runs longer.
@Suite struct RequestFuzzTests {
    static let env = ProcessInfo.processInfo.environment

    struct Finding: Sendable, CustomStringConvertible {
        var index: Int
        var what: String
        var request: String
        var description: String { "request \(index): \(what)\n    \(request)" }
    }

    @Test func hostileRequestsNeitherCrashNorStallTheServer() async throws {
        let seed = UInt64(Self.env["NIMBUS_FUZZ_SEED"] ?? "") ?? 1
        let count = Int(Self.env["NIMBUS_FUZZ_REQUESTS"] ?? "") ?? 3000
        let indices: [Int] = Self.env["NIMBUS_FUZZ_ONLY"].flatMap { Int($0) }.map { [$0] } ?? Array(0..<count)
        let replay = "replay: NIMBUS_FUZZ_SEED=\(seed) NIMBUS_FUZZ_ONLY=<request> swift test --filter RequestFuzzTests"

        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-fuzz-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let server = ServerProcess(dataDir: dir)
        defer { server.stop() }
        try await server.start()
        func token(_ account: String) async throws -> String {
            let r = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", account, "--device", "d"])
            guard r.status == 0 else { throw FixtureError("add-device: \(r.stderr)") }
            return r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let fuzzToken = try await token("fuzz"), innocentToken = try await token("innocent")

        // The fuzzer's account: a container, chunks and items for valid requests to reach.
        let fc = NimbusClient(baseURL: server.url, token: fuzzToken)
        let container = "com.example.fuzz"
        _ = try await fc.createContainer(container)
        var chunkBytes: [[UInt8]] = [], chunks: [ChunkRef] = [], items: [ItemID] = []
        for i in 0..<3 {
            let bytes = Array("fuzz chunk \(i) ".utf8) + [UInt8](repeating: UInt8(i), count: 100 * (i + 1))
            chunkBytes.append(bytes)
            chunks.append(try await fc.upload(bytes))
        }
        for i in 0..<5 {
            let id = ItemID(UUID())
            let draft = ItemDraft(kind: i == 0 ? .folder : .file, parent: .root, name: ItemName(trusted: "item\(i)"),
                                  chunks: i == 0 ? [] : [chunks[i % 3]], mode: 0o644, modified: 1_700_000_000_000_000_000)
            _ = try await fc.commit(container, CommitRequest(item: id, baseVersion: nil, state: draft))
            items.append(id)
        }
        // Big legal objects for requests to reach: folders 64 deep, and a file with 60 versions,
        // the last 4 of them with the most chunk references a version may hold.
        var parent = ItemID.root
        for depth in 0..<64 {
            let id = ItemID(UUID())
            _ = try await fc.commit(container, CommitRequest(item: id, baseVersion: nil, state: ItemDraft(
                kind: .folder, parent: parent, name: ItemName(trusted: "deep\(depth)"), mode: 0o755, modified: 1_700_000_000_000_000_000)))
            parent = id
        }
        items.append(parent)
        let versioned = ItemID(UUID())
        var base: Int64? = nil
        for v in 0..<60 {
            let refs = v >= 56 ? [ChunkRef](repeating: chunks[0], count: ProtocolLimits.maxChunksPerItem) : [chunks[v % 3]]
            base = try await fc.commit(container, CommitRequest(item: versioned, baseVersion: base, state: ItemDraft(
                kind: .file, parent: parent, name: ItemName(trusted: "many-versions.bin"), chunks: refs, mode: 0o644,
                modified: 1_700_000_000_000_000_000 + Int64(v)))).item.version
        }
        items.append(versioned)
        let fuzzer = RequestFuzzer(seed: seed, world: .init(token: fuzzToken, container: container, items: items, chunks: chunks, chunkBytes: chunkBytes))

        // The innocent device of another account, timing each of its requests.
        let stop = Atomic<Bool>(false)
        let innocent = Task { () -> (latencies: [Duration], failure: String?) in
            let c = NimbusClient(baseURL: server.url, token: innocentToken)
            let id = ItemID(UUID())
            var version: Int64? = nil
            var latencies: [Duration] = []
            var n: Int64 = 0
            do {
                _ = try await c.createContainer("com.example.innocent")
                while !stop.load(ordering: .relaxed) {
                    n += 1
                    let began = ContinuousClock.now
                    let draft = ItemDraft(kind: .file, parent: .root, name: ItemName(trusted: "notes.txt"), mode: 0o644, modified: 1_700_000_000_000_000_000 + n)
                    version = try await c.commit("com.example.innocent", CommitRequest(item: id, baseVersion: version, state: draft)).item.version
                    _ = try await c.changes("com.example.innocent", since: 0)
                    latencies.append(ContinuousClock.now - began)
                    try await Task.sleep(for: .milliseconds(20))
                }
            } catch {
                return (latencies, "round \(n) failed: \(error)")
            }
            return (latencies, nil)
        }

        // The server's memory, sampled all along: the heaviest legal requests stay under a bound.
        let peakRSS = Atomic<Int>(0)
        let sampler = Thread {
            while !stop.load(ordering: .relaxed) {
                let rss = Self.residentBytes(pid: server.pid)
                if rss > peakRSS.load(ordering: .relaxed) { peakRSS.store(rss, ordering: .relaxed) }
                Thread.sleep(forTimeInterval: 0.1)
            }
        }
        sampler.start()

        // The fuzz workers block on sockets: plain threads, so the task pool stays free.
        let next = Atomic<Int>(0)
        let findings = Mutex<[Finding]>([])
        let workers = 4
        let url = server.url
        let pid = server.pid
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let left = Atomic<Int>(workers)
            for _ in 0..<workers {
                Thread {
                    while true {
                        let k = next.add(1, ordering: .relaxed).oldValue
                        guard k < indices.count, findings.withLock({ $0.count < 10 }) else { break }
                        let i = indices[k]
                        let req = fuzzer.request(i)
                        if let what = Self.send(req, to: url, serverPID: pid) {
                            findings.withLock { $0.append(Finding(index: i, what: what, request: req.description)) }
                        }
                    }
                    if left.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 { done.resume() }
                }.start()
            }
        }
        stop.store(true, ordering: .relaxed)
        let (latencies, innocentFailure) = await innocent.value
        #expect(innocentFailure == nil, "the innocent device: \(innocentFailure ?? "")")
        let found = findings.withLock { $0 }
        #expect(found.isEmpty, "\(found.count) finding(s) with seed \(seed) (\(replay)):\n\(found.map(\.description).joined(separator: "\n"))")
        #expect(server.exitStatus == nil, "nimbus serve died (seed \(seed); \(replay))")
        // The innocent device is never held up by what the fuzzer makes the server do.
        let sorted = latencies.sorted()
        let worst = sorted.last ?? .zero
        let peak = peakRSS.load(ordering: .relaxed)
        print("fuzz: seed \(seed), \(next.load(ordering: .relaxed)) requests tried, \(found.count) findings; innocent device: \(latencies.count) rounds, p50 \(sorted.isEmpty ? .zero : sorted[sorted.count / 2]), max \(worst); server peak RSS \(peak >> 20) MiB")
        #expect(peak > 0 && peak < 512 << 20, "nimbus serve peaked at \(peak >> 20) MiB (bound 512 MiB; seed \(seed))")
        #expect(!latencies.isEmpty)
        #expect(worst < .seconds(2), "the innocent device waited \(worst) for one round while the fuzzer ran (seed \(seed))")
        // And the server still does its job.
        let check = try await NimbusBinary.run(["admin", "check", "--data", dir])
        #expect(check.status == 0, "admin check after fuzzing: \(check.stdout) \(check.stderr)")
    }

    /// The process's resident memory in bytes (0 when it cannot be read).
    static func residentBytes(pid: Int32) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
              let kb = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else { return 0 }
        return kb << 10
    }

    /// Sends one request on its own connection; returns what is wrong with the answer, if anything.
    static func send(_ req: RequestFuzzer.Request, to url: String, serverPID: Int32) -> String? {
        guard let conn = try? RawConnection(url) else {
            return kill(serverPID, 0) == 0 ? "could not connect to a running server" : "the server is gone"
        }
        defer { conn.close() }
        conn.send(req.bytes)
        guard req.wellFormed else {
            // Malformed HTTP: the server may answer 4xx or close; it must not answer 5xx or die.
            let (bytes, _) = conn.read(timeout: .milliseconds(300))
            if let status = Self.status(bytes), status >= 500 { return "answered \(status) to malformed HTTP" }
            return kill(serverPID, 0) == 0 ? nil : "the server died"
        }
        let head = req.bytes.starts(with: Array("HEAD ".utf8))
        guard let r = conn.readResponse(timeout: .seconds(15), toHEAD: head), r.complete else {
            return kill(serverPID, 0) == 0 ? "no complete answer within 15 s" : "the server died"
        }
        if r.status >= 500 {
            let busy = r.status == 503 && r.text.contains("\"code\":\"busy\"")
            if !busy { return "answered \(r.status): \(r.text.prefix(300))" }
        }
        if r.status >= 400, !head, req.script {
            // The script's requests answer JSON that says what happened.
            if case .object(let o)? = try? JSONDecoder().decode(JSONValue.self, from: Data(r.body)), case .string(let m)? = o["error"], !m.isEmpty { return nil }
            if r.text.contains("\"code\":\"not_found\"") || r.text.contains("\"code\":\"method_not_allowed\"") { return nil }
            return "a script's error that is not {\"error\": …}: \(r.text.prefix(300))"
        }
        if r.status >= 400, !head, req.web {
            // The web view's errors are pages that say what happened; an unknown path is the API's 404.
            if r.text.contains("<h1>") || r.text.contains("\"code\":\"not_found\"") || r.text.contains("\"code\":\"method_not_allowed\"") { return nil }
            return "a web error that is not a page: \(r.text.prefix(300))"
        }
        if r.status >= 400, !head {
            guard let e = try? JSONDecoder().decode(ErrorBody.self, from: Data(r.body)), APIErrorCode(rawValue: e.error.code) != nil else {
                return "an error without a stable code: \(r.text.prefix(300))"
            }
        }
        return nil
    }

    static func status(_ bytes: [UInt8]) -> Int? {
        let line = String(decoding: bytes.prefix(20), as: UTF8.self)
        guard line.hasPrefix("HTTP/1.1 ") else { return nil }
        return Int(line.dropFirst(9).prefix(3))
    }
}
