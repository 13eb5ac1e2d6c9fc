import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusServer

/// Per-account quotas (Quotas.swift) on a real store and chunk store, every case on every engine
/// (SQLite + directory, PostgreSQL + directory): uploads go through `ChunkUploads.store`, as
/// `PUT /v1/chunks/{hash}` does. Each case ends with `StoreCheck` clean.
public enum QuotaConformance: String, CaseIterable, Sendable {
    case refusesTheUploadThatCrossesIt
    case ownedChunksCountOnce
    case concurrentUploadsStayWithinIt
    case raisingTheQuotaLetsItIn
    case overQuotaOnlyDeletesGoThrough
    case metadataCountsAndBoundsCommits
    case freedChunksStopCounting
    case aBatchIsAdmittedChunkByChunk

    public var retention: HistoryRetention {
        self == .freedChunksStopCounting ? HistoryRetention(keepVersions: 0, keepDays: 0)! : .default
    }

    public func run(_ store: any ServerStore, chunks: any ChunkStore) async throws {
        let q = QuotaFixture(g: GCFixture(f: try await StoreFixture.make(store), chunks: chunks))
        switch self {
        case .refusesTheUploadThatCrossesIt: try await Self.refusesTheUploadThatCrossesIt(q)
        case .ownedChunksCountOnce: try await Self.ownedChunksCountOnce(q)
        case .concurrentUploadsStayWithinIt: try await Self.concurrentUploadsStayWithinIt(q)
        case .raisingTheQuotaLetsItIn: try await Self.raisingTheQuotaLetsItIn(q)
        case .overQuotaOnlyDeletesGoThrough: try await Self.overQuotaOnlyDeletesGoThrough(q)
        case .metadataCountsAndBoundsCommits: try await Self.metadataCountsAndBoundsCommits(q)
        case .freedChunksStopCounting: try await Self.freedChunksStopCounting(q)
        case .aBatchIsAdmittedChunkByChunk: try await Self.aBatchIsAdmittedChunkByChunk(q)
        }
        try await q.g.checkConsistent("after \(rawValue)")
    }

    /// The small files of a commit batch (`ChunkUploads.storeAll`, fewer transactions) are
    /// admitted in order as one upload after the other would be: those that fit are stored and
    /// owned, the first that would cross the quota is refused with nothing of it stored, a later
    /// smaller one that still fits gets in, one the account owns is free, and bytes that are
    /// not their chunk's are refused alone.
    static func aBatchIsAdmittedChunkByChunk(_ q: QuotaFixture) async throws {
        let owned = try await q.upload("owned", 100)
        try await q.setQuota(400)
        let wrong = q.bytes("wrong", 50)
        let wrongHash = ChunkHashing.sha256(q.bytes("meant", 50))
        let items: [(hash: ContentHash, bytes: ByteBuffer)] = [
            (q.ref("a", 150).hash, q.bytes("a", 150)),
            (q.ref("b", 200).hash, q.bytes("b", 200)),  // 100 + 150 + 200 > 400
            (wrongHash, wrong),
            (owned.hash, q.bytes("owned", 100)),
            (q.ref("c", 120).hash, q.bytes("c", 120)),  // 100 + 150 + 120 ≤ 400
        ]
        let store = q.g.f.store, chunks = q.g.chunks
        let out = await ChunkUploads.storeAll(items, account: q.g.f.a.accountID, store: store, chunks: chunks, clock: { 0 })
        func code(_ i: Int) -> APIErrorCode? { (out[i] as? APIError)?.code }
        try check(out[0] == nil && out[3] == nil && out[4] == nil, "the chunks that fit, and the owned one, are stored: \(out)")
        try check(code(1) == .quotaExceeded, "the chunk that crosses the quota is refused, got \(String(describing: out[1]))")
        try check(code(2) == .hashMismatch, "bytes that are not their chunk's are refused, got \(String(describing: out[2]))")
        let ownedNow = try await store.ownedChunks(account: q.g.f.a.accountID, hashes: items.map(\.hash))
        try check(Set(ownedNow.keys) == [items[0].hash, owned.hash, items[4].hash], "owned after the batch: \(ownedNow)")
        for i in [1, 2] { try check(try await chunks.size(of: items[i].hash) == nil, "the refused chunk \(i) is not stored") }
        for i in [0, 3, 4] {
            try check(try await chunks.read(items[i].hash, range: nil) == items[i].bytes, "chunk \(i) reads back as stored")
        }
        try await q.expectUsage(370, chunks: 3)
    }

