import NimbusCore
import NimbusProtocol

/// An item row: the current state plus bookkeeping.
public struct StoredItem: Hashable, Sendable {
    public var id: ItemID
    /// Sequence of the last change to the item (state or conflict set).
    public var version: Int64
    public var conflicts: Int
    public var state: ItemState

    public var record: ItemRecord { ItemRecord(id: id, version: version, state: state, conflicts: conflicts) }
}

/// The role of a stored version row. `discarded` rows are resolved-away conflict versions, kept
/// until history pruning (`HistoryRetention`) but never listed.
public enum StoredRole: String, Sendable {
    case current, previous, conflict, discarded

    /// An earlier version: history that pruning may remove. Such a row records when it took this
    /// role (`retired`); the schema holds a time exactly on these rows.
    public var isEarlier: Bool { self == .previous || self == .discarded }
}

/// The primitive reads and writes of one open write transaction. Each engine implements these on
/// its own database; `CommitEngine` holds the rules, so every engine behaves the same.
/// All calls happen inside one transaction that the engine commits only if the whole operation
/// succeeds.
protocol StoreTransaction {
    func loadItem(_ id: ItemID) throws -> StoredItem?
    /// The state that was current at `version`: the newest row that was ever current with
    /// `seq <= version`; nil when history no longer has it — also when a row that was current
    /// was pruned above the one found (`historyFloor`), since the one found may then be too old.
    func stateCurrent(at version: Int64, of id: ItemID) throws -> ItemState?
    /// The item's first state (the oldest row that was ever current); nil when history no longer
    /// has it (any current row was pruned: the oldest ones go first).
    func firstState(of id: ItemID) throws -> ItemState?
    /// The states of the item made current after `version`, oldest first, each with the device
    /// whose commit or resolve made it (the journal's entry of the same seq; nil without one).
    func currentStatesMade(of id: ItemID, after version: Int64) throws -> [(seq: Int64, by: DeviceID?)]
    func isNameTaken(parent: ItemID, name: String, excluding id: ItemID) throws -> Bool
    func liveChildren(of id: ItemID) throws -> [StoredItem]
    /// Allocates the next journal sequence number of the container.
    func nextSeq() throws -> Int64
    func saveItem(_ item: StoredItem) throws
    func currentVersionSeq(of id: ItemID) throws -> Int64?
    func insertVersion(item: ItemID, seq: Int64, role: StoredRole, wasCurrent: Bool, state: ItemState) throws
    /// Gives a row a new role; `time` (server time, ns) is recorded as the row's `retired` time
    /// when the role `isEarlier`, and cleared otherwise.
    func setRole(item: ItemID, seq: Int64, role: StoredRole, at time: Int64) throws
    func version(item: ItemID, seq: Int64) throws -> (role: StoredRole, state: ItemState)?
    func versionSeqs(item: ItemID, role: StoredRole) throws -> [Int64]
    /// The item's earlier versions (`previous` and `discarded` rows), any order.
    func earlierVersions(of id: ItemID) throws -> [EarlierVersion]
    /// Deletes those version rows of the item. `historyFloor`, when given, is the newest deleted
    /// row that was ever current: the item remembers the largest such seq so that `stateCurrent`
    /// does not answer with an older state for a base inside the gap.
    func deleteVersions(item: ItemID, seqs: [Int64], historyFloor: Int64?) throws
    func appendJournal(seq: Int64, kind: ChangeKind, item: StoredItem, device: DeviceID) throws
    func ownedChunks(_ hashes: [ContentHash]) throws -> [ContentHash: Int64]
    /// Bytes this operation stored in version rows and journal entries (the account's metadata,
    /// which counts in its usage: Quotas.swift). `deleteVersions` takes the bytes of the rows it
    /// deletes off the container's count itself.
    var metadataAdded: Int64 { get }
    /// Adds `metadataAdded` to the container's count (once, at the end of the operation).
    func recordMetadata() throws
    /// The account's quota in bytes; nil when it has none.
    func accountQuota() throws -> Int64?
    /// The account's usage as this transaction sees it (its own writes included).
    func accountUsage() throws -> Int64

    // Recently Deleted (CommitEngine+Trash): a deleted item row carries when and by whom it was
    // deleted, the entry it belongs to (`trash_root`: its own id for an entry) and its bytes.

    /// Marks the deleted item `id` (its row saved) an entry of its own, deleted at `time` by
    /// `device`, holding `bytes`.
    func markTrashed(_ id: ItemID, at time: Int64, by device: DeviceID, bytes: Int64) throws
    /// Puts every entry whose item lies directly in `folder` and was deleted at or after `since`
    /// (and the items of those entries) into `folder`'s entry.
    func adoptTrash(into folder: ItemID, deletedSince since: Int64) throws
    /// The entry an item belongs to (asked just after the row was saved live again, too); nil
    /// when it has none.
    func trashRoot(of id: ItemID) throws -> ItemID?
    /// Clears the trash columns of an item that is live again.
    func clearTrash(_ id: ItemID) throws
    /// The deleted items of entry `root` (the root itself included), with their folders.
    func trashMembers(of root: ItemID) throws -> [(id: ItemID, parent: ItemID)]
    /// Moves these deleted items into entry `root`.
    func setTrashRoot(_ ids: [ItemID], to root: ItemID) throws
    /// Entries newest first (by deletion time, then id), after `after`, at most `limit`.
    func trashEntries(after: TrashCursor?, limit: Int) throws -> [TrashRow]
    /// Entry `id`, when it is one.
    func trashEntry(_ id: ItemID) throws -> TrashRow?
    /// What the container's Recently Deleted holds.
    func trashTotals() throws -> TrashTotals
    /// Deletes these items and every version row of theirs (the journal keeps what it said),
    /// remembering their ids (`wasPurged`); returns the chunks those rows referred to.
    func purgeItems(_ ids: [ItemID]) throws -> Set<ContentHash>
    /// Whether item `id` was purged from Recently Deleted (it has no row any more).
    func wasPurged(_ id: ItemID) throws -> Bool
}

/// Where a page of Recently Deleted ends: deletion time and id of its last entry.
public struct TrashCursor: Hashable, Sendable {
    public var deletedAt: Int64
    public var id: ItemID
    public init(deletedAt: Int64, id: ItemID) { self.deletedAt = deletedAt; self.id = id }
    /// `TrashResponse.next`: "TIME.ID".
    public init?(_ text: String) {
        let parts = text.split(separator: ".", maxSplits: 1)
        guard parts.count == 2, let t = Int64(parts[0]), let id = ItemID(String(parts[1])) else { return nil }
        self.init(deletedAt: t, id: id)
    }
    public var text: String { "\(deletedAt).\(id)" }
}

/// An entry of Recently Deleted as stored: its item's row, its counts and the deletion.
public struct TrashRow: Hashable, Sendable {
    public var item: StoredItem
    public var deletedAt: Int64
    public var deletedBy: DeviceID
    public var items: Int
    public var bytes: Int64
}

/// Counts `StoreTransaction.metadataAdded` (a transaction is a value; the count is shared).
final class MetadataCount {
    var bytes: Int64 = 0
}
