import ContainerFS
import Foundation
import FuseKit
import Glibc
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Testing

/// Small files travel inside the commit that sends them (`CommitRequest.inline`: no chunk
/// request before it) and inside the changes page that carries them (`ChangesResponse.inline`):
/// the other device shows their bytes without asking for the chunk, so it sees an edit half a
/// round trip after the server has it. Two devices on the relay harness and a live server; the server's
/// `nimbus_chunk_bytes_out_total` says whether a chunk was fetched.
@Suite(.serialized) struct InlineContentTests {
    @Test func aSmallFileArrivesWithItsBytesAndABigOneIsFetched() async throws {
        try await RecoveryTests.twoDevices { a, b, client, sim in
            let devices = [a, b]
            let small = String(repeating: "s", count: 1000) + "\n"
            let id = try a.writeFile(node: nil, parent: NodeID.root, name: "small.txt", content: small)
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("small.txt did not reach b: \(why)") }
            // Shown on b with its bytes (settling reads every device's tree): no chunk was asked for.
            let deadline = ContinuousClock.now + .seconds(10)
            while ContinuousClock.now < deadline, b.engine.itemStatus(id) != .current { try await Task.sleep(for: .milliseconds(20)) }
            #expect(b.engine.itemStatus(id) == .current, "b has the bytes of small.txt: \(b.engine.itemStatus(id))")
            #expect(try await Self.chunkBytesOut(client) == 0, "no chunk was fetched for small.txt")
            #expect(await b.tree()?["small.txt"] == small)
            #expect(try await Self.chunkBytesOut(client) == 0, "reading it fetched nothing")
            #expect(try await Self.chunkPuts(client) == 0, "small.txt's bytes went up inside its commit")

            // Over the limit: fetched when read (settling reads it).
            let big = String(repeating: "b", count: ProtocolLimits.inlineFileBytes + 1)
            _ = try a.writeFile(node: nil, parent: NodeID.root, name: "big.txt", content: big)
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("big.txt did not reach b: \(why)") }
            #expect(await b.tree()?["big.txt"] == big)
            #expect(try await Self.chunkBytesOut(client) == Int64(big.utf8.count), "big.txt's chunk was fetched once")
            #expect(try await Self.chunkPuts(client) == 1, "big.txt's chunk was uploaded on its own")

            // An edit of the small file: its new bytes come the same way.
            guard let node = a.fs.localState(id)?.node else { throw SimFailure("a lost small.txt") }
            _ = try a.writeFile(node: node, parent: .absent, name: "small.txt", content: "edited\n")
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the edit did not reach b: \(why)") }
            #expect(await b.tree()?["small.txt"] == "edited\n")
            #expect(try await Self.chunkBytesOut(client) == Int64(big.utf8.count), "the edit came inline")
            #expect(try await Self.chunkPuts(client) == 1, "the edit went up inside its commit")
        }
    }

    /// A burst of small files goes up in a few requests (`CommitBatch`): every file's commit,
    /// far fewer POSTs; the other device shows them all, with their bytes.
    @Test func aBurstOfSmallFilesGoesUpInFewRequests() async throws {
        try await RecoveryTests.twoDevices { a, b, client, sim in
            let before = try await Self.posts(client)
            // Queued while the engine is paused, so the burst is there when it resumes.
            a.engine.setPaused(true)
            let made = try a.fs.mkdir(parent: NodeID.root, name: "burst", mode: 0o755, caller: .process)
            a.fs.forget(node: made.node, count: 1)
            let folder = made.node
            for i in 0..<40 { _ = try a.writeFile(node: nil, parent: folder, name: "f\(i).txt", content: "file \(i)\n") }
            a.engine.setPaused(false)
            if let why = await sim.settle([a, b], client: client, within: .seconds(30)) { throw SimFailure("the burst did not reach b: \(why)") }
            let tree = await b.tree() ?? [:]
            for i in 0..<40 { #expect(tree["burst/f\(i).txt"] == "file \(i)\n", "f\(i).txt on b") }
            let posts = try await Self.posts(client) - before
            #expect(posts >= 1 && posts <= 4, "41 commits in \(posts) requests")
            #expect(try await Self.chunkPuts(client) == 0, "their bytes went inside the commits")
        }
    }

    /// Commit requests the server answered (`POST`, 200; `/metrics`).
    static func posts(_ client: NimbusClient) async throws -> Int {
        let text = try await client.send(.GET, "/metrics", authorized: false).text
        return text.split(separator: "\n").filter { $0.hasPrefix("nimbus_http_requests_total{") && $0.contains("method=\"POST\",status=\"200\"") }
            .compactMap { Int($0.split(separator: " ").last ?? "") }.reduce(0, +)
    }

    /// Chunk uploads the server took (`PUT /v1/chunks/{hash}` answers 201, a container's PUT 200; `/metrics`).
    static func chunkPuts(_ client: NimbusClient) async throws -> Int {
        let text = try await client.send(.GET, "/metrics", authorized: false).text
        return text.split(separator: "\n").filter { $0.hasPrefix("nimbus_http_requests_total{") && $0.contains("method=\"PUT\",status=\"201\"") }
            .compactMap { Int($0.split(separator: " ").last ?? "") }.reduce(0, +)
    }

    /// The server's count of chunk bytes sent (`/metrics`).
    static func chunkBytesOut(_ client: NimbusClient) async throws -> Int64 {
        let text = try await client.send(.GET, "/metrics", authorized: false).text
        let line = text.split(separator: "\n").first { $0.hasPrefix("nimbus_chunk_bytes_out_total ") }
        return line.flatMap { Int64($0.split(separator: " ").last ?? "") } ?? 0
    }
}