    /// Up to the quota exactly is allowed; the chunk that would cross it is refused with the
    /// account's figures before anything is stored, and the usage is unchanged.
    static func refusesTheUploadThatCrossesIt(_ q: QuotaFixture) async throws {
        let set = try await q.setQuota(250)
        try check(set.figures == QuotaFigures(usage: 0, quota: 250) && set.chunks == 0, "a fresh account uses nothing, got \(set)")
        try await q.upload("a", 100)
        try await q.upload("b", 100)
        let refused = try await q.refusedUpload("c", 100)
        try check(refused.quota == QuotaFigures(usage: 200, quota: 250), "the refusal carries usage and quota, got \(String(describing: refused.quota))")
        try check(refused.message.contains("200") && refused.message.contains("250") && refused.message.contains("set-quota"),
                  "the message says the numbers and what to do: \(refused.message)")
        let c = q.ref("c", 100)
        try check(try await q.g.chunks.size(of: c.hash) == nil, "the refused chunk's bytes are not stored")
        try check(try await q.g.f.store.ownedChunks(account: q.g.f.a.accountID, hashes: [c.hash]).isEmpty, "the refused chunk is not owned")
        try await q.expectUsage(200, chunks: 2)
        try await q.upload("d", 50)  // reaches the quota exactly
        try await q.expectUsage(250, chunks: 3)
        _ = try await q.refusedUpload("e", 1)
    }

    /// A chunk the account owns is not counted again: uploading it again, or referring to it from
    /// many files, is free, even at the quota. Another account storing the same bytes pays for
    /// them itself (it never learns they exist), and its quota is its own.
    static func ownedChunksCountOnce(_ q: QuotaFixture) async throws {
        let a = try await q.upload("a", 100)
        _ = try await q.g.f.create(.file, "one.bin", chunks: [a])
        _ = try await q.g.f.create(.file, "two.bin", chunks: [a, a])
        try await q.expectUsage(100, chunks: 1)
        try await q.setQuota(try await q.usage().figures.usage)
        try await q.upload("a", 100)  // owned: at the quota, and still fine

        let bob = try await StoreFixture.make(q.g.f.store, account: "bob")
        let bobs = try await q.g.f.store.setQuota(account: "bob", bytes: 150)
        try check(bobs.figures == QuotaFigures(usage: 0, quota: 150), "bob starts empty, got \(bobs)")
        try await q.upload("a", 100, by: bob.a)
        _ = try await q.refusedUpload("b", 100, by: bob.a)
        let usage = try await q.g.f.store.accountUsage(account: nil)
        try check(usage.map(\.account) == ["alice", "bob"] && usage.map { $0.figures.usage - $0.metadata } == [100, 100],
                  "each account counts the shared chunk once for itself, got \(usage)")
    }

