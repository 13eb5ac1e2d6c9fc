import NimbusCore
import NimbusProtocol

/// The metadata store of the server: accounts and devices, containers, items, versions and the
/// journal. One engine per database kind (SQLite now, PostgreSQL later); every engine must pass
/// `StoreConformance` in NimbusTesting.
///
/// Every mutating call is one transaction: it either happens whole or not at all, and it allocates
/// journal sequence numbers without gaps. The race rules are `ConflictRules` (NimbusCore); engines
/// only load the states they compare and store the decision.
public protocol ServerStore: Sendable {
    /// Creates the account if new and a device in it; `tokenHash` is the SHA-256 of the token.
    func addDevice(account: String, deviceName: String, tokenHash: String) async throws -> DeviceRecord
    /// The device whose token hashes to `tokenHash`, if any and not revoked.
    func device(tokenHash: String) async throws -> DeviceRecord?
    /// Changes whenever a device is revoked (read by every instance once a second: `Revocations`).
    func revocationMark() async throws -> RevocationMark
    /// Every device of every account (or of `account`), by account then name.
    func devices(account: String?) async throws -> [DeviceListing]
    /// Revokes the device of `account` named `device` (or with that id): its token stops working.
    /// Returns it as now listed. `device_not_found` if there is none; `bad_request` if the name
    /// is shared by several devices (name the id then).
    func revokeDevice(account: String, device: String, now: Int64) async throws -> DeviceListing
    /// A web session's use (docs/web.md): `.start` marks device `id` as a web session used now;
    /// otherwise a web session used within `idleSeconds` lives (true; `.use` marks it used now,
    /// `.check` does not), and one idle longer is revoked (false). A device that is no web
    /// session: true, nothing changes.
    func webSession(_ id: DeviceID, _ use: WebSessionUse, now: Int64, idleSeconds: Int64) async throws -> Bool
    /// Keeps a one-time pairing code (its SHA-256) for a new device of `account` named
    /// `deviceName`, usable until `expires` (seconds since 1970).
    func addPairing(account: Int64, codeHash: String, deviceName: String, createdBy: DeviceID, expires: Int64) async throws
    /// Spends a pairing code: in one transaction the code is marked used and the new device is
    /// added to the code's account with `tokenHash` (named `deviceName`, else as the code says).
    /// Nil when no unused code that has not expired at `now` has that hash.
    func redeemPairing(codeHash: String, deviceName: String?, tokenHash: String, now: Int64) async throws -> DeviceRecord?

    /// The container `name` of the account; created when `create` is set and it does not exist.
    func container(account: Int64, name: String, create: Bool) async throws -> ContainerRecord?
    /// The container's journal cursor (its last sequence number; 0 when empty).
    func cursor(of container: ContainerRecord) async throws -> Int64

