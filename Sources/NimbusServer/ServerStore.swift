import NimbusCore
import NimbusProtocol

/// The metadata store of the server: accounts and devices, containers, items, versions and the
/// journal. One engine per database kind (SQLite now, PostgreSQL later); every engine must pass
/// `StoreConformance` in NimbusTesting.
///
/// Every mutating call is one transaction: it either happens whole or not at all, and it allocates
/// journal sequence numbers without gaps. The race rules are `ConflictRules` (NimbusCore); engines
/// only load the states they compare and store the decision.
public protocol ServerStore: Sendable {
    /// Creates the account if new and a device in it; `tokenHash` is the SHA-256 of the token.
    func addDevice(account: String, deviceName: String, tokenHash: String) async throws -> DeviceRecord
    /// The device whose token hashes to `tokenHash`, if any and not revoked.
    func device(tokenHash: String) async throws -> DeviceRecord?
    /// Every device of every account (or of `account`), by account then name.
    func devices(account: String?) async throws -> [DeviceListing]
    /// Revokes the device of `account` named `device` (or with that id): its token stops working.
    /// Returns it as now listed. `device_not_found` if there is none; `bad_request` if the name
    /// is shared by several devices (name the id then).
    func revokeDevice(account: String, device: String, now: Int64) async throws -> DeviceListing
    /// Keeps a one-time pairing code (its SHA-256) for a new device of `account` named
    /// `deviceName`, usable until `expires` (seconds since 1970).
    func addPairing(account: Int64, codeHash: String, deviceName: String, createdBy: DeviceID, expires: Int64) async throws
    /// Spends a pairing code: in one transaction the code is marked used and the new device is
    /// added to the code's account with `tokenHash` (named `deviceName`, else as the code says).
    /// Nil when no unused code that has not expired at `now` has that hash.
    func redeemPairing(codeHash: String, deviceName: String?, tokenHash: String, now: Int64) async throws -> DeviceRecord?

    /// The container `name` of the account; created when `create` is set and it does not exist.
    func container(account: Int64, name: String, create: Bool) async throws -> ContainerRecord?
    /// The container's journal cursor (its last sequence number; 0 when empty).
    func cursor(of container: ContainerRecord) async throws -> Int64

    /// Applies one commit under the race rules (DESIGN §3). Chunks must already be recorded for
    /// the account (`recordChunk`).
    func commit(_ request: CommitRequest, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> CommitResponse
    /// Resolves conflicts or restores a version.
    func resolve(_ request: ResolveRequest, item: ItemID, in container: ContainerRecord, by device: DeviceRecord, now: Int64) async throws -> CommitResponse

    /// Journal entries after `since`, oldest first, at most `limit`.
    func changes(in container: ContainerRecord, since: Int64, limit: Int) async throws -> ChangesResponse
    /// Live items ordered by id, after `after`, at most `limit`.
    func items(in container: ContainerRecord, after: ItemID?, limit: Int) async throws -> ItemsResponse
    /// One item (also a deleted one, with `deleted` set).
    func item(_ id: ItemID, in container: ContainerRecord) async throws -> ItemRecord?
    /// Current, previous and unresolved conflict versions of an item, newest first.
    func versions(of id: ItemID, in container: ContainerRecord) async throws -> [VersionRecord]

    /// Records that the account owns a stored chunk (after its bytes were verified and written).
    func recordChunk(account: Int64, hash: ContentHash, size: Int64) async throws
    /// The sizes of those of `hashes` that the account owns.
    func ownedChunks(account: Int64, hashes: [ContentHash]) async throws -> [ContentHash: Int64]

    /// Every chunk any version refers to (for consistency checks and, later, garbage collection).
    func referencedChunks() async throws -> Set<ContentHash>
    /// Invariant violations found in the stored data; empty when consistent.
    func consistencyProblems() async throws -> [String]
    /// Statements sent to an external database and the times a thread waited for answers, so
    /// far (nil for the embedded engine).
    var databaseRoundTrips: DatabaseRoundTrips? { get }
}

/// A device as `nimbus admin list-devices` shows it.
public struct DeviceListing: Hashable, Sendable {
    public var id: DeviceID
    public var name: String
    public var account: String
    /// Seconds since 1970.
    public var created: Int64
    /// Seconds since 1970 when revoked; nil while the token works.
    public var revoked: Int64?
    public init(id: DeviceID, name: String, account: String, created: Int64, revoked: Int64?) {
        self.id = id
        self.name = name
        self.account = account
        self.created = created
        self.revoked = revoked
    }
}

extension [DeviceListing] {
    /// The one device `device` names (its id, or its name when no other device has it).
    func one(named device: String, account: String) throws -> DeviceListing {
        let byID = filter { $0.id.description == device.lowercased() }
        if let d = byID.first { return d }
        let named = filter { $0.name == device }
        if named.count > 1 {
            throw APIError(.badRequest, "account \(account) has \(named.count) devices named \(device.debugDescription) (\(named.map(\.id.description).joined(separator: ", "))); name one by its id")
        }
        guard let d = named.first else {
            throw APIError(.deviceNotFound, "account \(account) has no device \(device.debugDescription); list them with `nimbus admin list-devices`")
        }
        return d
    }
}

/// Counts of `ServerStore.databaseRoundTrips` (`/metrics`).
public struct DatabaseRoundTrips: Sendable {
    public var statements: Int64
    public var waits: Int64
}

extension ServerStore {
    public var databaseRoundTrips: DatabaseRoundTrips? { nil }
}