    /// Uploads racing for the last room never pass the quota: the check and the record of the
    /// upload are one transaction serialized per account, so each sees the others' sizes. Of ten
    /// uploads of 300 bytes at once under a quota of 1000, exactly three get in. An upload under
    /// way counts until it ends (a second begun beside it is refused) and stops counting when it
    /// is abandoned.
    static func concurrentUploadsStayWithinIt(_ q: QuotaFixture) async throws {
        try await q.setQuota(1000)
        let results = try await withThrowingTaskGroup(of: Bool.self) { group in
            for i in 0..<10 {
                group.addTask {
                    do {
                        try await q.upload("racer \(i)", 300)
                        return true
                    } catch let e as APIError where e.code == .quotaExceeded {
                        return false
                    }
                }
            }
            return try await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        try check(results.filter { $0 }.count == 3, "exactly three of ten 300-byte uploads fit in 1000 bytes, got \(results)")
        try await q.expectUsage(900, chunks: 3)

        let store = q.g.f.store, account = q.g.f.a.accountID
        let x = q.ref("in flight", 60), y = q.ref("beside it", 60)
        let first = try await store.beginChunkUpload(account: account, hash: x.hash, size: x.size, now: 0)
        try await q.expectUsage(960, chunks: 3)
        let again = try await store.beginChunkUpload(account: account, hash: x.hash, size: x.size, now: 0)  // the same chunk: counted once
        do {
            _ = try await store.beginChunkUpload(account: account, hash: y.hash, size: y.size, now: 0)
            try check(false, "an upload beside one that holds the room was admitted")
        } catch let e as APIError where e.code == .quotaExceeded {
            try check(e.quota == QuotaFigures(usage: 960, quota: 1000), "the upload under way counts, got \(String(describing: e.quota))")
        }
        try await store.abandonChunkUpload(first)
        try await store.abandonChunkUpload(again)
        try await q.expectUsage(900, chunks: 3)
        try await q.upload("beside it", 60)
        try await q.expectUsage(960, chunks: 4)
    }

    /// Raising the quota (or removing it) lets the refused upload in at once.
    static func raisingTheQuotaLetsItIn(_ q: QuotaFixture) async throws {
        try await q.setQuota(150)
        try await q.upload("a", 100)
        _ = try await q.refusedUpload("b", 100)
        let raised = try await q.setQuota(200)
        try check(raised.figures == QuotaFigures(usage: 100, quota: 200), "set-quota answers the usage, got \(raised)")
        try await q.upload("b", 100)
        _ = try await q.refusedUpload("c", 100)
        let none = try await q.g.f.store.setQuota(account: "alice", bytes: nil)
        try check(none.figures == QuotaFigures(usage: 200, quota: nil) && none.free == nil, "no quota, got \(none)")
        try await q.upload("c", 100)
        try await q.expectUsage(300, chunks: 3)
        do {
            _ = try await q.g.f.store.setQuota(account: "nobody", bytes: 1)
            try check(false, "a quota for an unknown account was set")
        } catch let e as APIError where e.code == .badRequest {}
        try check(try await q.g.f.store.accountUsage(account: "nobody").isEmpty, "no usage for an unknown account")
    }

    /// Over its quota (the admin lowered it below the usage) an account can still delete: every
    /// commit that stores metadata is refused with the figures and changes nothing — an edit to
    /// content it owns, a rename, a copy — and so is every new byte.
    static func overQuotaOnlyDeletesGoThrough(_ q: QuotaFixture) async throws {
        let a = try await q.upload("a", 100), b = try await q.upload("b", 100)
        let (file, v1) = try await q.g.f.create(.file, "f.bin", chunks: [a])
        try await q.setQuota(50)
        let before = try await q.usage()
        for (what, draft) in [("an edit to owned content", q.g.f.draft(.file, "f.bin", chunks: [a, b], t: 2_000)),
                              ("a rename", q.g.f.draft(.file, "g.bin", chunks: [a], t: 3_000))] {
            let e = try await q.refusedCommit(file, base: v1, draft)
            try check(e.quota == QuotaFigures(usage: before.figures.usage, quota: 50) && e.message.contains("set-quota"),
                      "\(what) is refused with the figures and what to do: \(e.message)")
        }
        _ = try await q.refusedCommit(ItemID(UUID()), base: nil, q.g.f.draft(.file, "copy.bin", chunks: [b], t: 2_000))
        try check(try await q.usage() == before, "refused commits change nothing")
        try check(try await q.g.f.item(file).name.value == "f.bin", "the file is as it was")
        let deleted = try await q.g.f.commit(file, base: v1, q.g.f.draft(.file, "f.bin", chunks: [a], t: 4_000, deleted: true))
        try check(deleted.outcome == .applied && deleted.item.deleted, "a delete is applied, got \(deleted.outcome)")
        _ = try await q.refusedUpload("c", 10)
        try await q.expectUsage(200, chunks: 2)
    }

    /// What an account stores in version rows and journal entries counts: commits whose chunk
    /// lists all refer to one owned chunk of 10 bytes (the attack that grew a server by 180 MB
    /// under a 1 MiB quota) fill the quota with metadata and are then refused; the usage never
    /// passes the quota, and what the store counts is what its rows hold (checked after every
    /// case). History pruning gives the bytes of the versions it drops back.
    static func metadataCountsAndBoundsCommits(_ q: QuotaFixture) async throws {
        let tiny = try await q.upload("tiny", 10)
        let list = [ChunkRef](repeating: tiny, count: 2_000)
        try await q.setQuota(1 << 20)
        let (file, v1) = try await q.g.f.create(.file, "big-list.bin", chunks: list)
        let one = try await q.usage()
        try check(one.metadata > Int64(list.count) * 64, "a version's chunk list counts: \(one)")
        var base = v1, commits = 1, refused: APIError?
        for t in 2...200 where refused == nil {
            do {
                let r = try await q.g.f.commit(file, base: base, q.g.f.draft(.file, "big-list.bin", chunks: list, t: Int64(t) * 1_000))
                base = r.item.version
                commits += 1
            } catch let e as APIError where e.code == .quotaExceeded {
                refused = e
            }
        }
        let usage = try await q.usage()
        try check(refused != nil && commits < 200, "commits stop at the quota: \(commits) went in, usage \(usage)")
        try check(usage.figures.usage <= 1 << 20, "the usage never passes the quota: \(usage)")
        try check(refused?.quota == QuotaFigures(usage: usage.figures.usage, quota: 1 << 20), "the refusal says the figures: \(String(describing: refused))")
        // A delete still goes; the next commit after history pruning would fit again.
        let deleted = try await q.g.f.commit(file, base: base, q.g.f.draft(.file, "big-list.bin", chunks: list, t: 300_000, deleted: true))
        try check(deleted.outcome == .applied, "a delete goes through at the quota, got \(deleted.outcome)")
    }

    /// Content stops counting when the garbage collector frees it: here a file's content
    /// replaced (its earlier version pruned, keep 0/0) and collected after the grace; then the
    /// refused upload goes in. (A deleted file's last version still refers to its chunks, so
    /// deleting alone frees nothing: docs/deploy.md "Quotas".)
    static func freedChunksStopCounting(_ q: QuotaFixture) async throws {
        let s: Int64 = 1_000_000_000
        let a = try await q.upload("a", 100_000), small = try await q.upload("small", 10_000)
        let (file, v1) = try await q.g.f.create(.file, "f.bin", chunks: [a])
        try await q.setQuota(150_000)
        _ = try await q.refusedUpload("b", 100_000)
        let metadata = try await q.usage().metadata
        _ = try await q.g.f.commit(file, base: v1, q.g.f.draft(.file, "f.bin", chunks: [small], t: 2_000), now: s)
        try await q.expectUsage(110_000, chunks: 2)  // counted until collected
        try check(try await q.usage().metadata < metadata * 2, "the pruned version's metadata went with it")
        let report = try await q.g.collect(now: 7_200 * s, grace: 3_600)
        try check(report.chunks == 1 && report.bytes == 100_000, "the replaced content is freed, got \(report)")
        try await q.expectUsage(10_000, chunks: 1)
        try await q.upload("b", 100_000, now: 7_200 * s)
        try await q.expectUsage(110_000, chunks: 2)
    }
}

/// A `GCFixture` with chunks of exact sizes and the quota calls of account "alice".
public struct QuotaFixture: Sendable {
    public let g: GCFixture

