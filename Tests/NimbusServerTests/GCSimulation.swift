import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusServer
import NimbusTesting

/// A seeded run that interleaves uploads, "missing" claims, commits (each prunes: keep 1
/// previous version), deletes and collections — whole ones and ones taken apart step by step with
/// other operations between the mark, the sweep and the deletion of the bytes — under a clock it
/// controls and a grace of 0 or a few seconds. After every collection `StoreCheck` is clean; at
/// the end every current and kept version of every item reads back whole. A failure names its
/// seed; NIMBUS_GC_SEED=N replays one.
struct GCSimulation {
    let seed: UInt64
    static let s: Int64 = 1_000_000_000

    static func seeds() -> [UInt64] {
        if let text = ProcessInfo.processInfo.environment["NIMBUS_GC_SEED"], let seed = UInt64(text) { return [seed] }
        return [1, 2, 3, UInt64.random(in: 4...UInt64.max)]
    }

    struct Failure: Error, CustomStringConvertible { let description: String }

    func run(_ store: any ServerStore, chunks: any ChunkStore) async throws {
        do {
            var world = try await World(store: store, chunks: chunks, seed: seed)
            try await world.run(steps: 150)
        } catch {
            throw Failure(description: "GC simulation seed \(seed) (replay with NIMBUS_GC_SEED=\(seed)): \(error)")
        }
    }

    struct SplitMix: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    struct Account {
        let device: DeviceRecord
        let container: ContainerRecord
        var items: [ItemID: Int64] = [:]
    }

    struct World {
        let g: GCFixture
        var rng: SplitMix
        var now: Int64 = 1 * s
        let grace: Int64
        var accounts: [Account]
        var log: [String] = []

        init(store: any ServerStore, chunks: any ChunkStore, seed: UInt64) async throws {
            rng = SplitMix(state: seed)
            let f = try await StoreFixture.make(store)
            g = GCFixture(f: f, chunks: chunks)
            grace = [0, 0, 5][Int.random(in: 0..<3, using: &rng)]
            let bob = try await store.addDevice(account: "bob", deviceName: "phone", tokenHash: TokenHash.of(UUID().uuidString))
            guard let bobs = try await store.container(account: bob.accountID, name: "com.example.notes", create: true) else {
                throw Failure(description: "no container for bob")
            }
            accounts = [Account(device: f.a, container: f.container), Account(device: bob, container: bobs)]
        }

        func require(_ ok: Bool, _ what: @autoclosure () -> String) throws {
            if !ok { throw Failure(description: "\(what()) (grace \(grace) s; last steps: \(log.suffix(8)))") }
        }

        mutating func pick<T>(_ xs: [T]) -> T { xs[Int.random(in: 0..<xs.count, using: &rng)] }
        mutating func tag() -> String { "c\(Int.random(in: 0..<16, using: &rng))" }
        func ref(_ tag: String) -> ChunkRef {
            let b = g.bytes(tag)
            return ChunkRef(hash: ChunkHashing.sha256(b), size: Int64(b.readableBytes))
        }

        mutating func run(steps: Int) async throws {
            for _ in 0..<steps {
                now += Int64.random(in: 0...3, using: &rng) * s
                switch Int.random(in: 0..<10, using: &rng) {
                case 0, 1, 2, 3: try await operation()
                case 4, 5: try await collect()
                case 6, 7: try await collectInSteps()
                case 8: try await staleUpload()
                default: try await claim()
                }
            }
            try await collect()
            try await verifyEveryVersion()
        }

        /// One device operation: an upload, a claim or a commit.
        mutating func operation() async throws {
            switch Int.random(in: 0..<4, using: &rng) {
            case 0: try await upload()
            case 1: try await claim()
            default: try await push(collectBetween: Int.random(in: 0..<3, using: &rng) == 0)
            }
        }

        mutating func upload() async throws {
            let t = tag(), a = Int.random(in: 0..<2, using: &rng)
            log.append("upload \(t) by \(a) at \(now / s)")
            do {
                try await g.upload(t, now: now, by: accounts[a].device)
            } catch let e as APIError where e.code == .busy {
                log.append("busy")
            }
        }

        mutating func claim() async throws {
            let a = Int.random(in: 0..<2, using: &rng)
            let tags = (0..<3).map { _ in tag() }
            log.append("claim \(tags) by \(a) at \(now / s)")
            _ = try await g.f.store.claimChunks(account: accounts[a].device.accountID, hashes: tags.map { ref($0).hash }, now: now)
        }

