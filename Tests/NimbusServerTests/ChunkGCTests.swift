import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Synchronization
import Testing

/// A real chunk store that also counts the deletions of each chunk (to see that two collectors
/// delete each chunk once).
final class CountingChunkStore: ChunkStore {
    let inner: any ChunkStore
    let deletions = Mutex<[ContentHash: Int]>([:])
    init(_ inner: any ChunkStore) { self.inner = inner }
    func put<Body: AsyncSequence & Sendable>(_ hash: ContentHash, size: Int64, body: Body, ifStored: IfStored) async throws
        where Body.Element == ByteBuffer {
        try await inner.put(hash, size: size, body: body, ifStored: ifStored)
    }
    func size(of hash: ContentHash) async throws -> Int64? { try await inner.size(of: hash) }
    func open(_ hash: ContentHash, range: Range<Int64>?) async throws -> ChunkReader? { try await inner.open(hash, range: range) }
    func delete(_ hash: ContentHash) async throws {
        deletions.withLock { $0[hash, default: 0] += 1 }
        try await inner.delete(hash)
    }
}

/// A fresh directory, removed after `body`.
func withTempDir<T>(_ name: String, _ body: (String) async throws -> T) async throws -> T {
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-\(name)-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: dir) }
    return try await body(dir)
}

/// The collector on SQLite with a chunk directory: the conformance cases, two stores on one file
/// (as `nimbus admin gc` beside `nimbus serve`), the seeded interleaving, and over HTTP.
@Suite struct ChunkGCSQLiteTests {
    @Test(arguments: ChunkGCConformance.allCases)
    func conformance(_ c: ChunkGCConformance) async throws {
        try await withTempDir("gc") { dir in
            let store = try SQLiteStore(path: dir + "/metadata.sqlite", history: c.retention)
            try await c.run(store, chunks: try DirectoryChunkStore(root: dir + "/chunks"))
        }
    }

    @Test func twoCollectorsOnOneFile() async throws {
        try await withTempDir("gc-two") { dir in
            let retention = HistoryRetention(keepVersions: 0, keepDays: 0)!
            let one = try SQLiteStore(path: dir + "/metadata.sqlite", history: retention)
            let two = try SQLiteStore(path: dir + "/metadata.sqlite", history: retention)
            let chunks = CountingChunkStore(try DirectoryChunkStore(root: dir + "/chunks"))
            try await GCConcurrency.twoCollectors(one, two, chunks: chunks)
        }
    }

    @Test func seededInterleaving() async throws {
        for seed in GCSimulation.seeds() {
            try await withTempDir("gc-sim") { dir in
                let store = try SQLiteStore(path: dir + "/metadata.sqlite", history: HistoryRetention(keepVersions: 1, keepDays: 0)!)
                try await GCSimulation(seed: seed).run(store, chunks: try DirectoryChunkStore(root: dir + "/chunks"))
            }
        }
    }

