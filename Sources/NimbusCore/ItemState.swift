/// What kind of item this is. A kind never changes for an item id.
public enum ItemKind: String, Sendable, Codable, CaseIterable {
    case file, folder, symlink
}

/// One chunk of a file's content, in order. The list of chunks is the file's content record:
/// chunk boundaries are part of the version (docs/protocol.md "Items and versions").
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
/// JSON object of fields this build does not know, kept verbatim (docs/protocol.md "Items and versions").
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

/// The ranges every side keeps item metadata in.
public enum ItemLimits {
    static let day: Int64 = 86_400 * 1_000_000_000
    /// Times, nanoseconds since 1970: what an Int64 holds (1677…2262), less a day at each end, so
    /// that a later time (`+ 1`) or a day's margin never overflows. A time outside it (a file
    /// touched to the year 1600 or 2300) is clamped into it, as Linux clamps a time to what a
    /// filesystem can store.
    public static let time: ClosedRange<Int64> = (Int64.min + day)...(Int64.max - day)

    /// `seconds` + `nanoseconds` (a `timespec`) as nanoseconds since 1970, clamped into `time`.
    /// Never traps, whatever the two numbers are.
    public static func time(seconds: Int64, nanoseconds: Int64) -> Int64 {
        let (whole, over) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if over { return seconds < 0 ? time.lowerBound : time.upperBound }
        let (sum, over2) = whole.addingReportingOverflow(nanoseconds)
        if over2 { return nanoseconds < 0 ? time.lowerBound : time.upperBound }
        return min(max(sum, time.lowerBound), time.upperBound)
    }

    /// Nanoseconds since 1970 as (seconds, nanoseconds 0…999,999,999), rounding down: a time
    /// before 1970 has a negative second and a positive nanosecond, as `timespec` requires.
    public static func split(_ t: Int64) -> (seconds: Int64, nanoseconds: Int64) {
        let (q, r) = t.quotientAndRemainder(dividingBy: 1_000_000_000)
        return r < 0 ? (q - 1, r + 1_000_000_000) : (q, r)
    }

    /// The permission bits an item carries between devices: rwx for all and the sticky bit.
    /// Set-user-id and set-group-id never travel: a file that arrives from another device (or
    /// from whoever holds a token of the account) must not become a set-id program of the local
    /// mount's owner (often root).
    public static let syncedPermissions: UInt32 = 0o1777
}
