import Crypto
import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Testing

/// One token's worst legal load: many commits of one item, each with the most chunk references a
/// version may have. Every answer stays within its page's byte budget and `nimbus serve` stays
/// within a stated memory bound while the journal and the item's history are read.
@Suite struct BoundedAnswerTests {
    /// The server's resident memory at its peak (VmHWM), bytes.
    static func peakMemory(_ pid: Int32) -> Int64 {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
              let kb = Int64(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else { return -1 }
        return kb * 1024
    }

    @Test func aJournalOfHugeRecordsIsAnsweredInBoundedPagesAndMemory() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-bounded-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let add = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "laptop"])
        #expect(add.status == 0, "\(add.stderr)")
        let server = ServerProcess(dataDir: dir)
        defer { server.stop() }
        try await server.start()
        let client = NimbusClient(baseURL: server.url, token: add.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        let container = "load"
        _ = try await client.createContainer(container)
        let bytes: [UInt8] = [42]
        let hash = ContentHash(digest: SHA256.hash(data: bytes))
        try await client.putChunk(hash, bytes)
        let refs = [ChunkRef](repeating: ChunkRef(hash: hash, size: 1), count: ProtocolLimits.maxChunksPerItem)
        let id = ItemID(UUID())
        var base: Int64?
        let commits = 10
        for k in 0..<commits {
            let draft = ItemDraft(kind: .file, parent: .root, name: ItemName(trusted: "big.bin"), chunks: refs, mode: 0o600, modified: Int64(k + 1))
            base = try await client.commit(container, CommitRequest(item: id, baseVersion: base, state: draft)).item.version
        }
        let record = try JSONEncoder().encode(try await client.item(container, id)).count
        let before = Self.peakMemory(server.pid)

        // The journal, a page at a time: each answer within its budget (one record may pass it).
        var since: Int64 = 0
        var seen = 0
        while true {
            let raw = try await client.send(.GET, "/v1/containers/\(container)/changes?since=\(since)&limit=1000")
            #expect(raw.status == 200)
            #expect(raw.body.readableBytes <= ProtocolLimits.maxPageBytes + record + 4096, "a page of \(raw.body.readableBytes) bytes")
            let page = try JSONDecoder().decode(ChangesResponse.self, from: Data(buffer: raw.body))
            seen += page.changes.count
            since = page.cursor
            if !page.more { break }
        }
        #expect(seen == commits, "every commit of the item is in the journal once: \(seen)")
        // The item's history the same way.
        var versions = 0
        var next: Int64?
        repeat {
            let raw = try await client.send(.GET, "/v1/containers/\(container)/items/\(id)/versions" + (next.map { "?before=\($0)" } ?? ""))
            #expect(raw.status == 200)
            #expect(raw.body.readableBytes <= ProtocolLimits.maxPageBytes + record + 4096, "a page of \(raw.body.readableBytes) bytes")
            let page = try JSONDecoder().decode(VersionsResponse.self, from: Data(buffer: raw.body))
            versions += page.versions.count
            next = page.next
        } while next != nil
        #expect(versions >= 2)
        #expect(try await client.versions(container, id).count == versions, "the client pages through them too")
        let peak = Self.peakMemory(server.pid)
        print("bounded answers: record \(record) bytes, server peak memory \(before / 1_048_576) MiB after the commits, \(peak / 1_048_576) MiB after the reads")
        #expect(peak > 0 && peak < 512 * 1_048_576, "server peak memory \(peak / 1_048_576) MiB")
    }
}
