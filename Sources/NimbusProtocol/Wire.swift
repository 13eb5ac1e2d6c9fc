import Foundation
import NimbusCore

/// The protocol version this build speaks. The path carries the major version (`/v1/...`);
/// servers answer `Nimbus-Protocol: <n>` on every response so clients can tell what they talk to.
public enum NimbusProtocolVersion {
    public static let current = 1
    public static let header = "Nimbus-Protocol"
}

/// Limits the server enforces; clients use them to size their requests.
public enum ProtocolLimits {
    /// Largest chunk body accepted by `PUT /v1/chunks/{hash}`.
    public static let maxChunkSize = 16 * 1024 * 1024
    /// Largest JSON body accepted by any other request.
    public static let maxJSONBody = 1024 * 1024
    /// Largest JSON body of a commit or of `POST /v1/chunks/missing`: room for
    /// `maxChunksPerItem` chunk references (about 90 bytes each as JSON) beside the rest, so a
    /// file of the largest size the protocol carries can always be committed.
    public static let maxChunkListBody = 8 * 1024 * 1024
    /// Most chunks in one item version.
    public static let maxChunksPerItem = 50_000
    /// Longest long-poll, seconds.
    public static let maxWaitSeconds = 60
    /// Largest page of changes, items or versions.
    public static let maxPage = 1000
    /// Most bytes of item records in one page of changes, items or versions (one record, up to
    /// `maxChunksPerItem` chunk references, may pass it alone): a page is cut there and the
    /// client asks for the rest (`more`, `next`).
    public static let maxPageBytes = 8 * 1024 * 1024
    /// Longest symlink target, bytes: what Linux allows (PATH_MAX less its NUL), so every
    /// device can show every target it is sent.
    public static let maxSymlinkTarget = 4095
    /// Largest `extra` object, bytes of JSON.
    public static let maxExtraBytes = 16 * 1024
    /// A file of one chunk of at most this many bytes has its bytes in the commit that sends it
    /// (`CommitRequest.inline`) and in the changes page that carries it (`ChangesResponse.inline`),
    /// up to `inlinePageBytes` and `inlinePageChunks` per page (each is one read of the chunk
    /// store: a local file, or an S3 GET).
    public static let inlineFileBytes = 64 * 1024
    public static let inlinePageBytes = 1024 * 1024
    public static let inlinePageChunks = 16
    /// Most commits in one `POST …/commits` (its body is held to `maxChunkListBody`).
    public static let maxBatchCommits = 64
}

/// An item as the server reports it: its current state plus bookkeeping.
public struct ItemRecord: Hashable, Sendable, Codable {
    public var id: ItemID
    /// The journal sequence of the last change to this item (its state or its conflict set).
    /// A commit's `baseVersion` is compared with this.
    public var version: Int64
    public var kind: ItemKind
    public var parent: ItemID
    public var name: ItemName
    public var size: Int64
    public var chunks: [ChunkRef]
    public var symlinkTarget: String?
    public var mode: UInt32
    /// Modification time, nanoseconds since 1970-01-01 UTC.
    public var modified: Int64
    public var modifiedBy: DeviceID
    public var deleted: Bool
    /// Unresolved conflict versions of this item.
    public var conflicts: Int
    public var extra: JSONValue?

    public init(id: ItemID, version: Int64, state: ItemState, conflicts: Int) {
        self.id = id
        self.version = version
        self.kind = state.kind
        self.parent = state.location.parent
        self.name = state.location.name
        self.size = state.size
        self.chunks = state.content.chunks
        self.symlinkTarget = state.content.symlinkTarget
        self.mode = state.mode
        self.modified = state.modified
        self.modifiedBy = state.modifiedBy
        self.deleted = state.deleted
        self.conflicts = conflicts
        self.extra = state.extra.flatMap { JSONValue.parse($0) }
    }

    public var state: ItemState {
        ItemState(
            kind: kind, location: ItemLocation(parent: parent, name: name),
            content: ItemContent(chunks: chunks, symlinkTarget: symlinkTarget), mode: mode,
            modified: modified, modifiedBy: modifiedBy, deleted: deleted, extra: extra.map { $0.serialized() })
    }
}

/// The state a device wants an item to have. Every commit carries the whole state; the server
/// works out what changed relative to `baseVersion` (see `ConflictRules`).
public struct ItemDraft: Hashable, Sendable, Codable {
    public var kind: ItemKind
    public var parent: ItemID
    public var name: ItemName
    public var chunks: [ChunkRef]
    public var symlinkTarget: String?
    public var mode: UInt32
    public var modified: Int64
    public var deleted: Bool
    public var extra: JSONValue?

