import NimbusCore
import NimbusProtocol

/// The write state of a file at one instant, as the upload reads it around chunking: its write
/// generation, whether a write, truncation or identity transfer is under way, and whether it was
/// written since its last fsync.
public struct WriteMoment: Sendable, Equatable {
    public var generation: UInt64
    public var changing: Bool
    public var unsynced: Bool
    public init(generation: UInt64, changing: Bool, unsynced: Bool) {
        self.generation = generation
        self.changing = changing
        self.unsynced = unsynced
    }
}

extension CommitPlan {
    /// Where a commit's content comes from: a placeholder not downloaded was not changed here,
    /// so its chunks are the base's; anything else is read from the cache file.
    public enum ContentSource: Sendable, Equatable {
        case none
        case base([ChunkRef])
        case read
    }

    public static func contentSource(isFile: Bool, base: Base?) -> ContentSource {
        guard isFile else { return .none }
        if let base, !base.complete { return .base(base.record.chunks) }
        return .read
    }

    /// Whether what was chunked between `before` and `after` is one state of the file: no write,
    /// truncation or identity transfer ended while it was read (the generation is the same) and
    /// none is under way (its bytes land before its generation moves). A snapshot of a file kept
    /// open is good only at the generation its quiet period saw; otherwise a writer mid-save
    /// (opened since the push decided) waits for its close or fsync.
    public static func isOneState(before: WriteMoment?, after: WriteMoment?, snapshot: UInt64?) -> Bool {
        guard let before, let after, !before.changing, !after.changing, before.generation == after.generation else { return false }
        if let snapshot { return after.generation == snapshot }
        return !after.unsynced
    }

    /// How a commit's content reaches the server.
    public enum ContentSend: Sendable, Equatable {
        /// The content is the base's, which the server has (it sent it): nothing to send.
        case known
        /// One chunk of at most `ProtocolLimits.inlineFileBytes`: its bytes go inside the commit
        /// (`CommitRequest.inline`), one request instead of three.
        case inline
        /// Ask which chunks the server lacks (`chunks/missing`) and upload those first.
        case ask
    }

    /// How `chunks` go up. The base's content needs nothing unless the server said since that
    /// chunks are gone; after that answer a small file asks too (a server that does not take
    /// inline bytes answers `missing_chunks` to them). `inlineAllowed`: a commit will carry them
    /// (content sent apart from the queue has no commit of its own).
    public static func contentSend(chunks: [ChunkRef], known: [ChunkRef]?, chunksMissing: Bool, inlineAllowed: Bool = true) -> ContentSend {
        guard chunks != known || chunksMissing else { return .known }
        if inlineAllowed, !chunksMissing, chunks.count == 1, chunks[0].size <= Int64(ProtocolLimits.inlineFileBytes) { return .inline }
        return .ask
    }

    /// What a delete of an item deleted here is sent on.
    public enum DeleteBase: Sendable, Equatable {
        /// The server has the delete already (the base is one): nothing to send.
        case alreadyDeleted
        /// On the base: an edit made elsewhere since wins.
        case base(ServerItem, version: Int64)
        /// No base: ask the server whether its create went in (its answer may have been lost).
        case askServer
    }

    public static func deleteBase(_ base: Base?) -> DeleteBase {
        guard let base else { return .askServer }
        return base.record.deleted ? .alreadyDeleted : .base(base.record, version: base.version)
    }
}

extension UploadFailure {
    /// What `user.nimbus.error` says of the failure (`error`: the failure's own text).
    public func message(_ error: String) -> String {
        guard case .overQuota(let f) = self else { return "upload failed: \(error)" }
        return Self.overQuotaMessage(f)
    }

    /// What the engine's last error says (`sync-error`).
    public func why(_ error: String) -> String {
        guard case .overQuota(let f) = self else { return error }
        return Self.overQuotaMessage(f)
    }

    /// What `user.nimbus.error` and `sync-error` say of an item refused for the quota.
    public static func overQuotaMessage(_ f: QuotaFigures?) -> String {
        let numbers = f.map { f in "it stores \(f.usage) bytes" + (f.quota.map { " of its quota of \($0) bytes" } ?? "") } ?? "the server gave no figures"
        return "not uploaded: the account is over its quota on the server (\(numbers)); the change is kept here and uploads by itself once there is room — free space on the server or ask its admin to raise the quota"
    }
}
