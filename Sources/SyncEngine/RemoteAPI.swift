import NimbusCore
import NimbusProtocol
import NimbusRemote

/// What the sync engine asks of the server (docs/protocol.md). `NimbusClient` implements it
/// over HTTP; the engine knows nothing else of the network. Every call may throw
/// `RemoteError` (the server refused, with its `code`) or a transport error.
public protocol RemoteAPI: Sendable {
    /// The server, as the state directory is bound to it and `.nimbus/status` shows it.
    var baseURL: String { get }
    func createContainer(_ name: String) async throws -> ContainerInfo
    func commit(_ container: String, _ request: CommitRequest) async throws -> CommitResponse
    /// Several commits in one request, applied in order, each on its own (`NimbusClient.commitBatch`).
    func commitBatch(_ container: String, _ requests: [CommitRequest]) async throws -> [Result<CommitResponse, RemoteError>]
    func changes(_ container: String, since: Int64, wait: Int, limit: Int) async throws -> ChangesResponse
    func items(_ container: String, after: ItemID?, limit: Int) async throws -> ItemsResponse
    func item(_ container: String, _ id: ItemID) async throws -> ItemRecord
    func versions(_ container: String, _ id: ItemID) async throws -> [VersionRecord]
    func resolve(_ container: String, _ id: ItemID, _ request: ResolveRequest) async throws -> CommitResponse
    func missingChunks(_ hashes: [ContentHash]) async throws -> [ContentHash]
    func putChunk(_ hash: ContentHash, _ bytes: [UInt8]) async throws
    /// A chunk's bytes (`range`: part of it; nil: all).
    func getChunk(_ hash: ContentHash, range: Range<Int64>?) async throws -> [UInt8]
    /// A chunk's bytes handed to `part` as they arrive; the number of bytes.
    func streamChunk(_ hash: ContentHash, _ part: (UnsafeRawBufferPointer) throws -> Void) async throws -> Int64
    /// Recently Deleted (docs/trash.md): every entry, newest first.
    func trash(_ container: String) async throws -> TrashResponse
    /// What the container's Recently Deleted holds (nil: the server does not say).
    func trashTotals(_ container: String) async throws -> TrashTotals?
    /// Entry `id` and its items.
    func trashItems(_ container: String, _ id: ItemID) async throws -> TrashItemsResponse
    /// Brings entry `id` back (into `folder`, or where it was).
    func restoreTrash(_ container: String, _ id: ItemID, to folder: ItemID?) async throws -> TrashRestoreResponse
    /// Purges entry `id` (nil: every entry).
    func purgeTrash(_ container: String, _ id: ItemID?) async throws -> TrashPurgeResponse
    /// The account's devices (names for ids).
    func devices() async throws -> [DeviceInfo]
}

extension RemoteAPI {
    func getChunk(_ hash: ContentHash) async throws -> [UInt8] { try await getChunk(hash, range: nil) }
}

extension NimbusClient: RemoteAPI {}
