import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The built binary as users run it: `nimbus admin add-device`, `nimbus serve`, SIGKILL in the
/// middle of a burst of commits, restart, and a store that is still whole.
@Suite(.serialized) struct ServerCrashTests {
    static let container = "com.example.crash"

    final class Acks: Sendable {
        let acked = Mutex<[ItemID: Int64]>([:])
        func record(_ id: ItemID, _ v: Int64) { acked.withLock { $0[id] = max($0[id] ?? 0, v) } }
        var all: [ItemID: Int64] { acked.withLock { $0 } }
    }

    @Test func killDuringCommitBurstLeavesAConsistentStore() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-crash-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let add = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "laptop"])
        #expect(add.status == 0, "add-device: \(add.stderr)")
        let token = add.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(token.hasPrefix("nim_") && !token.contains("\n"), "one line with the token")
        let acks = Acks()

        for round in 0..<3 {
            let server = ServerProcess(dataDir: dir)
            defer { server.stop() }
            try await server.start()
            let client = NimbusClient(baseURL: server.url, token: token)
            _ = try await client.createContainer(Self.container)
            try await withThrowingTaskGroup(of: Void.self) { group in
                for worker in 0..<6 {
                    group.addTask {
                        var mine: [(ItemID, Int64)] = []
                        for i in 0..<10_000 {
                            do {
                                let chunk = try await client.upload(Array("round \(round) worker \(worker) step \(i)".utf8))
                                if i % 3 != 0 || mine.isEmpty {
                                    let id = ItemID(UUID())
                                    let r = try await client.commit(Self.container, CommitRequest(item: id, baseVersion: nil, state: ItemDraft(
                                        kind: .file, parent: .root, name: ItemName(trusted: "w\(worker)-\(i).txt"), chunks: [chunk], mode: 0o644, modified: Int64(i))))
                                    acks.record(id, r.item.version)
                                    mine.append((id, r.item.version))
                                } else {
                                    let (id, v) = mine[i % mine.count]
                                    let r = try await client.commit(Self.container, CommitRequest(item: id, baseVersion: v, state: ItemDraft(
                                        kind: .file, parent: .root, name: ItemName(trusted: "w\(worker)-edited-\(i).txt"), chunks: [chunk], mode: 0o600, modified: Int64(i))))
                                    acks.record(id, r.item.version)
                                    mine[i % mine.count] = (id, r.item.version)
                                }
                            } catch {
                                return  // the server is gone
                            }
                        }
                    }
                }
                group.addTask {
                    try await Task.sleep(for: .milliseconds(700 + 300 * round))
                    await server.kill(SIGKILL)
                }
                try await group.waitForAll()
            }
            #expect(server.exitStatus != nil, "server was killed")

            // The store on disk, checked by the binary itself.
            let check = try await NimbusBinary.run(["admin", "check", "--data", dir])
            #expect(check.status == 0 && check.stdout.contains("consistent"), "round \(round): \(check.stdout) \(check.stderr)")

            // And through a restarted server: no gaps, every acknowledged commit present, every chunk readable.
            let again = ServerProcess(dataDir: dir)
            defer { again.stop() }
            try await again.start()
            let c2 = NimbusClient(baseURL: again.url, token: token)
            var since: Int64 = 0
            var seqs: [Int64] = []
            var chunks = Set<ContentHash>()
            while true {
                let page = try await c2.changes(Self.container, since: since, limit: 1000)
                seqs += page.changes.map(\.seq)
                for ch in page.changes { chunks.formUnion(ch.item.chunks.map(\.hash)) }
                since = page.cursor
                if !page.more { break }
            }
            #expect(seqs == Array(1...Int64(max(seqs.count, 1))).prefix(seqs.count).map { $0 }, "journal has no gaps")
            for (id, v) in acks.all {
                let item = try await c2.item(Self.container, id)
                #expect(item.version >= v, "acknowledged commit \(id)@\(v) survived")
            }
            #expect(try await c2.missingChunks(Array(chunks)).isEmpty, "every referenced chunk is stored")
            for h in chunks.prefix(50) { _ = try await c2.getChunk(h) }
            await again.kill(SIGTERM)
            #expect(again.exitStatus != nil)
        }
        #expect(acks.all.count > 10, "the burst committed something before each kill (\(acks.all.count) items)")
    }
}
