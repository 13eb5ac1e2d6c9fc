import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusServer

/// The chunk garbage collector (`ChunkCollector`) on a real store and a real chunk store: every
/// case runs on every engine with every chunk store the test target has (SQLite + directory,
/// PostgreSQL + directory, PostgreSQL + S3). Time is the `now` passed in, so "an hour later"
/// needs no sleeping. Each case ends with `StoreCheck` (what `nimbus admin check` runs) clean.
public enum ChunkGCConformance: String, CaseIterable, Sendable {
    case uncommittedUploadsSurvive
    case prunedVersionsChunksAreFreed
    case sharedChunksAreKept
    case claimRefreshesTheLease
    case deletionBlocksUploadsUntilFinished
    case dryRunChangesNothing

    public var retention: HistoryRetention {
        switch self {
        case .prunedVersionsChunksAreFreed: HistoryRetention(keepVersions: 0, keepDays: 0)!
        case .sharedChunksAreKept: HistoryRetention(keepVersions: 1, keepDays: 0)!
        default: .default
        }
    }

    public func run(_ store: any ServerStore, chunks: any ChunkStore) async throws {
        let g = GCFixture(f: try await StoreFixture.make(store), chunks: chunks)
        switch self {
        case .uncommittedUploadsSurvive: try await Self.uncommittedUploadsSurvive(g)
        case .prunedVersionsChunksAreFreed: try await Self.prunedVersionsChunksAreFreed(g)
        case .sharedChunksAreKept: try await Self.sharedChunksAreKept(g)
        case .claimRefreshesTheLease: try await Self.claimRefreshesTheLease(g)
        case .deletionBlocksUploadsUntilFinished: try await Self.deletionBlocksUploads(g)
        case .dryRunChangesNothing: try await Self.dryRun(g)
        }
        try await g.checkConsistent("after \(rawValue)")
    }

    static let s: Int64 = 1_000_000_000
    static let hour: Int64 = 3_600

    /// An upload that is not committed yet survives a collection within the grace, and so does
    /// one whose bytes are still being written; an upload older than the grace is reclaimed, its
    /// end answers `busy`, and uploading again works.
    static func uncommittedUploadsSurvive(_ g: GCFixture) async throws {
        let x = try await g.upload("x", now: 0)
        let y = g.bytes("y")
        let inFlight = try await g.f.store.beginChunkUpload(account: g.f.a.accountID, hash: ChunkHashing.sha256(y), size: Int64(y.readableBytes), now: 0)
        let r0 = try await g.collect(now: 3_599 * s, grace: hour)
        try check(r0.chunks == 0 && r0.released == 0, "nothing is freed within the grace, got \(r0)")
        try await g.expect(x, stored: true, ownedBy: g.f.a)
        try await g.chunks.put(inFlight.hash, bytes: y, ifStored: .store)
        try await g.f.store.finishChunkUpload(inFlight, size: Int64(y.readableBytes), now: 3_599 * s)
        let yRef = ChunkRef(hash: inFlight.hash, size: Int64(y.readableBytes))
        let (file, _) = try await g.f.create(.file, "x.bin", chunks: [x, yRef])
        try check(try await g.f.item(file).chunks == [x, yRef], "the uploads commit after the collection")

        // Reclaimed: begun long ago, ended after a collection.
        let z = g.bytes("z")
        let stale = try await g.f.store.beginChunkUpload(account: g.f.a.accountID, hash: ChunkHashing.sha256(z), size: Int64(z.readableBytes), now: 0)
        try await g.chunks.put(stale.hash, bytes: z, ifStored: .store)
        let r = try await g.collect(now: 2 * hour * s, grace: hour)
        try check(r.chunks == 1 && r.bytes == Int64(z.readableBytes), "the stale upload's bytes are freed, got \(r)")
        do {
            try await g.f.store.finishChunkUpload(stale, size: Int64(z.readableBytes), now: 2 * hour * s)
            throw ConformanceFailure("ending a reclaimed upload must fail")
        } catch let e as APIError { try check(e.code == .busy, "busy, got \(e)") }
        let zRef = try await g.upload("z", now: 2 * hour * s)
        try await g.expect(zRef, stored: true, ownedBy: g.f.a)
        try await g.expect(x, stored: true, ownedBy: g.f.a)
    }