        /// What a device does: ask what is missing (claiming the rest), upload that, commit; on
        /// `missing_chunks`, again. With `collectBetween`, a collection runs between the claim and
        /// the commit: within the grace it must not take a claimed chunk.
        mutating func push(collectBetween: Bool) async throws {
            let a = Int.random(in: 0..<2, using: &rng)
            let account = accounts[a]
            let existing = account.items.keys.sorted { $0.description < $1.description }
            let id = existing.isEmpty || Int.random(in: 0..<3, using: &rng) == 0 ? ItemID(UUID()) : pick(existing)
            let delete = account.items[id] != nil && Int.random(in: 0..<6, using: &rng) == 0
            let tags = delete ? [] : (0..<Int.random(in: 1...3, using: &rng)).map { _ in tag() }
            let refs = tags.map(ref)
            log.append("push \(id.description.prefix(4)) \(delete ? "delete" : "\(tags)") by \(a) at \(now / s)\(collectBetween ? " +gc" : "")")
            for attempt in 0..<4 {
                let present = try await g.f.store.claimChunks(account: account.device.accountID, hashes: refs.map(\.hash), now: now)
                let claimedAt = now
                var secured = Set(present.keys)
                for t in Set(tags) where present[ref(t).hash] == nil {
                    do {
                        secured.insert(try await g.upload(t, now: now, by: account.device).hash)
                    } catch let e as APIError where e.code == .busy { continue }
                }
                if collectBetween && attempt == 0 {
                    now += Int64.random(in: 0...2, using: &rng) * s
                    try await collect()
                }
                let draft = g.f.draft(.file, "f-\(id.description.prefix(8))", chunks: refs, t: now, deleted: delete)
                do {
                    let r = try await g.f.store.commit(CommitRequest(item: id, baseVersion: account.items[id], state: draft),
                                                       in: account.container, by: account.device, now: now)
                    accounts[a].items[id] = r.item.version
                    return
                } catch let e as APIError where e.code == .missingChunks {
                    let lost = Set(e.missing ?? []).intersection(secured)
                    try require(lost.isEmpty || now - claimedAt >= grace * s,
                                "chunks claimed or uploaded \((now - claimedAt) / s) s before the commit were freed within the grace: \(lost)")
                    log.append("missing \(e.missing?.count ?? 0), again")
                }
            }
            throw Failure(description: "a push did not go through in 4 attempts")
        }

        mutating func collect() async throws {
            let r = try await g.collect(now: now, grace: grace)
            log.append("gc at \(now / s): \(r)")
            try require(!r.skipped, "a lone collector was skipped")
            try await g.checkConsistent("after a collection at \(now / s)")
        }

        /// The collector's steps by hand with device operations between them.
        mutating func collectInSteps() async throws {
            let cutoff = now - grace * s
            let mark = try await g.f.store.markChunks(staleAt: cutoff)
            log.append("mark at \(now / s): \(mark.candidates.count) candidates")
            for _ in 0..<Int.random(in: 0...3, using: &rng) { try await operation() }
            let sweep = try await g.f.store.sweepChunks(mark.candidates.keys.sorted(), mark: mark, staleAt: cutoff, now: now)
            log.append("sweep: \(sweep.doomed.count) doomed")
            for (hash, _) in sweep.doomed {
                // While the deletion is recorded the chunk can be neither uploaded nor committed.
                let upload = try? await g.f.store.beginChunkUpload(account: accounts[0].device.accountID, hash: hash, size: 1, now: now)
                try require(upload == nil, "an upload of a chunk being deleted began")
                try require(try await g.f.store.claimChunks(account: accounts[0].device.accountID, hashes: [hash], now: now).isEmpty,
                            "a chunk being deleted is reported present")
            }
            try await g.checkConsistent("between a sweep and its deletions")
            for (hash, _) in sweep.doomed { try await g.chunks.delete(hash) }
            try await g.f.store.forgetChunkDeletions(sweep.doomed.map(\.hash))
            try await g.checkConsistent("after a collection in steps")
        }

        /// An upload that outlives the grace while a collection runs: its end is refused (or, if
        /// it kept its chunk, accepted) and uploading again works.
        mutating func staleUpload() async throws {
            let t = tag(), b = g.bytes(t), hash = ChunkHashing.sha256(b)
            guard let upload = try? await g.f.store.beginChunkUpload(account: accounts[0].device.accountID, hash: hash, size: Int64(b.readableBytes), now: now) else { return }
            log.append("slow upload \(t) at \(now / s)")
            now += (grace + 1) * s
            try await collect()
            try await g.chunks.put(hash, bytes: b, ifStored: .store)
            do {
                try await g.f.store.finishChunkUpload(upload, size: Int64(b.readableBytes), now: now)
            } catch let e as APIError where e.code == .busy {
                log.append("reclaimed")
                try await g.upload(t, now: now)
            }
            try await g.checkConsistent("after a slow upload")
        }

        func verifyEveryVersion() async throws {
            var read = 0
            for account in accounts {
                for id in account.items.keys {
                    for v in try await g.f.store.versions(of: id, in: account.container) {
                        for c in v.state.chunks {
                            guard let bytes = try await g.chunks.read(c.hash, range: nil) else {
                                throw Failure(description: "version \(v.version) (\(v.role)) of \(id) refers to chunk \(c.hash), which is gone")
                            }
                            try require(ChunkHashing.sha256(bytes) == c.hash && Int64(bytes.readableBytes) == c.size, "chunk \(c.hash) reads back whole")
                            read += 1
                        }
                    }
                }
            }
            try require(accounts.contains { !$0.items.isEmpty }, "the run committed something")
            _ = read
        }
    }
}