    /// `size` distinct bytes for `tag`.
    func bytes(_ tag: String, _ size: Int) -> ByteBuffer {
        let unit = Array("\(tag)|".utf8)
        return ByteBuffer(bytes: (0..<size).map { unit[$0 % unit.count] })
    }

    func ref(_ tag: String, _ size: Int) -> ChunkRef {
        let b = bytes(tag, size)
        return ChunkRef(hash: ChunkHashing.sha256(b), size: Int64(size))
    }

    @discardableResult
    func setQuota(_ bytes: Int64?) async throws -> AccountUsage {
        try await g.f.store.setQuota(account: g.f.a.accountName, bytes: bytes)
    }

    @discardableResult
    func upload(_ tag: String, _ size: Int, by device: DeviceRecord? = nil, now: Int64 = 0) async throws -> ChunkRef {
        let b = bytes(tag, size)
        let hash = ChunkHashing.sha256(b)
        try await ChunkUploads.store(b, as: hash, account: (device ?? g.f.a).accountID, store: g.f.store, chunks: g.chunks, clock: { now })
        return ChunkRef(hash: hash, size: Int64(size))
    }

    /// The upload is refused as `quota_exceeded`; returns the error.
    func refusedUpload(_ tag: String, _ size: Int, by device: DeviceRecord? = nil) async throws -> APIError {
        do {
            try await upload(tag, size, by: device)
        } catch let e as APIError where e.code == .quotaExceeded {
            return e
        }
        throw FixtureError("the upload of \(tag) (\(size) bytes) passed the quota")
    }

    /// `usage` bytes of content (its metadata comes on top) in `chunks` chunks.
    func expectUsage(_ usage: Int64, chunks: Int64) async throws {
        let u = try await g.f.store.accountUsage(account: g.f.a.accountName)
        try check(u.count == 1 && u[0].figures.usage - u[0].metadata == usage && u[0].chunks == chunks && u[0].metadata >= 0,
                  "alice uses \(usage) bytes of content in \(chunks) chunks, got \(u)")
    }

    func usage() async throws -> AccountUsage {
        guard let u = try await g.f.store.accountUsage(account: g.f.a.accountName).first else { throw FixtureError("alice has no usage") }
        return u
    }

    /// The commit is refused as `quota_exceeded`; returns the error.
    func refusedCommit(_ item: ItemID, base: Int64?, _ draft: ItemDraft) async throws -> APIError {
        do {
            let r = try await g.f.commit(item, base: base, draft)
            throw FixtureError("the commit of \(draft.name.value) passed the quota: \(r.outcome)")
        } catch let e as APIError where e.code == .quotaExceeded {
            return e
        }
    }
}