    /// A chunk only a pruned version referred to is freed: ownership and bytes gone. A commit
    /// naming it afterwards is `missing_chunks`; uploaded again, it commits.
    static func prunedVersionsChunksAreFreed(_ g: GCFixture) async throws {
        let x = try await g.upload("x", now: 0), y = try await g.upload("y", now: 0)
        let (file, v1) = try await g.f.create(.file, "p.bin", chunks: [x])
        let v2 = try await g.f.commit(file, base: v1, g.f.draft(.file, "p.bin", chunks: [y], t: 2_000), now: s).item.version
        try check(try await g.f.versions(file).map(\.version) == [v2], "keep 0/0 pruned the first version")
        var r = try await g.collect(now: 2 * hour * s, grace: hour)
        try check(r.chunks == 1 && r.bytes == x.size && r.released == 1, "x freed, got \(r)")
        try await g.expect(x, stored: false, ownedBy: nil)
        try await g.expect(y, stored: true, ownedBy: g.f.a)
        r = try await g.collect(now: 2 * hour * s, grace: hour)
        try check(r.chunks == 0 && r.released == 0, "a second run frees nothing, got \(r)")
        do {
            _ = try await g.f.commit(file, base: v2, g.f.draft(.file, "p.bin", chunks: [x], t: 3_000), now: 2 * hour * s)
            throw ConformanceFailure("a commit of a freed chunk must fail")
        } catch let e as APIError {
            try check(e.code == .missingChunks && e.missing == [x.hash], "missing_chunks names the freed chunk, got \(e)")
        }
        _ = try await g.upload("x", now: 2 * hour * s)
        let back = try await g.f.commit(file, base: v2, g.f.draft(.file, "p.bin", chunks: [x], t: 3_000), now: 2 * hour * s)
        try check(back.outcome == .applied, "uploaded again, it commits")
        try await g.expect(x, stored: true, ownedBy: g.f.a)
    }

    /// A chunk a kept version shares with a pruned one stays; so does a chunk another account
    /// refers to (the bytes are shared by content), with every ownership of it. Of a chunk two
    /// accounts own and nobody refers to, only the stale ownership goes; the bytes stay.
    static func sharedChunksAreKept(_ g: GCFixture) async throws {
        let shared = try await g.upload("shared", now: 0)
        let a = try await g.upload("a", now: 0), b = try await g.upload("b", now: 0), c = try await g.upload("c", now: 0)
        let (file, v1) = try await g.f.create(.file, "s.bin", chunks: [shared, a])
        let v2 = try await g.f.commit(file, base: v1, g.f.draft(.file, "s.bin", chunks: [shared, b], t: 2_000), now: s).item.version
        _ = try await g.f.commit(file, base: v2, g.f.draft(.file, "s.bin", chunks: [shared, c], t: 3_000), now: 2 * s)
        try check(try await g.f.versions(file).count == 2, "the current version and the last previous one are kept")
        let bob = try await g.f.store.addDevice(account: "bob", deviceName: "phone", tokenHash: TokenHash.of(UUID().uuidString))
        _ = try await g.upload("shared", now: 0, by: bob)
        let lonely = try await g.upload("bob-only", now: 0, by: bob)
        let both = try await g.upload("both", now: 0)
        _ = try await g.upload("both", now: 2 * hour * s - 10 * s, by: bob)
        let r = try await g.collect(now: 2 * hour * s, grace: hour)
        try check(r.chunks == 2 && r.bytes == a.size + lonely.size, "a and bob-only freed, got \(r)")
        try check(r.released == 3, "a, bob-only and alice's ownership of both released, got \(r)")
        try await g.expect(a, stored: false, ownedBy: nil)
        try await g.expect(lonely, stored: false, ownedBy: nil)
        for kept in [shared, b, c] { try await g.expect(kept, stored: true, ownedBy: g.f.a) }
        try await g.expect(shared, stored: true, ownedBy: bob)
        try await g.expect(both, stored: true, ownedBy: bob)
        try check(try await g.f.store.ownedChunks(account: g.f.a.accountID, hashes: [both.hash]).isEmpty, "alice's stale ownership of both is gone")
    }

    /// `claimChunks` (what `POST /v1/chunks/missing` does) restarts the grace of what it reports.
    static func claimRefreshesTheLease(_ g: GCFixture) async throws {
        let x = try await g.upload("x", now: 0), y = try await g.upload("y", now: 0)
        let unknown = ChunkHashing.sha256(g.bytes("never uploaded"))
        let owned = try await g.f.store.claimChunks(account: g.f.a.accountID, hashes: [x.hash, y.hash, unknown, x.hash], now: 3_000 * s)
        try check(owned == [x.hash: x.size, y.hash: y.size], "claim answers what is owned, got \(owned)")
        var r = try await g.collect(now: 3_700 * s, grace: hour)
        try check(r.chunks == 0, "claimed 700 s ago: kept, got \(r)")
        _ = try await g.f.create(.file, "c.bin", chunks: [x])
        r = try await g.collect(now: 6_601 * s, grace: hour)
        try check(r.chunks == 1 && r.bytes == y.size, "y's claim expired, x is referenced, got \(r)")
        try await g.expect(x, stored: true, ownedBy: g.f.a)
        try await g.expect(y, stored: false, ownedBy: nil)
        let late = try await g.f.store.claimChunks(account: g.f.a.accountID, hashes: [y.hash], now: 6_602 * s)
        try check(late.isEmpty, "a freed chunk is reported missing")
    }

