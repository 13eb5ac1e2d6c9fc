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
/// until history pruning but never listed.
public enum StoredRole: String, Sendable {
    case current, previous, conflict, discarded
}

/// The primitive reads and writes of one open write transaction. Each engine implements these on
/// its own database; `CommitEngine` holds the rules, so every engine behaves the same.
/// All calls happen inside one transaction that the engine commits only if the whole operation
/// succeeds.
protocol StoreTransaction {
    func loadItem(_ id: ItemID) throws -> StoredItem?
    /// The state that was current at `version`: the newest row that was ever current with
    /// `seq <= version`; nil when history no longer has it.
    func stateCurrent(at version: Int64, of id: ItemID) throws -> ItemState?
    func isNameTaken(parent: ItemID, name: String, excluding id: ItemID) throws -> Bool
    func liveChildren(of id: ItemID) throws -> [StoredItem]
    /// Allocates the next journal sequence number of the container.
    func nextSeq() throws -> Int64
    func saveItem(_ item: StoredItem) throws
    func currentVersionSeq(of id: ItemID) throws -> Int64?
    func insertVersion(item: ItemID, seq: Int64, role: StoredRole, wasCurrent: Bool, state: ItemState) throws
    func setRole(item: ItemID, seq: Int64, role: StoredRole) throws
    func version(item: ItemID, seq: Int64) throws -> (role: StoredRole, state: ItemState)?
    func versionSeqs(item: ItemID, role: StoredRole) throws -> [Int64]
    func appendJournal(seq: Int64, kind: ChangeKind, item: StoredItem, device: DeviceID) throws
    func ownedChunks(_ hashes: [ContentHash]) throws -> [ContentHash: Int64]
}
