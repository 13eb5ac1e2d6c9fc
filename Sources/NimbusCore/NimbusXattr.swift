/// The virtual attributes `user.nimbus.NAME` of a mount (docs/mount.md "Extended attributes",
/// docs/sync.md "Status and control"): one case each. The filesystem turns a name into this once,
/// at its edge; past it (the ports, the sync engine) only this type is spoken.
public enum NimbusXattr: String, CaseIterable, Sendable {
    /// The item's sync state (`ItemStatus`; `current` on a mount without a server).
    case status
    /// The item's id (a UUID).
    case itemid
    /// Bytes here or uploaded (`P% HAVE/SIZE`, `P% SENT/TOTAL uploaded`).
    case progress
    /// The server version this device has (`none` before the first upload).
    case version
    /// `1` when the item or a folder above it is pinned; written: pin (1) or unpin (0).
    case pinned
    /// The last failure of the item's upload or download (empty when none).
    case error
    /// How many unresolved conflict versions the server keeps of the item.
    case conflicts
    /// Written 1: drop the cached bytes.
    case evict
    /// Written 1: fetch every missing byte now.
    case download
    /// Written 1 / 0 on the root: pause or resume sync.
    case paused
    /// Read: every version the server keeps of the file (asks the server).
    case versions
    /// Written: keep `current` or a version, discarding the other conflict versions (asks the server).
    case resolve
    /// Written: make an earlier version current again (asks the server).
    case restore
    /// Written: discard one conflict version (asks the server).
    case discard
    /// Read: the `.nimbusignore` rule that ignores the item, `PATTERN (/FOLDER/.nimbusignore
    /// line N)`; absent (ENODATA) when none does. Not listed.
    case ignored

    public static let prefix = "user.nimbus."

    /// The case named by a full attribute name (`user.nimbus.status`); nil for any other name.
    public init?(name: String) {
        guard name.hasPrefix(Self.prefix) else { return nil }
        self.init(rawValue: String(name.utf8.dropFirst(Self.prefix.utf8.count))!)
    }

    /// The full attribute name.
    public var name: String { Self.prefix + rawValue }

    /// Listed by `listxattr` on every file and folder.
    public static let listed: [NimbusXattr] = [.status, .itemid]
    /// Listed too on a synced mount; the sync engine answers them from memory.
    public static let listedWhenSynced: [NimbusXattr] = [.progress, .version, .pinned, .error, .conflicts]

    /// Written to control the sync engine (`setfattr -n user.nimbus.pinned -v 1 FILE`).
    public var isControl: Bool {
        switch self {
        case .pinned, .evict, .download, .paused: true
        default: false
        }
    }

    /// Answered by the server: the filesystem defers its reply (bounded by the read timeout).
    public var needsServer: Bool {
        switch self {
        case .versions, .resolve, .restore, .discard: true
        default: false
        }
    }
}
