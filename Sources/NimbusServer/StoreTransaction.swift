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
}

/// Counts `StoreTransaction.metadataAdded` (a transaction is a value; the count is shared).
final class MetadataCount {
    var bytes: Int64 = 0
}
