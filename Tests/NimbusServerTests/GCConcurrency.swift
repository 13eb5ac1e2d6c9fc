import Foundation
import NimbusCore
import NimbusProtocol
import NimbusServer
import NimbusTesting
import Testing

/// Two stores on one database (two `nimbus serve` instances, or a server and `nimbus admin gc`)
/// collecting at once, over one chunk store.
enum GCConcurrency {
    static let s: Int64 = 1_000_000_000

    static func twoCollectors(_ one: any ServerStore, _ two: any ServerStore, chunks: CountingChunkStore) async throws {
        let f = try await StoreFixture.make(one)
        let g = GCFixture(f: f, chunks: chunks)

        // Whole collections at once: each garbage chunk is deleted once, nothing referenced is.
        var garbage: [ChunkRef] = [], kept: [ChunkRef] = []
        for i in 0..<40 { garbage.append(try await g.upload("garbage-\(i)", now: 0)) }
        for i in 0..<10 { kept.append(try await g.upload("kept-\(i)", now: 0)) }
        for (i, c) in kept.enumerated() { _ = try await f.create(.file, "k\(i)", chunks: [c]) }
        let now = 2 * 3_600 * s
        async let ra = ChunkCollector(store: one, chunks: chunks, graceSeconds: 3_600).run(now: now)
        async let rb = ChunkCollector(store: two, chunks: chunks, graceSeconds: 3_600).run(now: now)
        let (a, b) = try await (ra, rb)
        let again = try await ChunkCollector(store: two, chunks: chunks, graceSeconds: 3_600).run(now: now)
        #expect(a.chunks + b.chunks + again.chunks == garbage.count, "\(a); \(b); \(again)")
        #expect(a.bytes + b.bytes + again.bytes == garbage.reduce(0) { $0 + $1.size })
        let counted = chunks.deletions.withLock { $0 }
        #expect(counted == Dictionary(uniqueKeysWithValues: garbage.map { ($0.hash, 1) }), "each garbage chunk deleted once: \(counted.values.sorted())")
        for c in garbage { try await g.expect(c, stored: false, ownedBy: nil) }
        for c in kept { try await g.expect(c, stored: true, ownedBy: f.a) }
        try await g.checkConsistent("after two collections at once")

        // Sweeps at once without the collector lock (its row and hash locks alone), while commits
        // through both stores refer to some of the candidates and others are uploaded again.
        chunks.deletions.withLock { $0 = [:] }
        var candidates: [ChunkRef] = []
        for i in 0..<60 { candidates.append(try await g.upload("candidate-\(i)", now: 10_000 * s)) }
        let cutoff = 10_000 * s, later = 13_600 * s
        let markOne = try await one.markChunks(staleAt: cutoff), markTwo = try await two.markChunks(staleAt: cutoff)
        let hashes = candidates.map(\.hash).sorted()
        #expect(Set(markOne.candidates.keys) == Set(hashes) && Set(markTwo.candidates.keys) == Set(hashes))
        let wanted = candidates.enumerated().filter { $0.offset % 4 == 0 }.map(\.element)
        let reuploaded = (0..<60).filter { $0 % 4 == 1 }.map { "candidate-\($0)" }
        enum Outcome: Sendable { case doomed([ContentHash]), committed([ContentHash]), uploaded([ContentHash]) }
        let outcomes = try await withThrowingTaskGroup(of: Outcome.self) { group in
            group.addTask {
                var doomed: [ContentHash] = []
                for start in stride(from: 0, to: hashes.count, by: 7) {
                    let part = Array(hashes[start..<min(start + 7, hashes.count)])
                    doomed += try await one.sweepChunks(part, mark: markOne, staleAt: cutoff, now: later).doomed.map(\.hash)
                }
                return .doomed(doomed)
            }
            group.addTask {
                var doomed: [ContentHash] = []
                let reversed = Array(hashes.reversed())
                for start in stride(from: 0, to: reversed.count, by: 5) {
                    let part = Array(reversed[start..<min(start + 5, reversed.count)])
                    doomed += try await two.sweepChunks(part, mark: markTwo, staleAt: cutoff, now: later).doomed.map(\.hash)
                }
                return .doomed(doomed)
            }
            group.addTask {
                var committed: [ContentHash] = []
                for (i, c) in wanted.enumerated() {
                    let store = i % 2 == 0 ? one : two
                    let request = CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: f.draft(.file, "w\(i)", chunks: [c]))
                    do {
                        _ = try await store.commit(request, in: f.container, by: f.a, now: later)
                        committed.append(c.hash)
                    } catch let e as APIError where e.code == .missingChunks {
                        // Swept first: the device would upload it again.
                    }
                }
                return .committed(committed)
            }
            group.addTask {
                var uploaded: [ContentHash] = []
                for (i, tag) in reuploaded.enumerated() {
                    do {
                        uploaded.append(try await g.upload(tag, now: later, through: i % 2 == 0 ? two : one).hash)
                    } catch let e as APIError where e.code == .busy {
                        // Being deleted: the device would upload it again in a second.
                    }
                }
                return .uploaded(uploaded)
            }
            return try await group.reduce(into: [Outcome]()) { $0.append($1) }
        }
        var doomed: [[ContentHash]] = [], committed: [ContentHash] = [], uploaded: [ContentHash] = []
        for o in outcomes {
            switch o {
            case .doomed(let d): doomed.append(d)
            case .committed(let c): committed += c
            case .uploaded(let u): uploaded += u
            }
        }
        let all = doomed.flatMap { $0 }
        #expect(Set(all).count == all.count, "no chunk doomed twice: \(all.count) doomed, \(Set(all).count) distinct")
        #expect(Set(all).isDisjoint(with: committed), "no committed chunk doomed")
        #expect(Set(all).isDisjoint(with: uploaded), "no chunk doomed that an upload then reported stored")
        try #require(try await one.chunkDeletions().sorted() == all.sorted())
        for h in all { try await chunks.delete(h) }
        try await one.forgetChunkDeletions(all)
        for h in committed {
            let ref = try #require(candidates.first { $0.hash == h })
            try await g.expect(ref, stored: true, ownedBy: f.a)
        }
        for h in uploaded {
            let ref = try #require(candidates.first { $0.hash == h })
            try await g.expect(ref, stored: true, ownedBy: f.a)
        }
        try await g.checkConsistent("after concurrent sweeps, commits and uploads")
        // What neither swept nor committed (a commit or an upload held it) goes in the next
        // collection, once the uploads' grace is over too.
        let rest = Set(hashes).subtracting(all).subtracting(committed)
        let last = try await ChunkCollector(store: two, chunks: chunks, graceSeconds: 3_600).run(now: later + 3_600 * s)
        #expect(last.chunks == rest.count, "\(last), \(rest.count) left")
        #expect(chunks.deletions.withLock { $0.values.allSatisfy { $0 == 1 } }, "each chunk deleted once")
        try await g.checkConsistent("at the end")
    }
}