    public init(kind: ItemKind, parent: ItemID, name: ItemName, chunks: [ChunkRef] = [], symlinkTarget: String? = nil,
                mode: UInt32, modified: Int64, deleted: Bool = false, extra: JSONValue? = nil) {
        self.kind = kind
        self.parent = parent
        self.name = name
        self.chunks = chunks
        self.symlinkTarget = symlinkTarget
        self.mode = mode
        self.modified = modified
        self.deleted = deleted
        self.extra = extra
    }

    public init(_ r: ItemRecord) {
        self.init(kind: r.kind, parent: r.parent, name: r.name, chunks: r.chunks, symlinkTarget: r.symlinkTarget,
                  mode: r.mode, modified: r.modified, deleted: r.deleted, extra: r.extra)
    }

    public func state(by device: DeviceID) -> ItemState {
        ItemState(kind: kind, location: ItemLocation(parent: parent, name: name),
                  content: ItemContent(chunks: chunks, symlinkTarget: symlinkTarget), mode: mode,
                  modified: modified, modifiedBy: device, deleted: deleted, extra: extra.map { $0.serialized() })
    }
}

/// `POST /v1/containers/{container}/commit`.
public struct CommitRequest: Hashable, Sendable, Codable {
    public var item: ItemID
    /// The item version this device last saw; `nil` for a create.
    public var baseVersion: Int64?
    public var state: ItemDraft
    /// For a folder delete: the device's journal cursor. Descendants changed after it survive
    /// (and keep the folder alive); the others are deleted with the folder. Omitted: 0, so a folder
    /// with live children is not deleted.
    public var seenCursor: Int64?
    /// The bytes of the state's chunk when the file is one chunk of at most `inlineFileBytes`
    /// (absent: none): the server stores it as an upload and commits, with no `chunks/missing`
    /// or chunk `PUT` before (`InlineChunk.checkCommit`).
    public var inline: [InlineChunk]?
    /// The state's folder and name apply only if no one moved the item since `baseVersion` (absent:
    /// false). A device sends it for a place it did not choose: the name beside a local-only item
    /// of its own that a remote item arrived at (docs/sync.md).
    public var placeIfUnmoved: Bool?

    public init(item: ItemID, baseVersion: Int64?, state: ItemDraft, seenCursor: Int64? = nil, inline: [InlineChunk]? = nil,
                placeIfUnmoved: Bool? = nil) {
        self.item = item
        self.baseVersion = baseVersion
        self.state = state
        self.seenCursor = seenCursor
        self.inline = inline
        self.placeIfUnmoved = placeIfUnmoved
    }
}

/// `POST /v1/containers/{container}/commits`: several commits in one request, applied in the
/// order sent, each on its own (one refused does not stop the ones after it). A device sends the
/// commits of its queue this way when several are ready (`CommitBatch`).
public struct CommitBatchRequest: Hashable, Sendable, Codable {
    public var commits: [CommitRequest]
    public init(commits: [CommitRequest]) { self.commits = commits }
}

/// The answers to a `CommitBatchRequest`, one per commit in its order: the commit's answer, or
/// the error (and HTTP status) it would have had alone.
public struct CommitBatchResponse: Hashable, Sendable, Codable {
    public struct Result: Hashable, Sendable, Codable {
        public var ok: CommitResponse?
        public var status: Int?
        public var error: ErrorBody.Detail?
        public init(ok: CommitResponse) { self.ok = ok }
        public init(status: Int, error: ErrorBody.Detail) {
            self.status = status
            self.error = error
        }
    }
    public var results: [Result]
    public init(results: [Result]) { self.results = results }
}

public enum CommitOutcome: String, Hashable, Sendable, Codable {
    /// The state was applied as sent (possibly merged with changes the device had not seen).
    case applied
    /// Nothing changed: the state was already current (a retry, an identical save).
    case unchanged
    /// Both this device and another changed the content; both are kept. `yours` says which one
    /// became current.
    case conflict
    /// A delete lost against an edit made since the device's base: the item stays.
    case deleteIgnored = "delete_ignored"
}

public struct CommitResponse: Hashable, Sendable, Codable {
    public var outcome: CommitOutcome
    /// For a conflict: whether the sent state became `current` or a `conflict` version.
    public var yours: String?
    /// The item after the commit.
    public var item: ItemRecord
    /// The name was taken in the folder, so the item got another (`name 2.ext`).
    public var renamed: Bool
    /// Folders that were deleted and came back because this item lives in them.
    public var restored: [ItemID]
    /// The container's journal cursor after the commit.
    public var cursor: Int64

    public init(outcome: CommitOutcome, yours: String? = nil, item: ItemRecord, renamed: Bool = false, restored: [ItemID] = [], cursor: Int64) {
        self.outcome = outcome
        self.yours = yours
        self.item = item
        self.renamed = renamed
        self.restored = restored
        self.cursor = cursor
    }
}

