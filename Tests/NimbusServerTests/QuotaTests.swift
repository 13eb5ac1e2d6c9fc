import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Testing

/// Per-account quotas on SQLite with a chunk directory, and over HTTP.
@Suite struct QuotaSQLiteTests {
    @Test(arguments: QuotaConformance.allCases)
    func conformance(_ c: QuotaConformance) async throws {
        try await withTempDir("quota") { dir in
            let store = try SQLiteStore(path: dir + "/metadata.sqlite", history: c.retention)
            try await c.run(store, chunks: try DirectoryChunkStore(root: dir + "/chunks"))
        }
    }

    /// `PUT /v1/chunks/{hash}` over the quota answers 507 `quota_exceeded` with `usage` and
    /// `quota` in the error body, which the client hands on as `RemoteError.quota`; a commit of
    /// what is stored goes through while its metadata fits.
    @Test func overHTTP() async throws {
        try await LiveServer.with { s in
            let client = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await client.createContainer(HTTPTests.container)
            let a = try await client.upload(Array(repeating: 1, count: 1_000))
            _ = try await s.app.store.setQuota(account: "alice", bytes: 2_500)
            let over = Array(repeating: UInt8(2), count: 1_600)
            let hash = ChunkHashing.sha256(ByteBuffer(bytes: over))
            let r = try await client.send(.PUT, "/v1/chunks/\(hash)", body: ByteBuffer(bytes: over), contentType: "application/octet-stream")
            #expect(r.status == 507)
            let body = try HTTPTests.error(of: r)
            #expect(body.error.code == "quota_exceeded" && body.error.usage == 1_000 && body.error.quota == 2_500)
            do {
                try await client.upload(over)
                Issue.record("the upload over the quota was accepted")
            } catch let e as RemoteError {
                #expect(e.code == .quotaExceeded && e.quota == QuotaFigures(usage: 1_000, quota: 2_500))
            }
            #expect(try await client.missingChunks([a.hash, hash]) == [hash])
            let done = try await client.commit(HTTPTests.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil,
                                                                                  state: HTTPTests.draft("a.bin", chunks: [a, a])))
            #expect(done.outcome == .applied)
            // A chunk list that would take the metadata past the quota: refused the same way.
            do {
                _ = try await client.commit(HTTPTests.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil,
                                                                               state: HTTPTests.draft("many.bin", chunks: Array(repeating: a, count: 40))))
                Issue.record("a commit past the quota was applied")
            } catch let e as RemoteError {
                #expect(e.code == .quotaExceeded && e.quota?.quota == 2_500 && (e.quota?.usage ?? 0) > 1_000, "\(e)")
            }
        }
    }
}

/// The same on PostgreSQL, each case on a fresh database.
@Suite(.enabled(if: PostgresScratch.available, "NIMBUS_TEST_POSTGRES is unset; scripts/test starts PostgreSQL and sets it"))
struct QuotaPostgresTests {
    @Test(arguments: QuotaConformance.allCases)
    func conformance(_ c: QuotaConformance) async throws {
        try await withTempDir("quota-pg") { dir in
            let chunks = try DirectoryChunkStore(root: dir + "/chunks")
            try await PostgresScratch.withStore(history: c.retention) { store in try await c.run(store, chunks: chunks) }
        }
    }
}
