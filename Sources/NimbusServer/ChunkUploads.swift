import NIOCore
import NimbusCore

/// Storing an uploaded chunk (`PUT /v1/chunks/{hash}`), in the order the garbage collector relies
/// on (`ChunkCollector`): the upload is recorded before the bytes are written, and the ownership
/// after they are, in the transaction that ends the upload.
public enum ChunkUploads {
    /// Stores `bytes` as chunk `hash` for `account`. An account that does not own the chunk gets
    /// the whole durable write, whether or not another account stored the same bytes: neither the
    /// answer nor its timing tells it that they exist. `busy` while the chunk's bytes are being
    /// freed, or when the collector reclaimed this upload as stale: upload again.
    /// `body` streams the chunk's `size` bytes (checked against `hash` as they pass,
    /// `ChunkStore.put`).
    public static func store<Body: AsyncSequence & Sendable>(_ hash: ContentHash, size: Int64, body: Body, account: Int64,
                                                             store: any ServerStore, chunks: any ChunkStore,
                                                             clock: @Sendable () -> Int64,
                                                             makeRoom: MakeRoom? = nil) async throws where Body.Element == ByteBuffer {
        let upload: ChunkUpload
        do {
            upload = try await store.beginChunkUpload(account: account, hash: hash, size: size, now: clock())
        } catch let e as APIError where e.code == .quotaExceeded {
            // Over the quota: the oldest of Recently Deleted goes first (docs/trash.md), then try once more.
            guard let makeRoom, let q = e.quota, let quota = q.quota,
                  try await makeRoom(account, max(1, q.usage.addingReportingOverflow(size).partialValue - quota)) else { throw e }
            upload = try await store.beginChunkUpload(account: account, hash: hash, size: size, now: clock())
        }
        do {
            try await chunks.put(hash, size: size, body: body, ifStored: upload.owned ? .skip : .store)
            try await store.finishChunkUpload(upload, size: size, now: clock())
        } catch {
            try? await store.abandonChunkUpload(upload)
            throw error
        }
    }

    /// The same with the bytes at hand (tests, tools).
    public static func store(_ bytes: ByteBuffer, as hash: ContentHash, account: Int64, store: any ServerStore,
                             chunks: any ChunkStore, clock: @Sendable () -> Int64, makeRoom: MakeRoom? = nil) async throws {
        try await Self.store(hash, size: Int64(bytes.readableBytes), body: SingleBuffer(buffer: bytes), account: account, store: store,
                             chunks: chunks, clock: clock, makeRoom: makeRoom)
    }

    /// Frees at least `bytes` of `account`'s usage if it can (purging its oldest Recently Deleted
    /// entries); whether anything was freed.
    public typealias MakeRoom = @Sendable (_ account: Int64, _ bytes: Int64) async throws -> Bool
}
