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

    /// The small files of a commit batch (all in memory), each stored as `store` would, with
    /// the same order for the collector: every upload recorded in one transaction, the bytes
    /// written (`ChunkStore.putAll`), the ownership recorded in one more. Each answered on its
    /// own (nil: stored). Those over the quota go last, one at a time, making room first.
    public static func storeAll(_ items: [(hash: ContentHash, bytes: ByteBuffer)], account: Int64, store: any ServerStore,
                                chunks: any ChunkStore, clock: @Sendable () -> Int64, makeRoom: MakeRoom? = nil) async -> [(any Error)?] {
        // Bytes that are not their chunk's are refused before any is admitted: an upload in
        // flight holds room under the quota, and this one would never be stored.
        var out: [(any Error)?] = items.map { c in
            let actual = ChunkHashing.sha256(c.bytes)
            return actual == c.hash ? nil : ChunkTally.uploadError(.mismatch(actual: actual), hash: c.hash, expected: Int64(c.bytes.readableBytes))
        }
        let checked = items.indices.filter { out[$0] == nil }
        var overQuota: [Int] = []
        var begun: [(index: Int, upload: ChunkUpload)] = []
        let answers = await store.beginChunkUploads(account: account, chunks: checked.map { (items[$0].hash, Int64(items[$0].bytes.readableBytes)) },
                                                    now: clock())
        for (i, answer) in zip(checked, answers) {
            switch answer {
            case .success(let upload): begun.append((i, upload))
            case .failure(let e as APIError) where e.code == .quotaExceeded && makeRoom != nil: overQuota.append(i)
            case .failure(let e): out[i] = e
            }
        }
        let put = await chunks.putAll(begun.map { (items[$0.index].hash, items[$0.index].bytes, $0.upload.owned ? .skip : .store) })
        var written: [(index: Int, upload: ChunkUpload)] = []
        for (b, error) in zip(begun, put) {
            if let error {
                out[b.index] = error
                try? await store.abandonChunkUpload(b.upload)
            } else {
                written.append(b)
            }
        }
        let finished = await store.finishChunkUploads(written.map { ($0.upload, Int64(items[$0.index].bytes.readableBytes)) }, now: clock())
        for (w, error) in zip(written, finished) where error != nil {
            out[w.index] = error
            try? await store.abandonChunkUpload(w.upload)
        }
        for i in overQuota {
            do {
                try await Self.store(items[i].bytes, as: items[i].hash, account: account, store: store, chunks: chunks, clock: clock, makeRoom: makeRoom)
            } catch {
                out[i] = error
            }
        }
        return out
    }

    /// Frees at least `bytes` of `account`'s usage if it can (purging its oldest Recently Deleted
    /// entries); whether anything was freed.
    public typealias MakeRoom = @Sendable (_ account: Int64, _ bytes: Int64) async throws -> Bool
}
