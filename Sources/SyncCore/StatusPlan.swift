import NimbusCore
import NimbusProtocol

/// What `SyncItem.status` needs besides the item's own record: its base and presence, the
/// queue and the connection. Read under the engine's lock.
public struct StatusFacts: Sendable, Equatable {
    /// The synced base, nil when the item was never synced.
    public struct Base: Sendable, Equatable {
        public var version: Int64
        public var conflicts: Int
        /// Every chunk is here.
        public var complete: Bool
        /// At least one chunk is here.
        public var anyPresent: Bool
        public init(version: Int64, conflicts: Int, complete: Bool, anyPresent: Bool) {
            self.version = version
            self.conflicts = conflicts
            self.complete = complete
            self.anyPresent = anyPresent
        }
    }

    public var base: Base?
    /// The container's root (never uploaded itself, so never "uploading" for lack of a base).
    public var isRoot: Bool
    /// In the upload queue or being pushed.
    public var queued: Bool
    /// A chunk download of it is queued or under way.
    public var downloading: Bool
    /// The server refuses this device's token: nothing uploads.
    public var unauthorized: Bool

    public init(base: Base?, isRoot: Bool = false, queued: Bool = false, downloading: Bool = false, unauthorized: Bool = false) {
        self.base = base
        self.isRoot = isRoot
        self.queued = queued
        self.downloading = downloading
        self.unauthorized = unauthorized
    }
}

extension SyncItem {
    /// The item's status, first match wins: refused upload (its state or the quota), device-local, conflict versions,
    /// local changes waiting (an error while the token is refused), a newer version held back,
    /// then presence.
    public func status(_ f: StatusFacts) -> ItemStatus {
        if upload.refused || upload.overQuota != nil { return .error }
        if upload.deviceLocal { return .localOnly }
        if let b = f.base, b.conflicts > 0 { return .conflict }
        if f.queued || upload.writing || (f.base == nil && !f.isRoot) { return f.unauthorized ? .error : .uploading }
        if remote.waitsNewer(than: f.base?.version ?? -1) { return .downloaded }
        guard let b = f.base, !b.complete else { return .current }
        if f.downloading { return .downloading }
        return b.anyPresent ? .partial : .cloud
    }
}

extension SyncItem {
    /// `user.nimbus.error`: why its upload was refused; while the server refuses this device's
    /// token, that a change here waits for a valid one; else the last failure's text ("" when
    /// none).
    public func errorText(_ f: StatusFacts) -> String {
        if upload.refused { return upload.error ?? "the server refused the upload (see the mount log)" }
        if f.unauthorized, f.queued || upload.writing || f.base == nil {
            return "not uploaded: the server refused this device's token (revoked or wrong); the change is kept — mount again with a valid --token-file"
        }
        return upload.error ?? ""
    }
}

public enum ProgressText {
    /// `user.nimbus.progress`: its upload under way (`sent`/`total` bytes), else how much of a
    /// file's content is here ("100% 0/0" for what is not a synced file).
    public static func of(uploading: (sent: Int64, total: Int64)?, base: Base?) -> String {
        if let u = uploading { return "\(u.total == 0 ? 100 : Int(u.sent * 100 / u.total))% \(u.sent)/\(u.total) uploaded" }
        guard let b = base, b.record.kind == .file else { return "100% 0/0" }
        let size = b.offsets[b.offsets.count - 1]
        let have = b.presentBytes
        return "\(size == 0 ? 100 : Int(have * 100 / size))% \(have)/\(size)"
    }
}

extension ItemTable {
    /// The `quota:` line of `.nimbus/status` while items wait for room on the account: the
    /// figures of the latest refusal and how many wait; nil when none does.
    public var quotaLine: String? {
        // Read on every status read: only the waiting records are gathered, and the latest is
        // found without sorting (ties go to the highest id, so the line does not depend on
        // hashing order).
        var waiting: [(id: ItemID, at: Instant, figures: QuotaFigures?)] = []
        for id in busy {
            guard case .overQuota(let at, let figures)? = all[id]?.upload.failure else { continue }
            waiting.append((id, at, figures))
        }
        guard let latest = waiting.max(by: { ($0.at, $0.id) < ($1.at, $1.id) }) else { return nil }
        let numbers = latest.figures.map { f in "uses \(f.usage) bytes" + (f.quota.map { " of \($0)" } ?? "") } ?? "no figures"
        return "over (\(numbers)); \(waiting.count) item(s) wait for room, retried every \(UploadState<Instant>.quotaRetrySeconds) s"
    }
}
