import LocalStore
import NimbusCore

// Values that cross between the mounted tree (ContainerFS) and the sync engine.

/// A server state to show on this device (the sync engine's pull).
public struct RemoteState: Sendable {
    public var id: ItemID
    public var parent: ItemID
    public var name: String
    public var kind: ItemKind
    /// Permission bits (`ItemLimits.syncedPermissions`: never set-user-id or set-group-id).
    public var perm: UInt32
    public var size: Int64
    public var mtime: Int64
    public var target: String?
    public var deleted: Bool
    /// The content differs from the cache file's: the cache file becomes an empty sparse file
    /// of `size` (a placeholder) whose bytes the content provider fetches on read.
    public var resetContent: Bool
    /// With `resetContent`: which bytes of the old content were here (nil: all). Handles open on
    /// the file keep reading the old bytes; reads outside these fail with EIO.
    public var oldPresent: (@Sendable (Range<Int64>) -> Bool)?
    /// The server version (for the event line).
    public var version: Int64 = 0
    /// The state is a restore from Recently Deleted (the journal's `restore`): a new item's
    /// event line says `restored` rather than `created`.
    public var restored = false
    /// With `resetContent`: the file's write generation (`WriteState.generation`) when the
    /// engine decided to replace it; a write or truncate since then keeps the file (skipped).
    public var unlessWrittenSince: UInt64?
    /// For a commit's answer: the place (folder, name) and permission bits the commit sent. An
    /// item renamed, moved or chmodded here since keeps its own (the engine pushes them next, on
    /// the answered version): an answer never undoes a later local change.
    public var sentPlace: (parent: ItemID, name: String, perm: UInt32)?
    /// The item's place generation the engine had heard of (`MountedTree.placeGeneration`) when
    /// it decided to show this state: a rename or move made here that it had not heard of then
    /// keeps the local place (the engine pushes it next, on this version).
    public var unlessMovedSince: UInt64?
    /// The item's user extended attributes in this state (nil: the state says nothing of them).
    /// They replace the local ones unless those changed here since (`sentXattrs`, or a change
    /// whose notice is on its way).
    public var xattrs: [String: [UInt8]]?
    /// For a commit's answer: the attributes the commit sent. Attributes changed here since keep
    /// their local values (the engine pushes them next, on the answered version).
    public var sentXattrs: [String: [UInt8]]?
    public init(id: ItemID, parent: ItemID, name: String, kind: ItemKind, perm: UInt32, size: Int64, mtime: Int64,
                target: String?, deleted: Bool, resetContent: Bool) {
        self.id = id; self.parent = parent; self.name = name; self.kind = kind; self.perm = perm; self.size = size
        self.mtime = mtime; self.target = target; self.deleted = deleted; self.resetContent = resetContent
    }
}

/// How a file is being written: open writers, writes since the last fsync, the write
/// counter and nanoseconds since the last write (for quiet-period uploads).
public struct WriteState: Sendable, Equatable {
    public init(writers: Int, unsynced: Bool, changing: Bool, generation: UInt64, idleNanoseconds: UInt64, dirty: Bool, written: UInt64,
                unnoticed: Bool = false) {
        self.unnoticed = unnoticed
        self.writers = writers
        self.unsynced = unsynced
        self.changing = changing
        self.generation = generation
        self.idleNanoseconds = idleNanoseconds
        self.dirty = dirty
        self.written = written
    }

    public var writers: Int
    public var unsynced: Bool
    /// A write or truncation is changing the bytes now (the generation moves when it is done):
    /// content read now or since the last generation may be torn.
    public var changing: Bool
    public var generation: UInt64
    public var idleNanoseconds: UInt64
    /// Written since the last close, flush or fsync.
    public var dirty: Bool
    /// Bytes programs wrote into this content so far (wrapping; restarts when a remote
    /// version or an identity transfer gives the item another node).
    public var written: UInt64
    /// A change of the content whose notice (`ChangeObserver.localChange`) has not been
    /// delivered yet.
    public var unnoticed: Bool
}

/// One non-current version of a file, as `.nimbus/versions/PATH/` lists it.
public struct VersionEntry: Sendable, Hashable {
    public let version: Int64
    public let device: String
    /// Modification time of that content, ns since 1970 UTC.
    public let modified: Int64
    public let size: Int64
    public let conflict: Bool
    public init(version: Int64, device: String, modified: Int64, size: Int64, conflict: Bool) {
        self.version = version
        self.device = device
        self.modified = modified
        self.size = size
        self.conflict = conflict
    }
}

/// An item as the tree has it at one instant (`MountedTree.snapshot`): what a push decides on.
public struct TreeSnapshot: Sendable {
    /// Its row (nil: not in the tree).
    public var local: ItemRecord?
    /// How the file is being written (nil: not a file here).
    public var write: WriteState?
    /// A new file that may be the temporary of an editor's save (`MountedTree.isPendingSafeSave`).
    public var pendingSafeSave: Bool
    /// Its user extended attributes (`user.*` but `user.nimbus.*`), which sync.
    public var xattrs: [String: [UInt8]]
    /// Its place is the name beside a local-only item this device chose for it, not a program's.
    public var placedBeside: Bool

    public init(local: ItemRecord?, write: WriteState?, pendingSafeSave: Bool, xattrs: [String: [UInt8]] = [:], placedBeside: Bool = false) {
        self.local = local
        self.write = write
        self.pendingSafeSave = pendingSafeSave
        self.xattrs = xattrs
        self.placedBeside = placedBeside
    }
}

/// An entry of Recently Deleted as `.nimbus/trash/` shows it.
public struct TrashEntryInfo: Sendable, Hashable {
    public let id: ItemID
    public let isFolder: Bool
    /// Where it was: "/folder/name".
    public let path: String
    /// ns since 1970 UTC.
    public let deletedAt: Int64
    public let device: String
    public let expires: Int64
    public let size: Int64
    public let mode: UInt32
    public let modified: Int64
    public init(id: ItemID, isFolder: Bool, path: String, deletedAt: Int64, device: String, expires: Int64, size: Int64, mode: UInt32, modified: Int64) {
        self.id = id
        self.isFolder = isFolder
        self.path = path
        self.deletedAt = deletedAt
        self.device = device
        self.expires = expires
        self.size = size
        self.mode = mode
        self.modified = modified
    }
}

/// One item of a Recently Deleted entry (a folder's deleted descendants too).
public struct TrashMemberInfo: Sendable, Hashable {
    public let id: ItemID
    public let parent: ItemID
    public let name: String
    public let isFolder: Bool
    public let isSymlink: Bool
    public let size: Int64
    public let mode: UInt32
    public let modified: Int64
    public init(id: ItemID, parent: ItemID, name: String, isFolder: Bool, isSymlink: Bool, size: Int64, mode: UInt32, modified: Int64) {
        self.id = id
        self.parent = parent
        self.name = name
        self.isFolder = isFolder
        self.isSymlink = isSymlink
        self.size = size
        self.mode = mode
        self.modified = modified
    }
}
