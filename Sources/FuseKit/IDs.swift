@_exported import FuseIDs
import Glibc

// Node and handle ids are FuseKit's vocabulary: every request and reply carries them typed. The
// kernel's raw numbers are seen only here (`stat`), in Operations.swift (requests), Reply.swift
// (replies) and FuseSession.swift (notifications).

extension NodeID {
    /// No node (0). In an entry reply it makes a negative entry: the kernel caches "no such name"
    /// for the entry timeout. In a `readdirplus` listing the kernel takes no reference for it.
    public static let absent = NodeID(rawValue: 0)
}

extension HandleID {
    /// No handle (0): what `opendir` answers when the filesystem keeps no state per listing.
    public static let absent = HandleID(rawValue: 0)
}

extension stat {
    /// The node these attributes describe (`st_ino`: what `stat` and `ls -i` show).
    public var node: NodeID {
        get { NodeID(rawValue: UInt64(st_ino)) }
        set { st_ino = ino_t(newValue.rawValue) }
    }
}
