/// What kind of item this is. A kind never changes for an item id.
public enum ItemKind: String, Sendable, Codable, CaseIterable {
    case file, folder, symlink
}

/// One chunk of a file's content, in order. The list of chunks is the file's content record:
/// chunk boundaries are part of the version (DESIGN §3 "Content").
public struct ChunkRef: Hashable, Sendable, Codable {
    public var hash: ContentHash
    public var size: Int64
    public init(hash: ContentHash, size: Int64) {
        self.hash = hash
        self.size = size
    }
}

/// The content of an item: for a file its chunk list, for a symlink its target, for a folder nothing.
/// Two contents are "the same edit" when they are equal, whatever their modification times.
public struct ItemContent: Hashable, Sendable, Codable {
    public var chunks: [ChunkRef]
    public var symlinkTarget: String?

    public init(chunks: [ChunkRef] = [], symlinkTarget: String? = nil) {
        self.chunks = chunks
        self.symlinkTarget = symlinkTarget
    }

    public var size: Int64 {
        if let t = symlinkTarget { return Int64(t.utf8.count) }
        return chunks.reduce(0) { $0 + $1.size }
    }

    public static let empty = ItemContent()
}

/// Where an item is: its folder and its name there.
public struct ItemLocation: Hashable, Sendable, Codable {
    public var parent: ItemID
    public var name: ItemName
    public init(parent: ItemID, name: ItemName) {
        self.parent = parent
        self.name = name
    }
}

/// A complete state of an item: what one version records.
///
/// `modified` (nanoseconds since the epoch) and `modifiedBy` decide the conflict rule; `extra` is a
/// JSON object of fields this build does not know, kept verbatim (rule 8 of DESIGN §5).
public struct ItemState: Hashable, Sendable, Codable {
    public var kind: ItemKind
    public var location: ItemLocation
    public var content: ItemContent
    public var mode: UInt32
    public var modified: Int64
    public var modifiedBy: DeviceID
    public var deleted: Bool
    public var extra: String?

    public init(
        kind: ItemKind, location: ItemLocation, content: ItemContent = .empty, mode: UInt32,
        modified: Int64, modifiedBy: DeviceID, deleted: Bool = false, extra: String? = nil
    ) {
        self.kind = kind
        self.location = location
        self.content = content
        self.mode = mode
        self.modified = modified
        self.modifiedBy = modifiedBy
        self.deleted = deleted
        self.extra = extra
    }

    public var size: Int64 { content.size }

    /// Whether `self` is later than `other` under the conflict rule: later modification time,
    /// ties broken by the larger device id (an arbitrary but total, device-independent order).
    public func winsOver(_ other: ItemState) -> Bool {
        if modified != other.modified { return modified > other.modified }
        if modifiedBy != other.modifiedBy { return modifiedBy > other.modifiedBy }
        // Same time and device: order by content so the rule stays a total order.
        return content.chunks.map(\.hash.hex).joined() > other.content.chunks.map(\.hash.hex).joined()
    }
}