    /// Applies one commit under the race rules (docs/protocol.md "Commit"). Chunks must already be recorded for
    /// the account (`recordChunk`).
    func commit(_ request: CommitRequest, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> CommitResponse
    /// Several commits in this order, each on its own as `commit` (`POST …/commits`): one
    /// result per request.
    func commitAll(_ requests: [CommitRequest], in container: ContainerRecord, by device: DeviceRecord, now: Int64) async -> [Result<CommitResponse, any Error>]
    /// Resolves conflicts or restores a version.
    func resolve(_ request: ResolveRequest, item: ItemID, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> CommitResponse

    /// Journal entries after `since`, oldest first, at most `limit` and `PageBudget`'s bytes
    /// (`more` when cut).
    func changes(in container: ContainerRecord, since: Int64, limit: Int) async throws -> ChangesResponse
    /// Live items ordered by id, after `after`, at most `limit` and `PageBudget`'s bytes.
    func items(in container: ContainerRecord, after: ItemID?, limit: Int) async throws -> ItemsResponse
    /// One item (also a deleted one, with `deleted` set).
    func item(_ id: ItemID, in container: ContainerRecord) async throws -> ItemRecord?
    /// The live items in `folder`, ordered by name (its bytes), after the name `after`, at most
    /// `limit` (the web view's pages).
    func children(of folder: ItemID, in container: ContainerRecord, after: String?, limit: Int) async throws -> [ItemRecord]
    /// The names of the account's containers, ordered by name.
    func containers(account: Int64) async throws -> [String]
    /// Where an item is, and what it is, without reading its state (a breadcrumb's step).
    func place(of id: ItemID, in container: ContainerRecord) async throws -> ItemPlace?
    // Recently Deleted (docs/trash.md, CommitEngine+Trash).

    /// Entries newest first, after `after`, at most `limit`, each with where it was.
    func trash(in container: ContainerRecord, after: TrashCursor?, limit: Int) async throws -> [TrashListed]
    /// What the container's Recently Deleted holds.
    func trashTotals(in container: ContainerRecord) async throws -> TrashTotals
    /// Entry `id` with its items (nil when `id` is not an entry).
    func trashEntry(_ id: ItemID, in container: ContainerRecord) async throws -> TrashListed?
    /// Brings entry `id` back (`not_in_trash` when it is not one), into `folder` or where it was:
    /// a commit of every item in it (journal kind `restore`).
    func restoreTrash(_ id: ItemID, to folder: ItemID?, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> TrashRestoreResponse
    /// Purges entries `ids` (those that are entries), or every entry when nil.
    func purgeTrash(_ ids: [ItemID]?, in container: ContainerRecord) async throws -> TrashPurgeResponse
    /// Purges every entry of every container deleted before `cutoff` (server time, ns).
    func expireTrash(deletedBefore cutoff: Int64) async throws -> TrashPurgeResponse
    /// Purges the oldest entries of `account` (any of its containers), oldest first, until their
    /// bytes add up to `bytes` or none is left; returns what went and the chunks the purged
    /// versions referred to (to free at once: `ChunkCollector.reclaim`).
    func purgeOldestTrash(account: Int64, bytes: Int64) async throws -> (response: TrashPurgeResponse, chunks: Set<ContentHash>)

    /// A page of the current, previous and unresolved conflict versions of an item, newest
    /// first, older than `before` (nil: from the newest), at most `ProtocolLimits.maxPage` and
    /// `PageBudget`'s bytes; `next` when cut.
    func versions(of id: ItemID, in container: ContainerRecord, before: Int64?) async throws -> VersionsResponse

    // Chunks. An account owns a chunk (a row of `account_chunks`) once its bytes are stored; the
    // ownership carries a lease time (`touched`) that the garbage collector respects
    // (`ChunkCollector`, where the rules that make it race-free are written down).

    /// Records that the account owns a chunk, touched at `now`, without an upload (test fixtures
    /// whose chunks have no bytes). `busy` while the chunk's bytes are being deleted.
    func recordChunk(account: Int64, hash: ContentHash, size: Int64, now: Int64) async throws
    /// The sizes of those of `hashes` that the account owns (no lease refresh: reads).
    func ownedChunks(account: Int64, hashes: [ContentHash]) async throws -> [ContentHash: Int64]
    /// Like `ownedChunks`, and touches each owned one at `now` (never back in time) in the same
    /// write: what this answers stays owned for at least the collector's grace period from `now`.
    func claimChunks(account: Int64, hashes: [ContentHash], now: Int64) async throws -> [ContentHash: Int64]
    /// Starts an upload of `hash` (`size` bytes) by `account`: records it as in flight (the
    /// collector leaves its chunk alone, and its size counts against the account's quota until
    /// it ends) and says whether the account already owns the chunk. `busy` while the chunk's
    /// bytes are being deleted; `quota_exceeded` when the account does not own the chunk, no
    /// upload of it by the account is under way, and its usage (`accountUsage`) plus `size`
    /// would pass its quota — decided in one transaction serialized per account (Quotas.swift).
    func beginChunkUpload(account: Int64, hash: ContentHash, size: Int64, now: Int64) async throws -> ChunkUpload
    /// Ends an upload whose bytes are stored: the account owns the chunk, touched at `now`.
    /// `busy` if the collector reclaimed the upload as stale meanwhile (the bytes may be gone:
    /// upload again).
    func finishChunkUpload(_ upload: ChunkUpload, size: Int64, now: Int64) async throws
    /// Forgets an upload that failed.
    func abandonChunkUpload(_ upload: ChunkUpload) async throws
    /// `beginChunkUpload` for each of `chunks` in order, each answered on its own (one refused
    /// leaves the others), in as few transactions as the store can.
    func beginChunkUploads(account: Int64, chunks: [(hash: ContentHash, size: Int64)], now: Int64) async -> [Result<ChunkUpload, any Error>]
    /// `finishChunkUpload` for each of `uploads` in order, each answered on its own (nil: done),
    /// in as few transactions as the store can.
    func finishChunkUploads(_ uploads: [(upload: ChunkUpload, size: Int64)], now: Int64) async -> [(any Error)?]
    /// Sets the quota of `account` in bytes (nil: none) and returns its usage as now.
    /// `bad_request` when there is no such account. Lowering it below the usage refuses further
    /// uploads of new chunks only (Quotas.swift).
    func setQuota(account: String, bytes: Int64?) async throws -> AccountUsage
    /// The usage and quota of every account (or of `account`; empty if unknown), by name.
    func accountUsage(account: String?) async throws -> [AccountUsage]
    /// Every chunk some account owns.
    func ownedChunkHashes() async throws -> Set<ContentHash>

    /// Every chunk any version refers to (for consistency checks and the collector's dry run).
    func referencedChunks() async throws -> Set<ContentHash>

    // The collector's primitives (`ChunkCollector` holds the procedure).

    /// Runs `body` while holding the store-wide collector lock; nil (without running it) when
    /// another collector, in this or another process or instance, holds it. The lock dies with
    /// its holder (a session advisory lock, a `flock`), so a crashed collector never blocks one.
    func withCollectorLock<T: Sendable>(_ body: @Sendable () async throws -> T) async throws -> T?
    /// Chunks whose bytes a collector set out to delete and did not confirm (it crashed or the
    /// chunk store failed). Only meaningful under the collector lock.
    func chunkDeletions() async throws -> [ContentHash]
    /// Ends those deletions: their bytes are gone; uploads of them are accepted again.
    func forgetChunkDeletions(_ hashes: [ContentHash]) async throws
    /// One consistent snapshot: each container's cursor, and every chunk that no version refers
    /// to and that has an ownership or upload last touched at or before `cutoff`.
    func markChunks(staleAt cutoff: Int64) async throws -> ChunkMark
    /// One transaction over `hashes` (candidates of `mark`): takes the ownerships and uploads
    /// still untouched since `cutoff` of chunks that no version refers to now, and for each chunk
    /// left with neither, records its deletion (`chunkDeletions`) before returning it.
    func sweepChunks(_ hashes: [ContentHash], mark: ChunkMark, staleAt cutoff: Int64, now: Int64) async throws -> ChunkSweep
    /// Invariant violations found in the stored data; empty when consistent.
    func consistencyProblems() async throws -> [String]
    /// Statements sent to an external database and the times a thread waited for answers, so
    /// far (nil for the embedded engine).
    var databaseRoundTrips: DatabaseRoundTrips? { get }
}

/// An entry of Recently Deleted as a store lists it: where it was, and (for one entry asked
/// for by id) its items.
public struct TrashListed: Sendable {
    public var row: TrashRow
    public var path: String
    public var items: [StoredItem]?
    public init(row: TrashRow, path: String, items: [StoredItem]? = nil) {
        self.row = row
        self.path = path
        self.items = items
    }
}

/// What a request does with a web session (`ServerStore.webSession`).
public enum WebSessionUse: Sendable {
    /// Signed in now.
    case start
    /// Used by the person at the browser: a page, a form, an upload.
    case use
    /// Asked by the page itself (live refresh): the session must be alive, but this is no use.
    case check
}

/// An upload in flight (`beginChunkUpload`).
public struct ChunkUpload: Sendable, Hashable {
    public var id: Int64
    public var account: Int64
    public var hash: ContentHash
    /// The account owned the chunk when the upload began.
    public var owned: Bool
}

/// What `markChunks` saw.
public struct ChunkMark: Sendable {
    /// Each container's journal cursor at the mark. A version row is written with a new sequence
    /// number of its container, so every version written after the mark has a sequence above it.
    public var cursors: [Int64: Int64]
    /// Unreferenced chunks with a stale ownership or upload.
    public var candidates: [ContentHash: Candidate]

    public struct Candidate: Sendable, Hashable {
        /// The chunk's size, when an ownership records it.
        public var size: Int64?
        /// Every ownership and upload of the chunk is stale: a sweep would delete its bytes.
        public var freeable: Bool
    }

    /// The containers whose journal moved since the mark, with the cursor to read versions after.
    public func moved(now current: [Int64: Int64]) -> [(container: Int64, after: Int64)] {
        current.compactMap { id, cursor in
            let then = cursors[id] ?? 0
            return cursor > then ? (id, then) : nil
        }.sorted { $0.container < $1.container }
    }
}

/// What one `sweepChunks` did.
public struct ChunkSweep: Sendable {
    /// Chunks that lost their last ownership and upload: their deletion is recorded, the caller
    /// deletes their bytes next. Size nil when only an upload claimed the chunk.
    public var doomed: [(hash: ContentHash, size: Int64?)] = []
    /// Ownerships removed (of doomed chunks and of chunks another account still owns).
    public var released = 0
    public init() {}
}

/// A device as `nimbus admin list-devices` shows it.
/// An item's kind and place (`ServerStore.place`).
public struct ItemPlace: Hashable, Sendable {
    public var kind: ItemKind
    public var parent: ItemID
    public var name: String
    public var deleted: Bool
    public init(kind: ItemKind, parent: ItemID, name: String, deleted: Bool) {
        self.kind = kind
        self.parent = parent
        self.name = name
        self.deleted = deleted
    }
}

public struct DeviceListing: Hashable, Sendable {
    public var id: DeviceID
    public var name: String
    public var account: String
    /// Seconds since 1970.
    public var created: Int64
    /// Seconds since 1970 when revoked; nil while the token works.
    public var revoked: Int64?
    /// A web view's session: when it was last used (seconds since 1970, to the minute); nil for
    /// other devices.
    public var webUsed: Int64?
    public init(id: DeviceID, name: String, account: String, created: Int64, revoked: Int64?, webUsed: Int64? = nil) {
        self.id = id
        self.name = name
        self.account = account
        self.created = created
        self.revoked = revoked
        self.webUsed = webUsed
    }
}

extension [DeviceListing] {
    /// The one device `device` names (its id, or its name when no other device has it).
    func one(named device: String, account: String) throws -> DeviceListing {
        let byID = filter { $0.id.description == device.lowercased() }
        if let d = byID.first { return d }
        let named = filter { $0.name == device }
        if named.count > 1 {
            throw APIError(.badRequest, "account \(account) has \(named.count) devices named \(device.debugDescription) (\(named.map(\.id.description).joined(separator: ", "))); name one by its id")
        }
        guard let d = named.first else {
            throw APIError(.deviceNotFound, "account \(account) has no device \(device.debugDescription); list them with `nimbus admin list-devices`")
        }
        return d
    }
}

/// Counts of `ServerStore.databaseRoundTrips` (`/metrics`).
public struct DatabaseRoundTrips: Sendable {
    public var statements: Int64
    public var waits: Int64
}

extension ServerStore {
    public var databaseRoundTrips: DatabaseRoundTrips? { nil }

    /// One after the other, each its own transaction.
    public func beginChunkUploads(account: Int64, chunks: [(hash: ContentHash, size: Int64)], now: Int64) async -> [Result<ChunkUpload, any Error>] {
        var out: [Result<ChunkUpload, any Error>] = []
        for c in chunks {
            do { out.append(.success(try await beginChunkUpload(account: account, hash: c.hash, size: c.size, now: now))) } catch { out.append(.failure(error)) }
        }
        return out
    }

    /// One after the other, each its own transaction.
    public func finishChunkUploads(_ uploads: [(upload: ChunkUpload, size: Int64)], now: Int64) async -> [(any Error)?] {
        var out: [(any Error)?] = []
        for u in uploads {
            do { try await finishChunkUpload(u.upload, size: u.size, now: now); out.append(nil) } catch { out.append(error) }
        }
        return out
    }

    /// One after the other, each its own transaction (an engine without group commit).
    public func commitAll(_ requests: [CommitRequest], in container: ContainerRecord, by device: DeviceRecord, now: Int64) async -> [Result<CommitResponse, any Error>] {
        var out: [Result<CommitResponse, any Error>] = []
        for r in requests {
            do { out.append(.success(try await commit(r, in: container, by: device, now: now))) } catch { out.append(.failure(error)) }
        }
        return out
    }
}

extension APIError {
    /// A pairing code (or a login's `--device`) names a device the account already has.
    static func deviceNameTaken(_ name: String) -> APIError {
        APIError(.deviceNameTaken, "this account already has a device named \(name.debugDescription); pick another name, or revoke that device first (`nimbus device revoke`)")
    }
}

extension ServerStore {
    /// Every version of an item, newest first, page after page (for tools and tests; the
    /// protocol answers a page at a time).
    public func versions(of id: ItemID, in container: ContainerRecord) async throws -> [VersionRecord] {
        var all: [VersionRecord] = []
        var before: Int64?
        repeat {
            let page = try await versions(of: id, in: container, before: before)
            all += page.versions
            before = page.next
        } while before != nil
        return all
    }
}

extension ServerStore {
    /// Purges `due` (entries by container, as `expireTrash` found them), adding what went to
    /// `total`.
    func purgeDue(_ due: [(ContainerRecord, ItemID)], into total: inout TrashPurgeResponse) async throws {
        for (container, ids) in Dictionary(grouping: due, by: \.0).sorted(by: { $0.key.id < $1.key.id }) {
            let r = try await purgeTrash(ids.map(\.1), in: container)
            total.entries += r.entries
            total.items += r.items
            total.bytes += r.bytes
        }
    }
}
