import Foundation
import NimbusCore
import NimbusProtocol
import NimbusServer

/// A store with one account, two devices (A and B) and a container, plus short ways to commit.
/// Used by the conformance suite; engine-independent.
public struct StoreFixture: Sendable {
    public let store: any ServerStore
    public let a: DeviceRecord
    public let b: DeviceRecord
    public let container: ContainerRecord

    public static func make(_ store: any ServerStore, account: String = "alice") async throws -> StoreFixture {
        let a = try await store.addDevice(account: account, deviceName: "laptop", tokenHash: TokenHash.of(UUID().uuidString))
        let b = try await store.addDevice(account: account, deviceName: "desktop", tokenHash: TokenHash.of(UUID().uuidString))
        guard let c = try await store.container(account: a.accountID, name: "com.example.notes", create: true) else {
            throw FixtureError("container was not created")
        }
        return StoreFixture(store: store, a: a, b: b, container: c)
    }

    /// A chunk the account owns, with made-up bytes (the store only records hashes and sizes).
    /// Recorded (touched) at server time `now` (ns), which the garbage collector's grace counts from.
    public func chunk(_ tag: String, size: Int64 = 100, now: Int64 = 0) async throws -> ChunkRef {
        let hash = ContentHash(digest: Array(tag.utf8) + Array(repeating: 0, count: 32)).hex.prefix(64)
        let ref = ChunkRef(hash: ContentHash(hex: String(hash).padding(toLength: 64, withPad: "0", startingAt: 0))!, size: size)
        try await store.recordChunk(account: a.accountID, hash: ref.hash, size: size, now: now)
        return ref
    }

    public func draft(_ kind: ItemKind = .file, _ name: String, in parent: ItemID = .root, chunks: [ChunkRef] = [],
                      target: String? = nil, mode: UInt32 = 0o644, t: Int64 = 1_000, deleted: Bool = false) -> ItemDraft {
        ItemDraft(kind: kind, parent: parent, name: ItemName(trusted: name), chunks: chunks, symlinkTarget: target,
                  mode: mode, modified: t, deleted: deleted)
    }

    /// Commits at server time `now` (ns; history retention ages versions by it).
    @discardableResult
    public func commit(_ id: ItemID, base: Int64?, _ draft: ItemDraft, by device: DeviceRecord? = nil, seen: Int64? = nil,
                       now: Int64 = 5_000) async throws -> CommitResponse {
        try await store.commit(CommitRequest(item: id, baseVersion: base, state: draft, seenCursor: seen),
                               in: container, by: device ?? a, now: now)
    }

    public func resolve(_ id: ItemID, _ request: ResolveRequest, by device: DeviceRecord? = nil, now: Int64 = 5_000) async throws -> CommitResponse {
        try await store.resolve(request, item: id, in: container, by: device ?? a, now: now)
    }

    public func versions(_ id: ItemID) async throws -> [VersionRecord] {
        try await store.versions(of: id, in: container)
    }

    /// Creates an item and returns its id and version.
    public func create(_ kind: ItemKind = .file, _ name: String, in parent: ItemID = .root, chunks: [ChunkRef] = [],
                       by device: DeviceRecord? = nil) async throws -> (ItemID, Int64) {
        let id = ItemID(UUID())
        let r = try await commit(id, base: nil, draft(kind, name, in: parent, chunks: chunks), by: device)
        return (id, r.item.version)
    }

    public func item(_ id: ItemID) async throws -> ItemRecord {
        guard let r = try await store.item(id, in: container) else { throw FixtureError("no item \(id)") }
        return r
    }

    public func allChanges() async throws -> [Change] {
        var out: [Change] = []
        var since: Int64 = 0
        while true {
            let page = try await store.changes(in: container, since: since, limit: 1000)
            out += page.changes
            since = page.cursor
            if !page.more { return out }
        }
    }
}

public struct FixtureError: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}