    /// Over HTTP: `chunks/missing` keeps what it reports present for the grace; a collection
    /// frees what nobody refers to, `/metrics` counts it, and a device that lost a chunk is told
    /// `missing_chunks` and uploads it again.
    @Test func overHTTPMissingClaimsAndMetricsCount() async throws {
        let clock = Mutex<Int64>(0)
        try await LiveServer.with(configure: { app in
            app.clock = { clock.withLock { $0 } }
            app.gcGraceSeconds = 60
        }) { s in
            let client = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await client.createContainer("com.example.notes")
            let x = Array("chunk x".utf8), y = Array("chunk y, a little longer".utf8)
            let hx = ChunkHashing.sha256(ByteBuffer(bytes: x)), hy = ChunkHashing.sha256(ByteBuffer(bytes: y))
            try await client.putChunk(hx, x)
            try await client.putChunk(hy, y)
            clock.withLock { $0 = 50_000_000_000 }
            #expect(try await client.missingChunks([hx]) == [], "x is present, and claimed at 50 s")
            clock.withLock { $0 = 100_000_000_000 }
            let r = try await s.app.collectGarbage()
            #expect(r.chunks == 1 && r.bytes == Int64(y.count), "y (untouched for 100 s) is freed, x (claimed 50 s ago) is kept: \(r)")
            #expect(try await client.getChunk(hx) == x)
            #expect(try await client.missingChunks([hx, hy]) == [hy])
            let commit = CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: ItemDraft(
                kind: .file, parent: .root, name: ItemName(trusted: "a.txt"),
                chunks: [ChunkRef(hash: hx, size: Int64(x.count)), ChunkRef(hash: hy, size: Int64(y.count))], mode: 0o644, modified: 1))
            do {
                _ = try await client.commit("com.example.notes", commit)
                Issue.record("a commit naming a freed chunk must fail")
            } catch let e as RemoteError {
                #expect(e.code == .missingChunks)
            }
            try await client.putChunk(hy, y)
            _ = try await client.commit("com.example.notes", commit)
            clock.withLock { $0 = 10_000_000_000_000 }
            #expect(try await s.app.collectGarbage().chunks == 0, "committed chunks stay")
            let metrics = try await NimbusClient(baseURL: s.url, token: "").send(.GET, "/metrics", authorized: false).text
            #expect(metrics.contains("nimbus_gc_chunks_freed_total 1"), "\(metrics)")
            #expect(metrics.contains("nimbus_gc_bytes_freed_total \(y.count)"))
            #expect(try await StoreCheck.problems(store: s.app.store, chunks: s.app.chunks).isEmpty)
        }
    }
}

/// The same on PostgreSQL: a directory of chunks, S3 (moto), and two instances on one database.
@Suite(.enabled(if: PostgresScratch.available, "NIMBUS_TEST_POSTGRES is unset; scripts/test starts PostgreSQL and sets it"))
struct ChunkGCPostgresTests {
    @Test(arguments: ChunkGCConformance.allCases)
    func conformance(_ c: ChunkGCConformance) async throws {
        try await withTempDir("gc-pg") { dir in
            let chunks = try DirectoryChunkStore(root: dir + "/chunks")
            try await PostgresScratch.withStore(history: c.retention) { store in try await c.run(store, chunks: chunks) }
        }
    }

    @Test(.enabled(if: S3Scratch.available, "NIMBUS_TEST_S3 is unset"), arguments: ChunkGCConformance.allCases)
    func conformanceOnS3(_ c: ChunkGCConformance) async throws {
        try await S3Scratch.withBucket { bucket, _ in
            try await PostgresScratch.withStore(history: c.retention) { store in try await c.run(store, chunks: bucket) }
        }
    }

    @Test func twoInstancesOnOneDatabase() async throws {
        try await withTempDir("gc-pg-two") { dir in
            let chunks = CountingChunkStore(try DirectoryChunkStore(root: dir + "/chunks"))
            try await PostgresScratch.withDatabase { location in
                let retention = HistoryRetention(keepVersions: 0, keepDays: 0)!
                let one = try await PostgresStore.open(location, history: retention)
                let two = try await PostgresStore.open(location, history: retention)
                do {
                    try await GCConcurrency.twoCollectors(one, two, chunks: chunks)
                } catch {
                    await one.shutdown()
                    await two.shutdown()
                    throw error
                }
                await one.shutdown()
                await two.shutdown()
            }
        }
    }

    @Test func seededInterleaving() async throws {
        for seed in GCSimulation.seeds().prefix(2) {
            try await withTempDir("gc-pg-sim") { dir in
                let chunks = try DirectoryChunkStore(root: dir + "/chunks")
                try await PostgresScratch.withStore(history: HistoryRetention(keepVersions: 1, keepDays: 0)!) { store in
                    try await GCSimulation(seed: seed).run(store, chunks: chunks)
                }
            }
        }
    }
}