    /// A deletion left recorded (a collector that stopped before deleting the bytes) refuses
    /// uploads of the chunk with `busy` until the next collection finishes it.
    static func deletionBlocksUploads(_ g: GCFixture) async throws {
        let x = try await g.upload("x", now: 0)
        let mark = try await g.f.store.markChunks(staleAt: hour * s)
        try check(mark.candidates[x.hash]?.freeable == true, "x is a candidate, got \(mark.candidates)")
        let sweep = try await g.f.store.sweepChunks([x.hash], mark: mark, staleAt: hour * s, now: hour * s)
        try check(sweep.doomed.map(\.hash) == [x.hash], "x's deletion is recorded")
        try check(try await g.f.store.chunkDeletions() == [x.hash], "and listed")
        do {
            _ = try await g.upload("x", now: hour * s)
            throw ConformanceFailure("an upload of a chunk being deleted must wait")
        } catch let e as APIError { try check(e.code == .busy, "busy, got \(e)") }
        do {
            try await g.f.store.recordChunk(account: g.f.a.accountID, hash: x.hash, size: x.size, now: hour * s)
            throw ConformanceFailure("recording a chunk being deleted must wait")
        } catch let e as APIError { try check(e.code == .busy, "busy, got \(e)") }
        try await g.checkConsistent("with a deletion recorded")
        let r = try await g.collect(now: hour * s, grace: hour)
        try check(r.chunks == 1 && r.bytes == x.size, "the next run deletes the bytes, got \(r)")
        try check(try await g.f.store.chunkDeletions().isEmpty, "and forgets the deletion")
        try await g.expect(x, stored: false, ownedBy: nil)
        let again = try await g.upload("x", now: hour * s)
        try await g.expect(again, stored: true, ownedBy: g.f.a)
    }

    static func dryRun(_ g: GCFixture) async throws {
        let x = try await g.upload("x", now: 0), y = try await g.upload("y", now: 0)
        _ = try await g.f.create(.file, "d.bin", chunks: [y])
        let dry = try await g.collect(now: 2 * hour * s, grace: hour, dryRun: true)
        try check(dry.dryRun && dry.chunks == 1 && dry.bytes == x.size, "would free x, got \(dry)")
        try await g.expect(x, stored: true, ownedBy: g.f.a)
        let r = try await g.collect(now: 2 * hour * s, grace: hour)
        try check(!r.dryRun && r.chunks == 1 && r.bytes == x.size, "frees x, got \(r)")
    }
}

/// A store fixture with a real chunk store: uploads go through `ChunkUploads` as PUT does.
public struct GCFixture: Sendable {
    public let f: StoreFixture
    public let chunks: any ChunkStore

    public init(f: StoreFixture, chunks: any ChunkStore) {
        self.f = f
        self.chunks = chunks
    }

    /// Distinct bytes for `tag` (a few hundred bytes).
    public func bytes(_ tag: String) -> ByteBuffer {
        ByteBuffer(string: String(repeating: "\(tag)|", count: 40 + tag.utf8.count))
    }

    /// Uploads `bytes(tag)` as `PUT /v1/chunks/{hash}` does, at `now`, through `store` (another
    /// instance on the same database) or the fixture's.
    @discardableResult
    public func upload(_ tag: String, now: Int64, by device: DeviceRecord? = nil, through store: (any ServerStore)? = nil) async throws -> ChunkRef {
        let b = bytes(tag)
        let hash = ChunkHashing.sha256(b)
        try await ChunkUploads.store(b, as: hash, account: (device ?? f.a).accountID, store: store ?? f.store, chunks: chunks, clock: { now })
        return ChunkRef(hash: hash, size: Int64(b.readableBytes))
    }

    public func collect(now: Int64, grace: Int64, dryRun: Bool = false) async throws -> CollectionReport {
        try await ChunkCollector(store: f.store, chunks: chunks, graceSeconds: grace).run(now: now, dryRun: dryRun)
    }

    /// The chunk's bytes are (not) in the chunk store, and `ownedBy` (if any) owns it.
    public func expect(_ ref: ChunkRef, stored: Bool, ownedBy device: DeviceRecord?) async throws {
        let size = try await chunks.size(of: ref.hash)
        try check((size != nil) == stored, "chunk \(ref.hash) \(stored ? "stored" : "gone"), size \(String(describing: size))")
        if stored, size != nil { try check(try await chunks.read(ref.hash, range: nil)?.readableBytes == Int(ref.size), "chunk \(ref.hash) reads whole") }
        if let device {
            try check(try await f.store.ownedChunks(account: device.accountID, hashes: [ref.hash])[ref.hash] == ref.size,
                      "chunk \(ref.hash) owned by \(device.accountName)")
        } else {
            try check(!(try await f.store.ownedChunkHashes()).contains(ref.hash), "chunk \(ref.hash) owned by nobody")
        }
    }

    /// What `nimbus admin check` checks: the store's invariants and every referenced or owned chunk stored.
    public func checkConsistent(_ when: String) async throws {
        let problems = try await StoreCheck.problems(store: f.store, chunks: chunks)
        try check(problems.isEmpty, "inconsistent \(when): \(problems)")
    }
}
