import NimbusProtocol

/// The server's state of an item (NimbusProtocol `ItemRecord`).
public typealias ServerItem = ItemRecord

/// Server states of one item that are not shown here yet, by what holds each back. Each slot
/// keeps the newest state it was given; a state the tree has overtaken is let go (`drop(upTo:)`).
public struct RemoteHolds: Sendable, Equatable {
    /// A program holds a lock on the file: applied under a write claim once the last lock goes.
    public internal(set) var forLock: ServerItem?
    /// The file is open for writing here, or the item's own push is queued or on its way: applied
    /// when the writer is done, or superseded by the push's answer.
    public internal(set) var forWriter: ServerItem?
    /// Its name is taken or its folder missing here, or it is a folder delete kept for local
    /// work: tried again after pushes and pulls, and by listing the container after a restart.
    public internal(set) var skipped: ServerItem?

    public init() {}

    public var isEmpty: Bool { forLock == nil && forWriter == nil && skipped == nil }

    /// The versions received and not shown here (`SeenCursor.forDelete`).
    public var heldVersions: [Int64] { [forLock, forWriter, skipped].compactMap { $0?.version } }

    /// A version newer than the one shown waits for a lock or a writer (`downloaded`).
    public func waitsNewer(than shown: Int64) -> Bool {
        (forLock?.version ?? -1) > shown || (forWriter?.version ?? -1) > shown
    }

    /// Holds for a writer keep the newest version only.
    public mutating func holdForWriter(_ item: ServerItem) {
        if (forWriter?.version ?? -1) < item.version { forWriter = item }
    }

    /// The version held for the writer or the push, let go to be shown now.
    public mutating func takeForWriter() -> ServerItem? {
        defer { forWriter = nil }
        return forWriter
    }

    /// After the item's push, or its writer's close: the version held for them goes in now unless
    /// a program still writes the file (`writing`: open for writing, or written and not yet
    /// flushed) or another push of it is queued (`queued`), which it waits for in turn.
    public mutating func releaseAfterPush(writing: Bool, queued: Bool) -> ServerItem? {
        writing || queued ? nil : takeForWriter()
    }

    /// `item` waits for the program's lock on the file to go; true when nothing waited for one
    /// yet (the first hold says so in the log and marks a relist).
    public mutating func holdForLock(_ item: ServerItem) -> Bool {
        defer { forLock = item }
        return forLock == nil
    }

    /// The write claim for a new version was granted: nothing waits for a lock any more.
    public mutating func lockClaimed() { forLock = nil }

    /// `item` waits until what keeps it from the tree has moved (tried after pushes and pulls).
    public mutating func skip(_ item: ServerItem) { skipped = item }

    /// The skipped state was shown.
    public mutating func skippedShown() { skipped = nil }

    /// A commit's answer at `version` came for the item: it supersedes the writer hold it covers
    /// and a skipped state older than it (a create skipped for a taken name and then deleted here
    /// must not be shown once the name is free).
    public mutating func answered(_ version: Int64) {
        if let h = forWriter, h.version <= version { forWriter = nil }
        if let s = skipped, s.version < version { skipped = nil }
    }

    /// Lets go of the lock and writer holds that version `shown` (or a newer one) covers.
    public mutating func drop(upTo shown: Int64) {
        if let p = forLock, p.version <= shown { forLock = nil }
        if let h = forWriter, h.version <= shown { forWriter = nil }
    }
}