public enum ChangeKind: String, Hashable, Sendable, Codable {
    case create, update, move, delete, restore, conflict, resolve
}

/// One journal entry: the item's state as of this sequence number.
public struct Change: Hashable, Sendable, Codable {
    public var seq: Int64
    public var kind: ChangeKind
    public var device: DeviceID
    public var item: ItemRecord
    public init(seq: Int64, kind: ChangeKind, device: DeviceID, item: ItemRecord) {
        self.seq = seq
        self.kind = kind
        self.device = device
        self.item = item
    }
}

/// `GET /v1/containers/{container}/changes?since=N&wait=S&limit=L`.
public struct ChangesResponse: Hashable, Sendable, Codable {
    public var changes: [Change]
    /// Pass this as `since` next time.
    public var cursor: Int64
    /// More changes are waiting: ask again at once.
    public var more: Bool
    /// The bytes of the small files of this page (absent: none): a device shows them without
    /// asking for their chunk. Only a file of one chunk of at most `inlineFileBytes`, up to
    /// `inlinePageBytes` and `inlinePageChunks` in all; a file left out is fetched as usual.
    public var inline: [InlineChunk]?
    public init(changes: [Change], cursor: Int64, more: Bool, inline: [InlineChunk]? = nil) {
        self.changes = changes
        self.cursor = cursor
        self.more = more
        self.inline = inline
    }
}

/// A chunk's bytes carried in an answer (base64 in JSON). The receiver checks them against
/// `hash` like any downloaded chunk.
public struct InlineChunk: Hashable, Sendable, Codable {
    public var hash: ContentHash
    public var bytes: Data
    public init(hash: ContentHash, bytes: Data) {
        self.hash = hash
        self.bytes = bytes
    }

    /// What is wrong with the inline bytes of a commit (nil: nothing): at most one chunk, of
    /// the state's own one-chunk content, of the size the state gives it and at most
    /// `inlineFileBytes`. The server checks the bytes against the hash as it stores them.
    public static func checkCommit(_ r: CommitRequest) -> String? {
        guard let inline = r.inline, !inline.isEmpty else { return nil }
        guard inline.count == 1, let c = inline.first else { return "a commit carries the bytes of at most one chunk, not \(inline.count)" }
        guard r.state.kind == .file, r.state.chunks.count == 1, let ref = r.state.chunks.first, ref.hash == c.hash else {
            return "inline chunk \(c.hash) is not the one chunk of the committed file; upload it with PUT /v1/chunks/{hash}"
        }
        guard c.bytes.count <= ProtocolLimits.inlineFileBytes else {
            return "inline chunk of \(c.bytes.count) bytes is over \(ProtocolLimits.inlineFileBytes); upload it with PUT /v1/chunks/{hash}"
        }
        guard Int64(c.bytes.count) == ref.size else { return "inline chunk has \(c.bytes.count) bytes; the state says \(ref.size)" }
        return nil
    }
}

/// `GET /v1/containers/{container}/items?after=ID&limit=N`: a page of live items, by id.
public struct ItemsResponse: Hashable, Sendable, Codable {
    public var items: [ItemRecord]
    /// The journal cursor when this page was read. Pull changes since the cursor of the first page
    /// after listing, to catch what changed while paging.
    public var cursor: Int64
    /// Pass as `after` for the next page; `nil` on the last page.
    public var next: ItemID?
    public init(items: [ItemRecord], cursor: Int64, next: ItemID?) {
        self.items = items
        self.cursor = cursor
        self.next = next
    }
}

public enum VersionRole: String, Hashable, Sendable, Codable {
    /// The state the folder shows.
    case current
    /// An earlier current state (history).
    case previous
    /// An unresolved conflict version.
    case conflict
}

public struct VersionRecord: Hashable, Sendable, Codable {
    public var version: Int64
    public var role: VersionRole
    public var deviceName: String
    public var state: ItemRecord
    public init(version: Int64, role: VersionRole, deviceName: String, state: ItemRecord) {
        self.version = version
        self.role = role
        self.deviceName = deviceName
        self.state = state
    }
}

public struct VersionsResponse: Hashable, Sendable, Codable {
    public var versions: [VersionRecord]
    /// More versions are older than these: ask again with `before=next`.
    public var next: Int64?
    public init(versions: [VersionRecord], next: Int64? = nil) {
        self.versions = versions
        self.next = next
    }
}

/// What one page may still take: records are admitted while their bytes stay within
/// `ProtocolLimits.maxPageBytes` (the first always) and the page holds fewer than `limit`.
public struct PageBudget: Sendable {
    public let limit: Int
    public let bytes: Int
    public private(set) var count = 0
    public private(set) var used = 0

