/// The user extended attributes an item carries from device to device: every `user.*` name but
/// the virtual `user.nimbus.*` ones, within a budget (docs/mount.md "Extended attributes").
public enum UserXattrs {
    /// The bytes of an item's names and values together (ext4 keeps an inode's attributes in one
    /// 4 KiB block). A `setxattr` that would pass it answers `E2BIG`.
    public static let budget = 4096

    /// The names that sync (and that a remote state may set here: never one with a NUL, which
    /// no `setxattr` can make and which would split a `listxattr` answer).
    public static func synced(_ name: String) -> Bool {
        name.hasPrefix("user.") && !name.hasPrefix("user.nimbus.") && name.utf8.count <= 255 && !name.utf8.contains(0)
    }

    /// Bytes of names and values, as the budget counts them.
    public static func size(_ xattrs: [String: [UInt8]]) -> Int {
        xattrs.reduce(0) { $0 + $1.key.utf8.count + $1.value.count }
    }
}
