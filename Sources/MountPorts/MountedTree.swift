import FuseIDs
import LocalStore
import NimbusCore

// This file imports LocalStore, not NimbusProtocol: `ItemRecord` is the local row.

/// What the sync engine needs of the mounted tree: reading the local state of items and their
/// writers, showing server states, and the cache files of placeholders. `ContainerFS`
/// implements it and keeps the kernel's caches right for what it changes; the engine knows
/// nothing else of the filesystem. Every method may be called from any thread without the
/// engine's state lock held, and takes the tree's own lock briefly.
public protocol MountedTree: AnyObject, Sendable {
    /// The item as this device has it now (nil: not in the tree).
    func localState(_ id: ItemID) -> ItemRecord?
    /// How many renames or moves of the item made here the engine has heard of (nil: not in the
    /// tree): read when a remote state is planned (`RemoteState.unlessMovedSince`).
    func placeGeneration(_ id: ItemID) -> UInt64?
    /// Writers, unsynced writes and the write generation of a file (nil: not a file here).
    func writeState(_ id: ItemID) -> WriteState?
    /// The item's row, write state and pending safe save read at one instant (one lock).
    func snapshot(_ id: ItemID) -> TreeSnapshot
    /// Every item below a folder.
    func descendants(of id: ItemID) -> [ItemID]
    /// The folders above an item, nearest first.
    func ancestors(of id: ItemID) -> [ItemID]
    /// The item's path in the container (`/docs/a.txt`).
    func path(of id: ItemID) -> String
    /// Shows server states (the kernel's caches are told); `applied` runs for each as it is
    /// shown, under the tree's lock. Returns the ids not shown (folder missing, name taken, the
    /// file being written or changed here).
    func show(_ states: [RemoteState], applied: (ItemID) -> Void) -> [ItemID]
    /// Creates the cache file of a placeholder (its first download): a descriptor or -errno.
    func openCacheFile(_ item: ItemID) -> Int32
    /// Drops a file's cached bytes (and the kernel's pages of them) when `decide` (called under
    /// the tree's lock) agrees. ENOENT: not here; EISDIR: not a file; EBUSY: open, mid-save or
    /// refused by `decide`.
    func evictContent(_ item: ItemID, decide: () -> Bool) throws(Errno)
    /// A new file that may be the temporary of a safe save (renamed over another soon).
    func isPendingSafeSave(_ item: ItemID) -> Bool
    /// Open for writing now.
    func isBeingWritten(_ item: ItemID) -> Bool
    /// What the `.nimbusignore` files say of the item's place here (`.none` when it is not in
    /// the tree); nil while a rules file on the way is a placeholder or being written.
    func ignoreVerdict(_ item: ItemID) -> IgnoreVerdict?
    /// The same for an item at `path` (names from the root), there or not.
    func ignoreVerdict(path: [String], isFolder: Bool) -> IgnoreVerdict?
    /// Moves whenever a `.nimbusignore` is made, written, renamed, removed or shown here, or a
    /// folder moves: what the rules say of an item may have changed.
    var rulesGeneration: UInt64 { get }
}

extension MountedTree {
    public func show(_ states: [RemoteState]) -> [ItemID] {
        show(states, applied: { _ in })
    }
}
