import NimbusCore
import NimbusProtocol

// Per-account quotas (`nimbus admin set-quota`, docs/deploy.md "Quotas").
//
// What counts: the bytes of the chunks the account owns (`account_chunks`: one row per chunk
// and account, so a chunk the account uploads twice, or refers to from many files, counts once),
// plus the chunks the account is uploading right now and does not own yet (`chunk_uploads` rows
// carry the account and size; several uploads of one chunk count once). Chunks another account
// also stores count for each owner: an account never learns that another has the same bytes. A
// chunk stops counting when the garbage collector takes the account's ownership (no version
// refers to it any more and the grace has passed: ChunkCollector), or when its upload ends
// without storing it.
//
// Recently Deleted (docs/trash.md) counts until it is purged; its bytes are reported apart
// (`AccountUsage.trash`). An upload that would pass the quota first purges the account's oldest
// entries (until their bytes cover what is missing) and frees their chunks at once
// (`ChunkCollector.reclaim`), then is admitted or refused as below.
//
// Where it is enforced: only when an upload begins (`beginChunkUpload`), before any byte is
// read or stored. The check and the record of the upload are one transaction that is
// serialized per account — SQLite's single writer; on PostgreSQL the account's row locked
// `FOR NO KEY UPDATE` (which leaves the `FOR KEY SHARE` of foreign-key checks alone) — so every
// upload admitted sees every other admitted upload's size. The bound is therefore exact: no
// interleaving of concurrent uploads takes owned + in-flight bytes past the quota. (An upload
// reclaimed by the collector as stale stops counting and its end answers `busy`; a server that
// crashed mid-upload leaves its size counted until the collector reclaims it after the grace.)
//
// Metadata counts too: the bytes of the account's version rows and journal entries (their JSON,
// chunk lists included), kept per container in `containers.meta_bytes` by every commit, resolve
// and history pruning (`StoreTransaction.recordMetadata`). Every chunk a commit refers to must
// already be owned (else `missing_chunks`), so its content was counted when it was uploaded; what
// the commit adds is its metadata, and a commit that leaves the account over its quota is refused
// and rolled back (`CommitEngine.checkQuota`), so no chunk list that reuses an owned chunk grows
// the server past the quota. Deletes always go through (even over quota, after the admin lowered
// it below the usage): they are how an account gets back under it.
public struct AccountUsage: Hashable, Sendable {
    public var account: String
    public var figures: QuotaFigures
    /// Chunks the account owns.
    public var chunks: Int64
    /// Bytes of its version rows and journal entries (part of `figures.usage`).
    public var metadata: Int64
    /// The file bytes of its Recently Deleted entries (docs/trash.md): part of `figures.usage`
    /// until purged, and purged oldest first when an upload would pass the quota.
    public var trash: Int64

    public init(account: String, figures: QuotaFigures, chunks: Int64, metadata: Int64, trash: Int64 = 0) {
        self.account = account
        self.figures = figures
        self.chunks = chunks
        self.metadata = metadata
        self.trash = trash
    }

    /// Bytes still free under the quota (0 when over it); nil without a quota.
    public var free: Int64? { figures.quota.map { max(0, $0 - figures.usage) } }
}

enum Quotas {
    /// The most a quota may be (a wire-safe byte count; 8 EiB is far beyond any disk).
    static let maxBytes = Int64.max / 2

    /// Refuses an upload of `size` bytes when `usage + size` would exceed `quota`.
    static func admit(usage: Int64, quota: Int64?, size: Int64) throws {
        guard let quota else { return }
        let (total, overflow) = usage.addingReportingOverflow(size)
        if overflow || total > quota { throw APIError.quotaExceeded(usage: usage, quota: quota, size: size) }
    }

    static func unknownAccount(_ name: String) -> APIError {
        APIError(.badRequest, "no account named \(name.debugDescription); accounts are made by `nimbus admin add-device` (list them with `nimbus admin list-devices`)")
    }
}
