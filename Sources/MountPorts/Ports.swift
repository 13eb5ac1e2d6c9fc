import FuseIDs
import LocalStore
import NimbusCore

// The ports through which the sync engine (SyncEngine target) plugs into the filesystem, in a
// target of their own with no libfuse: ContainerFS calls these protocols and the engine
// implements them; the engine calls `MountedTree` and ContainerFS implements it. Neither imports
// the other.

/// Where file content comes from. Local-only mounts use `LocalContent` (always present). The
/// sync engine answers `.pending` for placeholders, fetches the bytes into the cache file, then
/// calls `done` from any thread — the read is answered then (a deferred reply), so a FUSE
/// thread never waits on the network.
public protocol ContentProvider: Sendable {
    /// Whether bytes `range` of `item` are in its cache file now.
    func isPresent(_ item: ItemID, range: Range<Int64>) -> Bool
    /// Makes bytes `range` of `item` present; calls `done` exactly once (nil = success).
    func hydrate(_ item: ItemID, range: Range<Int64>, done: @escaping @Sendable (Errno?) -> Void)
    /// Called just before a program's truncation changes the item's cache file in place
    /// (O_TRUNC, truncate(2)): downloads under way must not write into it afterwards.
    func willTruncate(_ item: ItemID)
}

extension ContentProvider {
    public func willTruncate(_ item: ItemID) {}
}

/// Everything is local (a mount without `--server`).
public struct LocalContent: ContentProvider {
    public init() {}
    public func isPresent(_ item: ItemID, range: Range<Int64>) -> Bool { true }
    public func hydrate(_ item: ItemID, range: Range<Int64>, done: @escaping @Sendable (Errno?) -> Void) { done(nil) }
}

/// A local change the sync engine must push. Delivered after the change is in memory and queued
/// for the local database, on the thread that made it; implementations must not block and must
/// not call back into the filesystem synchronously.
public enum LocalChange: Sendable, Equatable {
    case created(ItemID)
    /// Content was written; delivered when the writer closes or fsyncs (the upload trigger).
    case contentChanged(ItemID)
    case moved(ItemID)
    case attributesChanged(ItemID)
    case deleted(ItemID)
    /// The first write after the last close/fsync/flush: the content is changing. Not an upload
    /// trigger (the file is mid-save) but a durable note, so a `kill -9` before the close does
    /// not lose the edit (the restart uploads it), and the start of the quiet-period clock.
    case writing(ItemID)
}

extension LocalChange {
    /// The upload queue's entry for this change (`StoreChange.syncOp`). The tree queues it right
    /// behind the change, before the observer hears of it: a change the store has committed
    /// has its entry committed with it or in the next commit, whenever the notice arrives.
    public var queued: (item: ItemID, kind: SyncOpKind) {
        switch self {
        case .created(let i): (i, .created)
        case .contentChanged(let i), .writing(let i): (i, .content)
        case .moved(let i): (i, .moved)
        case .attributesChanged(let i): (i, .attributes)
        case .deleted(let i): (i, .deleted)
        }
    }
}

public protocol ChangeObserver: Sendable {
    func localChange(_ change: LocalChange)
}

/// What a sync engine reports: per item for `user.nimbus.status`, and lines for
/// `.nimbus/status`. Called with the filesystem lock held: answer from memory, at once.
public protocol SyncStatusSource: Sendable {
    /// `user.nimbus.status` of `item`.
    func itemStatus(_ item: ItemID) -> ItemStatus
    /// `key: value` lines replacing or adding to the local ones (`connection`, queues…).
    func statusLines() -> [(String, String)]
    /// One of `NimbusXattr.listedWhenSynced` of `item`; nil = not answered here (ENODATA).
    /// `ancestors`: the ids of the folders above the item, nearest first (for inherited pins).
    func itemAttribute(_ name: NimbusXattr, item: ItemID, ancestors: [ItemID]) -> String?
    /// Items with unresolved conflict versions and their counts (`.nimbus/conflicts`).
    func conflictedItems() -> [(ItemID, Int)]
    /// Whether the server keeps unresolved conflict versions of `item` (from memory, lock held).
    func hasConflictVersions(_ item: ItemID) -> Bool
}

extension SyncStatusSource {
    public func conflictedItems() -> [(ItemID, Int)] { [] }
    public func hasConflictVersions(_ item: ItemID) -> Bool { false }
}

/// What `setfattr -n user.nimbus.NAME` asks of the sync engine: `pinned` (keep the content
/// here), `evict` (drop it), `download` (fetch it now), and on the root `paused`. Called
/// without the filesystem lock held; may call back into the filesystem.
public protocol SyncControl: Sendable {
    /// `name` is one whose `isControl` holds; `value` the text written (trailing newline or
    /// blanks dropped).
    func setItemAttribute(_ name: NimbusXattr, value: String, item: ItemID, isFolder: Bool) throws(Errno)
}

/// What needs the server: versions of a file, their bytes, resolving conflicts. Every call
/// answers through `done` exactly once, from any thread, within the engine's read timeout (EIO
/// when the server cannot answer), and is made without the filesystem lock: the FUSE adapter
/// defers its reply, so no FUSE thread waits on the network.
public protocol VersionSource: Sendable {
    /// The other (conflict and earlier) versions of a file.
    func versionEntries(_ item: ItemID, done: @escaping @Sendable (Result<[VersionEntry], Errno>) -> Void)
    /// `user.nimbus.versions`: every version of the file, one line each.
    func versionsText(_ item: ItemID, done: @escaping @Sendable (Result<String, Errno>) -> Void)
    /// One version, to read (`VersionReader`).
    func openVersion(_ item: ItemID, version: Int64, done: @escaping @Sendable (Result<any VersionReader, Errno>) -> Void)
    /// `user.nimbus.resolve`, `restore` or `discard` set to `value`.
    func resolve(_ name: NimbusXattr, value: String, item: ItemID, done: @escaping @Sendable (Errno?) -> Void)

    // Recently Deleted (`.nimbus/trash/`, docs/trash.md).

    /// Every entry, newest first.
    func trashEntries(done: @escaping @Sendable (Result<[TrashEntryInfo], Errno>) -> Void)
    /// The items of entry `root` (the root included).
    func trashMembers(_ root: ItemID, done: @escaping @Sendable (Result<[TrashMemberInfo], Errno>) -> Void)
    /// File `item` of entry `root`, to read.
    func openTrashFile(_ root: ItemID, item: ItemID, done: @escaping @Sendable (Result<any VersionReader, Errno>) -> Void)
    /// Purges entry `root`.
    func purgeTrash(_ root: ItemID, done: @escaping @Sendable (Errno?) -> Void)
}

/// The bytes of one version, read a range at a time.
public protocol VersionReader: Sendable {
    var size: Int64 { get }
    /// Bytes `range` (clamped to the size); `done` exactly once, from any thread.
    func read(_ range: Range<Int64>, done: @escaping @Sendable (Result<[UInt8], Errno>) -> Void)
}
