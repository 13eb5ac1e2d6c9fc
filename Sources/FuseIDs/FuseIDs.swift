// The kernel's two kinds of id, as their own types so that one cannot stand for the other (or
// for an `ItemID`, a count or an offset). FuseKit converts them to and from the kernel's raw
// numbers (`fuse_ino_t`, `fuse_file_info.fh`) and re-exports them; LocalStore stores each item's
// node id. This module has no dependencies, so both can use it: FuseKit stays free of Foundation
// and of Nimbus, LocalStore free of libfuse.

/// A node as the kernel knows it: `fuse_ino_t`, what `stat` shows as `st_ino`. The filesystem
/// chooses the number when it first answers a name with it; the kernel then names the node by it
/// until it forgets it.
public struct NodeID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }

    /// The root of every mount (libfuse's `FUSE_ROOT_ID`).
    public static let root = NodeID(rawValue: 1)

    /// The id numbered one above this one (for handing out ids in order).
    public var successor: NodeID { NodeID(rawValue: rawValue + 1) }

    public static func < (a: NodeID, b: NodeID) -> Bool { a.rawValue < b.rawValue }
    public var description: String { String(rawValue) }
}

/// An open file or directory listing as the kernel knows it: `fuse_file_info.fh`, chosen by the
/// filesystem at `open`, `create` or `opendir` and sent back with every request on it until
/// `release` or `releasedir`.
public struct HandleID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }

    /// The id numbered one above this one (for handing out ids in order).
    public var successor: HandleID { HandleID(rawValue: rawValue + 1) }

    public static func < (a: HandleID, b: HandleID) -> Bool { a.rawValue < b.rawValue }
    public var description: String { String(rawValue) }
}
