import NimbusCore

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
        if upload.deviceLocal { return .local }
        if let b = f.base, b.conflicts > 0 { return .conflict }
        if f.queued || upload.writing || (f.base == nil && !f.isRoot) { return f.unauthorized ? .error : .uploading }
        if remote.waitsNewer(than: f.base?.version ?? -1) { return .downloaded }
        guard let b = f.base, !b.complete else { return .current }
        if f.downloading { return .downloading }
        return b.anyPresent ? .partial : .cloud
    }
}
