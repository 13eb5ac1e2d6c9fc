import FuseIDs
import NimbusCore

/// One item as the client keeps it: what `stat` shows plus its place in the tree.
///
/// `node` is the number the kernel sees (`st_ino`, `ls -i`): assigned once when the item first
/// appears on this device and stored, so it is the same across remounts. Times are nanoseconds
/// since the epoch. `parent` is `nil` only for the root.
public struct ItemRecord: Sendable, Equatable {
    public var id: ItemID
    public var node: NodeID
    public var parent: ItemID?
    public var name: String
    public var kind: ItemKind
    /// Full st_mode including the file-type bits.
    public var mode: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var size: Int64
    public var atime: Int64
    public var mtime: Int64
    public var ctime: Int64
    public var btime: Int64
    /// Symlink target; non-nil exactly for symlinks.
    public var target: String?
    /// The device number of a character or block device node (`st_rdev`); 0 otherwise.
    public var rdev: UInt64 = 0
    /// The server version this state is based on; `nil` until the item has been synced.
    public var version: Int64?
    /// Changed locally since `version` (the sync engine's upload queue reads this).
    public var dirty: Bool

    public init(id: ItemID, node: NodeID, parent: ItemID?, name: String, kind: ItemKind, mode: UInt32,
                uid: UInt32, gid: UInt32, size: Int64 = 0, time: Int64, target: String? = nil) {
        self.id = id; self.node = node; self.parent = parent; self.name = name; self.kind = kind
        self.mode = mode; self.uid = uid; self.gid = gid; self.size = size
        self.atime = time; self.mtime = time; self.ctime = time; self.btime = time
        self.target = target; self.version = nil; self.dirty = true
    }
}

extension ItemRecord {
    /// A FIFO, a socket or a device node (kind `file`, its type in `mode`): it lives on this
    /// device only and is never synced (docs/posix.md "Local-only items").
    public var isSpecial: Bool {
        let type = mode & 0o170000
        return kind == .file && type != 0 && type != 0o100000
    }
}

/// A change to persist, in the order it happened.
public enum StoreChange: Sendable {
    case upsert(ItemRecord)
    case delete(ItemID)
    case setXattr(ItemID, name: String, value: [UInt8])
    case removeXattr(ItemID, name: String)
    /// An upload-queue entry for the sync engine (`sync_op`). Queued after the change it records.
    case syncOp(ItemID, kind: SyncOpKind)
    /// A file to delete once this change and every one before it are committed (a deleted
    /// item's trashed cache file: `ContentCache.trash`).
    case removeFile(String)
}

/// Everything the filesystem needs at mount time.
public struct StoreSnapshot: Sendable {
    public var items: [ItemRecord]
    public var xattrs: [ItemID: [String: [UInt8]]]
}