    public init(limit: Int, bytes: Int = ProtocolLimits.maxPageBytes) {
        self.limit = limit
        self.bytes = bytes
    }

    /// Takes a record of `size` bytes; false (nothing taken) when the page is full.
    public mutating func admit(_ size: Int) -> Bool {
        guard count < limit, count == 0 || used + size <= bytes else { return false }
        count += 1
        used += size
        return true
    }
}

/// `POST /v1/containers/{container}/items/{id}/resolve`.
public struct ResolveRequest: Hashable, Sendable, Codable {
    public enum Action: String, Hashable, Sendable, Codable {
        /// Keep the current version; discard every unresolved conflict version.
        case keepCurrent = "keep_current"
        /// Make `version` (a conflict or previous version) current; discard the other conflict versions.
        case keepVersion = "keep_version"
        /// Discard the conflict versions listed in `versions`; the current version stays.
        case discard
        /// Make the previous version `version` current again; conflict versions stay.
        case restore
    }
    public var action: Action
    public var version: Int64?
    public var versions: [Int64]?
    public init(action: Action, version: Int64? = nil, versions: [Int64]? = nil) {
        self.action = action
        self.version = version
        self.versions = versions
    }
}

public struct ContainerInfo: Hashable, Sendable, Codable {
    public var name: String
    public var cursor: Int64
    public init(name: String, cursor: Int64) {
        self.name = name
        self.cursor = cursor
    }
}

public struct WhoAmI: Hashable, Sendable, Codable {
    public var account: String
    public var device: DeviceID
    public var deviceName: String
    public var protocolVersion: Int
    public init(account: String, device: DeviceID, deviceName: String, protocolVersion: Int) {
        self.account = account
        self.device = device
        self.deviceName = deviceName
        self.protocolVersion = protocolVersion
    }
}

/// `POST /v1/chunks/missing`: which of these chunks does the server lack (for this account)?
public struct ChunkList: Hashable, Sendable, Codable {
    public var hashes: [ContentHash]
    public init(hashes: [ContentHash]) { self.hashes = hashes }
}

/// Every error answers this body with a stable `code` (see docs/protocol.md).
public struct ErrorBody: Hashable, Sendable, Codable {
    public struct Detail: Hashable, Sendable, Codable {
        public var code: String
        public var message: String
        public var missing: [ContentHash]?
        /// `quota_exceeded`: the bytes the account stores (its chunks, each counted once, with
        /// uploads under way) and its quota, both in bytes.
        public var usage: Int64?
        public var quota: Int64?
        public init(code: String, message: String, missing: [ContentHash]? = nil, usage: Int64? = nil, quota: Int64? = nil) {
            self.code = code
            self.message = message
            self.missing = missing
            self.usage = usage
            self.quota = quota
        }
    }
    public var error: Detail
    public init(code: String, message: String, missing: [ContentHash]? = nil, usage: Int64? = nil, quota: Int64? = nil) {
        error = Detail(code: code, message: message, missing: missing, usage: usage, quota: quota)
    }
}

/// An account's stored bytes against its quota, as `quota_exceeded` and `nimbus admin quota`
/// report them.
public struct QuotaFigures: Hashable, Sendable, Codable {
    /// Bytes of the chunks the account owns, each counted once, plus uploads under way.
    public var usage: Int64
    /// The most the account may store; nil: no quota.
    public var quota: Int64?
    public init(usage: Int64, quota: Int64?) {
        self.usage = usage
        self.quota = quota
    }
}

/// Container names: like item names, plus reverse-DNS friendly and no leading dot.
public enum ContainerName {
    public static func problem(_ s: String) -> String? {
        if s.isEmpty { return "a container name cannot be empty" }
        if s.utf8.count > 255 { return "a container name can be at most 255 bytes" }
        let ok = s.utf8.allSatisfy { b in
            (b >= 48 && b <= 57) || (b >= 65 && b <= 90) || (b >= 97 && b <= 122) || b == 45 || b == 46 || b == 95
        }
        if !ok { return "a container name may use only letters, digits, '.', '-' and '_' (like com.example.notes)" }
        if s.hasPrefix(".") { return "a container name cannot start with '.'" }
        return nil
    }
}

extension JSONValue {
    /// Compact JSON text with sorted keys, so equal values serialize equally.
    public func serialized() -> String {
        let enc = JSONEncoder()
        enc.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return (try? String(decoding: enc.encode(self), as: UTF8.self)) ?? "null"
    }

    public static func parse(_ text: String) -> JSONValue? {
        try? JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
    }
}
