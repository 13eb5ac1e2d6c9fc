import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Testing

/// A file of the largest size the protocol carries (`maxChunksPerItem` chunks) can be asked
/// about and committed: its chunk list fits the body limits of `chunks/missing` and `commit`.
@Suite struct LargeFileProtocolTests {
    static let container = "com.example.large"

    static func hashes(_ n: Int) -> [ContentHash] {
        (0..<n).map { i in ContentHash(hex: String(repeating: "0", count: 48) + String(format: "%016x", i + 1))! }
    }

    @Test func aVersionWithTheMostChunksFitsTheBodyLimits() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await c.createContainer(Self.container)
            let n = ProtocolLimits.maxChunksPerItem
            let all = Self.hashes(n)
            // Every chunk but two is "uploaded" as the smallest chunk there is, the rest stay missing.
            let missing = try await c.missingChunks(all)
            #expect(missing.count == n, "all \(n) unknown")
            let real = try await c.upload(Array("the one real chunk".utf8))
            var refs = all.dropLast().map { ChunkRef(hash: $0, size: 1) }
            refs.append(real)
            let draft = ItemDraft(kind: .file, parent: .root, name: try ItemName("huge.bin"), chunks: refs, mode: 0o644, modified: 1)
            let body = try JSONEncoder().encode(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: draft))
            #expect(body.count > ProtocolLimits.maxJSONBody, "the commit is larger than an ordinary JSON body: \(body.count)")
            let r = try await c.send(.POST, "/v1/containers/\(Self.container)/commit", body: ByteBuffer(bytes: body), contentType: "application/json")
            #expect(r.status == 409 && r.text.contains("missing_chunks"), "read whole and refused for its missing chunks, not its size: \(r.status) \(r.text.prefix(300))")
            // One reference too many, or a body over the limit, is refused clearly.
            var tooMany = draft
            tooMany.chunks.append(ChunkRef(hash: real.hash, size: real.size))
            let r2 = try await c.send(.POST, "/v1/containers/\(Self.container)/commit",
                                      body: ByteBuffer(bytes: try JSONEncoder().encode(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: tooMany))),
                                      contentType: "application/json")
            #expect(r2.status == 400 && r2.text.contains("invalid_size"), "\(r2.status) \(r2.text.prefix(300))")
            let huge = ByteBuffer(repeating: UInt8(ascii: " "), count: ProtocolLimits.maxChunkListBody + 1)
            let r3 = try await c.send(.POST, "/v1/chunks/missing", body: huge, contentType: "application/json")
            #expect(r3.status == 413, "\(r3.status) \(r3.text.prefix(300))")
            #expect(try await c.whoami().account == "alice", "the server is still up")
        }
    }
}
