import NimbusCore

// Recently Deleted (docs/trash.md): an entry is an item deleted on its own — a file, or a
// folder with the items deleted with it. Entries stay restorable, with their history and
// conflict versions, until `expires`; then the server purges them.

/// One entry of Recently Deleted.
public struct TrashEntry: Hashable, Sendable, Codable {
    /// The deleted item as it was when deleted (`deleted` is set).
    public var item: ItemRecord
    /// Where it was: the path of its folder by the names its folders have now, and its name.
    public var path: String
    /// When the server took the delete (ns since 1970).
    public var deletedAt: Int64
    /// The device that deleted it.
    public var deletedBy: DeviceID
    /// The server purges the entry after this (ns since 1970).
    public var expires: Int64
    /// Items in the entry: 1 for a file, the folder and everything deleted with it otherwise.
    public var items: Int
    /// The sizes of its files, added up.
    public var bytes: Int64

    public init(item: ItemRecord, path: String, deletedAt: Int64, deletedBy: DeviceID, expires: Int64, items: Int, bytes: Int64) {
        self.item = item
        self.path = path
        self.deletedAt = deletedAt
        self.deletedBy = deletedBy
        self.expires = expires
        self.items = items
        self.bytes = bytes
    }
}

/// `GET …/trash`: entries newest first.
public struct TrashResponse: Hashable, Sendable, Codable {
    public var entries: [TrashEntry]
    /// Pass as `after` for the next page; nil on the last page.
    public var next: String?
    /// How long the server keeps a deleted item (seconds).
    public var keepSeconds: Int64
    /// The whole of the container's Recently Deleted; on the first page only.
    public var total: TrashTotals?
    public init(entries: [TrashEntry], next: String?, keepSeconds: Int64, total: TrashTotals? = nil) {
        self.entries = entries
        self.next = next
        self.keepSeconds = keepSeconds
        self.total = total
    }
}

/// An amount of Recently Deleted: what a container's holds (`TrashResponse.total`), or what a
/// purge took (`TrashPurgeResponse`).
public struct TrashTotals: Hashable, Sendable, Codable {
    /// Entries (items deleted on their own).
    public var entries: Int
    /// Items in them (a folder's deleted descendants included).
    public var items: Int
    /// The sizes of their files, added up.
    public var bytes: Int64
    public init(entries: Int, items: Int, bytes: Int64) {
        self.entries = entries
        self.items = items
        self.bytes = bytes
    }
}

/// `GET …/trash/{item}/items`: an entry's items (the folder's deleted descendants included),
/// by id.
public struct TrashItemsResponse: Hashable, Sendable, Codable {
    public var entry: TrashEntry
    public var items: [ItemRecord]
    /// Pass as `after` for the next page; nil on the last page.
    public var next: ItemID?
    public init(entry: TrashEntry, items: [ItemRecord], next: ItemID?) {
        self.entry = entry
        self.items = items
        self.next = next
    }
}

/// `POST …/trash/{item}/restore`.
public struct TrashRestoreRequest: Hashable, Sendable, Codable {
    /// The folder to restore into; nil: where it was (its deleted folders come back too).
    public var to: ItemID?
    public init(to: ItemID? = nil) { self.to = to }
}

public struct TrashRestoreResponse: Hashable, Sendable, Codable {
    /// The entry's item as restored (it keeps its id).
    public var item: ItemRecord
    /// Items brought back: the entry's, and the deleted folders it needed.
    public var restored: Int
    /// The name was taken, so the item got another (`name 2.ext`).
    public var renamed: Bool
    /// The container's journal cursor after the restore.
    public var cursor: Int64
    public init(item: ItemRecord, restored: Int, renamed: Bool, cursor: Int64) {
        self.item = item
        self.restored = restored
        self.renamed = renamed
        self.cursor = cursor
    }
}

/// `DELETE …/trash/{item}` and `DELETE …/trash`: what was purged.
public typealias TrashPurgeResponse = TrashTotals
