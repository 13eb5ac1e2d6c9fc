/// `user.nimbus.status` of an item (docs/sync.md "Status and control"): one value, derived in
/// one place (SyncCore `SyncItem.status`).
public enum ItemStatus: String, Sendable, CaseIterable {
    /// A placeholder: real size and times, no bytes here.
    case cloud
    /// Chunks of it are being fetched (or queued).
    case downloading
    /// Some chunks here.
    case partial
    /// All bytes here, but a newer version waits for a program's lock or writer.
    case downloaded
    /// All bytes here, and they are the server's current version.
    case current
    /// Changed here and not on the server yet: queued, being pushed, or still being written.
    case uploading
    /// The server refused its upload (also for the account's quota), or this device's token.
    case error
    /// Never leaves this device (FIFOs, sockets, device nodes, SQLite's journals).
    case localOnly = "local-only"
    /// The server keeps unresolved conflict versions of it.
    case conflict
}
