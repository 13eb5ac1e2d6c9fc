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

    /// The chunks the server lacks need asking for unless the content is the base's, which the
    /// server has (it sent them) — unless it said since that chunks are gone.
    public static func mustAskForMissing(chunks: [ChunkRef], known: [ChunkRef]?, chunksMissing: Bool) -> Bool {
        chunks != known || chunksMissing
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
