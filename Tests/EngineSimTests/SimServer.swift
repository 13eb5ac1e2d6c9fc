import Crypto
import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
@testable import NimbusServer
import NimbusTesting
import SyncEngine

/// The server of the deterministic simulation: the real `CommitEngine` (the rules SQLite and
/// PostgreSQL run) over its tables kept in memory, one container, and the chunks by hash. Every
/// device reaches it through its own `SimLink` (`RemoteAPI`), in the simulation's one thread.
final class SimServer: @unchecked Sendable {
    // @unchecked: the simulation runs every task on one thread (SimExecutor).
    struct VersionRow {
        var role: StoredRole
        var wasCurrent: Bool
        var retired: Int64?
        var state: ItemState
    }

    /// `SQLiteStore`'s tables as values: a failed operation rolls back by restoring them.
    struct Tables {
        var items: [ItemID: StoredItem] = [:]
        var versions: [ItemID: [Int64: VersionRow]] = [:]
        var historyFloor: [ItemID: Int64] = [:]
        /// Recently Deleted: each deleted item's entry, deletion and bytes (CommitEngine+Trash).
        var trash: [ItemID: (root: ItemID, at: Int64, by: DeviceID, bytes: Int64)] = [:]
        var purged: Set<ItemID> = []
        var cursor: Int64 = 0
        var journal: [Change] = []
    }

    var t = Tables()
    var chunks: [ContentHash: [UInt8]] = [:]
    var deviceNames: [DeviceID: String] = [:]
    let clock: SimClock
    /// Every version is kept: the no-loss check reads them all.
    let history = HistoryRetention(keepVersions: 1_000_000, keepDays: HistoryRetention.maxKeepDays)!
    private var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
    private var gone: Set<UInt64> = []
    private var waiterSeq: UInt64 = 0
    private(set) var commits = 0

    init(clock: SimClock) { self.clock = clock }

    func device(_ index: Int, _ name: String) -> DeviceRecord {
        let d = DeviceRecord(id: DeviceID(SimIDs.uuid(UInt64(index), kind: 0xD0)), name: name, accountID: 1, accountName: "sim")
        deviceNames[d.id] = name
        return d
    }

    var now: Int64 { 1_800_000_000_000_000_000 + clock.nanoseconds }

    func commit(_ req: CommitRequest, by device: DeviceRecord) throws -> CommitResponse {
        let d = req.state
        let occupant = d.deleted ? nil : t.items.values.first {
            $0.id != req.item && !$0.state.deleted && $0.state.location.parent == d.parent && $0.state.location.name == d.name
        }
        let r = try run(device) { try $0.commit(req) }
        if d.deleted, !r.item.state.deleted { deleteIgnored.insert(req.item) }
        leaves.append(Leave(device: device.id, item: req.item, place: d.deleted && !r.item.state.deleted ? nil : ItemLocation(parent: d.parent, name: d.name),
                            deleted: d.deleted))
        if !d.deleted, r.item.state.location.name != d.name { serverNamed.insert(req.item) } else { serverNamed.remove(req.item) }
        // The server gave the item another name because an item of the same device held it: the
        // device's own item was leaving the name (moved away or deleted there) and its push did
        // not go first. Not a restore's doing (the server put that item back on its own), nor
        // kept there by another device's edit since, or by one below it (a delete the server
        // ignored), nor at a name the server chose for it. Whether it was leaving shows later
        // (`ownNameTaken`): a device that lost its record of the item in a crash, or whose
        // delete of it the server ignores, never frees the name, and beside it is right.
        let got = r.item.state.location
        if let o = occupant, got.parent == d.parent, got.name != d.name, SimChecks.isTakenNameOf(got.name.value, d.name.value, depth: 1),
           !deleteIgnored.contains(o.id), !serverNamed.contains(o.id), let placed = placedBy(o), placed.device == device.id, placed.kind != .restore,
           t.journal.last(where: { $0.item.id == o.id && $0.seq < r.item.version })?.device == device.id {
            putBeside.append(PutBeside(
                device: device.id, occupant: o.id, place: o.state.location, after: leaves.count,
                text: "\(deviceNames[device.id] ?? "?"): \(req.item) committed at \(d.parent)/\(d.name.value) was put at "
                    + "\(r.item.state.location.name.value) beside \(o.id), which the same device put there (\(placed.kind) v\(placed.seq))"))
        }
        return r
    }

    private struct PutBeside {
        let device: DeviceID
        let occupant: ItemID
        let place: ItemLocation
        /// The commits asked before it (`leaves`).
        let after: Int
        let text: String
    }
    private var putBeside: [PutBeside] = []
    /// Every commit asked, in order: where the device asked its item to be (nil: a delete the
    /// server ignored — the item stays).
    private struct Leave {
        let device: DeviceID
        let item: ItemID
        let place: ItemLocation?
        let deleted: Bool
    }
    private var leaves: [Leave] = []

    /// Commits the server put beside the committing device's own item (`commit`) that the same
    /// device then asked to move away or delete (whatever the answer, but a delete the server
    /// ignored): it was leaving the name, and its push went second.
    var ownNameTaken: [String] {
        putBeside.filter { b in
            leaves[b.after...].contains {
                $0.device == b.device && $0.item == b.occupant && $0.place != nil && ($0.deleted || $0.place != b.place)
            }
        }.map(\.text)
    }
    /// Items whose delete the server ignored (edited elsewhere, or a folder holding such items).
    private var deleteIgnored: Set<ItemID> = []
    /// Items at a name the server chose (theirs was taken, or another device's rename won), not
    /// the committing device's.
    private var serverNamed: Set<ItemID> = []

    /// The journal entry that put `item` where it is now: the first of its last entries at
    /// that place.
    private func placedBy(_ item: StoredItem) -> Change? {
        var placed: Change?
        for c in t.journal.reversed() where c.item.id == item.id {
            guard c.item.state.location == item.state.location, !c.item.state.deleted else { break }
            placed = c
        }
        return placed
    }

    func resolve(_ req: ResolveRequest, item: ItemID, by device: DeviceRecord) throws -> CommitResponse {
        try run(device) { try $0.resolve(req, item: item) }
    }

    /// One transaction: the tables are restored when it throws; long polls wake when the
    /// journal grew.
    func restoreTrash(_ id: ItemID, to folder: ItemID?, by device: DeviceRecord) throws -> TrashRestoreResponse {
        try run(device) { try $0.restoreTrash(id, to: folder) }
    }

    private func run<R>(_ device: DeviceRecord, _ body: (inout CommitEngine<Transaction>) throws -> R) throws -> R {
        let saved = t
        var engine = CommitEngine(tx: Transaction(server: self), device: device, now: now, history: history)
        do {
            let r = try body(&engine)
            commits += 1
            if t.cursor != saved.cursor {
                let w = waiters.sorted { $0.key < $1.key }
                waiters = [:]
                for (_, c) in w { c.resume() }
            }
            return r
        } catch {
            t = saved
            throw error
        }
    }

    func changes(since: Int64, limit: Int) -> ChangesResponse {
        let after = t.journal.drop { $0.seq <= since }
        let page = Array(after.prefix(limit))
        return ChangesResponse(changes: page, cursor: page.last?.seq ?? max(since, t.cursor), more: after.count > limit)
    }

    /// Returns at the next commit that moves the journal, or after `d`.
    func nextCommit(within d: Duration) async {
        waiterSeq += 1
        let id = waiterSeq
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await self.clock.sleep(for: d) }
            group.addTask {
                await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                    if self.gone.remove(id) != nil { c.resume() } else { self.waiters[id] = c }
                }
            }
            await group.next()
            group.cancelAll()
            // The commit waiter does not end on cancellation: end it.
            if let c = waiters.removeValue(forKey: id) { c.resume() } else { gone.insert(id) }
        }
        gone.remove(id)
    }

    func items(after: ItemID?, limit: Int) -> ItemsResponse {
        let live = t.items.values.filter { !$0.state.deleted }.sorted { $0.id < $1.id }
        let rest = live.drop { item in after.map { item.id <= $0 } ?? false }
        let page = Array(rest.prefix(limit)).map(\.record)
        return ItemsResponse(items: page, cursor: t.cursor, next: rest.count > limit ? page.last?.id : nil)
    }

    func item(_ id: ItemID) throws -> ItemRecord {
        guard let i = t.items[id] else { throw APIError.itemNotFound(id) }
        return i.record
    }

    /// `GET …/versions`: newest first, resolved-away conflict versions left out.
    func versions(_ id: ItemID) -> [VersionRecord] {
        (t.versions[id] ?? [:]).filter { $0.value.role != .discarded }.sorted { $0.key > $1.key }.map { seq, row in
            VersionRecord(version: seq, role: VersionRole(rawValue: row.role.rawValue) ?? .previous,
                          deviceName: deviceNames[row.state.modifiedBy] ?? "unknown device",
                          state: ItemRecord(id: id, version: seq, state: row.state, conflicts: 0))
        }
    }

    struct Transaction: StoreTransaction {
        let server: SimServer

        func loadItem(_ id: ItemID) throws -> StoredItem? { server.t.items[id] }

        func stateCurrent(at version: Int64, of id: ItemID) throws -> ItemState? {
            let floor = server.t.historyFloor[id] ?? 0
            guard let (seq, row) = (server.t.versions[id] ?? [:]).filter({ $0.value.wasCurrent && $0.key <= version }).max(by: { $0.key < $1.key }),
                  seq > floor else { return nil }
            return row.state
        }

        func firstState(of id: ItemID) throws -> ItemState? {
            guard (server.t.historyFloor[id] ?? 0) == 0 else { return nil }
            return (server.t.versions[id] ?? [:]).filter(\.value.wasCurrent).min(by: { $0.key < $1.key })?.value.state
        }

        func currentStatesMade(of id: ItemID, after version: Int64) throws -> [(seq: Int64, by: DeviceID?)] {
            (server.t.versions[id] ?? [:]).filter { $0.key > version && $0.value.wasCurrent }.keys.sorted().map { seq in
                (seq, server.t.journal.first { $0.seq == seq }?.device)
            }
        }

        func isNameTaken(parent: ItemID, name: String, excluding id: ItemID) throws -> Bool {
            server.t.items.values.contains { $0.id != id && !$0.state.deleted && $0.state.location.parent == parent && $0.state.location.name.value == name }
        }

        func liveChildren(of id: ItemID) throws -> [StoredItem] {
            server.t.items.values.filter { !$0.state.deleted && $0.state.location.parent == id }.sorted { $0.id < $1.id }
        }

        func nextSeq() throws -> Int64 {
            server.t.cursor += 1
            return server.t.cursor
        }

        func saveItem(_ item: StoredItem) throws { server.t.items[item.id] = item }

        func currentVersionSeq(of id: ItemID) throws -> Int64? {
            server.t.versions[id]?.first { $0.value.role == .current }?.key
        }

        func insertVersion(item: ItemID, seq: Int64, role: StoredRole, wasCurrent: Bool, state: ItemState) throws {
            server.t.versions[item, default: [:]][seq] = VersionRow(role: role, wasCurrent: wasCurrent, state: state)
        }

        func setRole(item: ItemID, seq: Int64, role: StoredRole, at time: Int64) throws {
            server.t.versions[item]?[seq]?.role = role
            server.t.versions[item]?[seq]?.retired = role.isEarlier ? time : nil
        }

        func version(item: ItemID, seq: Int64) throws -> (role: StoredRole, state: ItemState)? {
            server.t.versions[item]?[seq].map { ($0.role, $0.state) }
        }

        func versionSeqs(item: ItemID, role: StoredRole) throws -> [Int64] {
            (server.t.versions[item] ?? [:]).filter { $0.value.role == role }.map(\.key).sorted()
        }

        func earlierVersions(of id: ItemID) throws -> [EarlierVersion] {
            (server.t.versions[id] ?? [:]).filter { $0.value.role.isEarlier }.sorted { $0.key < $1.key }.map {
                EarlierVersion(seq: $0.key, role: $0.value.role, wasCurrent: $0.value.wasCurrent, retired: $0.value.retired ?? 0)
            }
        }

        func deleteVersions(item: ItemID, seqs: [Int64], historyFloor: Int64?) throws {
            for s in seqs where server.t.versions[item]?[s]?.role.isEarlier == true { server.t.versions[item]?[s] = nil }
            if let historyFloor { server.t.historyFloor[item] = max(server.t.historyFloor[item] ?? 0, historyFloor) }
        }

        func appendJournal(seq: Int64, kind: ChangeKind, item: StoredItem, device: DeviceID) throws {
            server.t.journal.append(Change(seq: seq, kind: kind, device: device, item: item.record))
        }

        func ownedChunks(_ hashes: [ContentHash]) throws -> [ContentHash: Int64] {
            var out: [ContentHash: Int64] = [:]
            for h in hashes { if let c = server.chunks[h] { out[h] = Int64(c.count) } }
            return out
        }

        func markTrashed(_ id: ItemID, at time: Int64, by device: DeviceID, bytes: Int64) throws {
            server.t.trash[id] = (id, time, device, bytes)
        }

        func adoptTrash(into folder: ItemID, deletedSince since: Int64) throws {
            let roots = Set(server.t.trash.filter { k, v in
                v.root == k && k != folder && v.at >= since && server.t.items[k]?.state.deleted == true
                    && server.t.items[k]?.state.location.parent == folder
            }.keys)
            for (k, v) in server.t.trash where roots.contains(v.root) { server.t.trash[k]?.root = folder }
        }

        func trashRoot(of id: ItemID) throws -> ItemID? {
            server.t.trash[id]?.root
        }

        func clearTrash(_ id: ItemID) throws { server.t.trash[id] = nil }

        func trashMembers(of root: ItemID) throws -> [(id: ItemID, parent: ItemID)] {
            server.t.trash.filter { $0.value.root == root && server.t.items[$0.key]?.state.deleted == true }
                .keys.sorted().compactMap { id in server.t.items[id].map { (id, $0.state.location.parent) } }
        }

        func setTrashRoot(_ ids: [ItemID], to root: ItemID) throws {
            for id in ids where server.t.items[id]?.state.deleted == true { server.t.trash[id]?.root = root }
        }

        private func row(_ id: ItemID) -> TrashRow? {
            guard let m = server.t.trash[id], m.root == id, let item = server.t.items[id], item.state.deleted else { return nil }
            let members = server.t.trash.filter { $0.value.root == id && server.t.items[$0.key]?.state.deleted == true }
            return TrashRow(item: item, deletedAt: m.at, deletedBy: m.by, items: members.count, bytes: members.values.reduce(0) { $0 + $1.bytes })
        }

        func trashEntries(after: TrashCursor?, limit: Int) throws -> [TrashRow] {
            let all = server.t.trash.keys.compactMap(row).sorted { ($0.deletedAt, $0.item.id) > ($1.deletedAt, $1.item.id) }
            return Array(all.filter { r in after.map { (r.deletedAt, r.item.id) < ($0.deletedAt, $0.id) } ?? true }.prefix(limit))
        }

        func trashEntry(_ id: ItemID) throws -> TrashRow? { row(id) }

        func trashTotals() throws -> TrashTotals {
            let members = server.t.trash.filter { server.t.items[$0.key]?.state.deleted == true }
            return TrashTotals(entries: members.filter { $0.key == $0.value.root }.count, items: members.count,
                               bytes: members.values.reduce(0) { $0 + $1.bytes })
        }

        func purgeItems(_ ids: [ItemID]) throws -> Set<ContentHash> {
            var hashes = Set<ContentHash>()
            for id in ids where server.t.items[id]?.state.deleted == true {
                for row in (server.t.versions[id] ?? [:]).values { for c in row.state.content.chunks { hashes.insert(c.hash) } }
                server.t.items[id] = nil
                server.t.versions[id] = nil
                server.t.trash[id] = nil
                server.t.purged.insert(id)
            }
            return hashes
        }

        func wasPurged(_ id: ItemID) throws -> Bool { server.t.purged.contains(id) }

        // The simulated account has no quota: its metadata is not counted.
        var metadataAdded: Int64 { 0 }
        func recordMetadata() throws {}
        func accountQuota() throws -> Int64? { nil }
        func accountUsage() throws -> Int64 { 0 }
    }
}

/// One device's network to the `SimServer`, as `RemoteAPI`: every call takes a seeded delay of
/// simulated time each way; while `cut`, calls fail as an unreachable server does; a commit
/// may be applied and its answer lost (`dropAnswers`); `failing` answers 503 without acting.
final class SimLink: RemoteAPI, @unchecked Sendable {
    // @unchecked: the simulation runs every task on one thread (SimExecutor).
    let server: SimServer
    let device: DeviceRecord
    let container: String
    var rng: SplitMix64
    /// The network is down: every call fails (after its delay).
    var cut = false
    /// One in this many commit answers is lost after the server applied the commit (0: none).
    var dropAnswers = 0
    /// One in this many calls is answered 503 without acting (0: none).
    var unavailable = 0
    /// The server refuses this device's token (401) until the device is mounted again.
    var unauthorized = false
    /// Chunk uploads are refused for the account's quota.
    var overQuota = false
    private(set) var calls = 0

    init(server: SimServer, device: DeviceRecord, container: String, seed: UInt64) {
        self.server = server
        self.device = device
        self.container = container
        rng = SplitMix64(seed: seed)
    }

    var baseURL: String { "sim://\(device.name)" }

    /// The way there: a delay, then the network's verdict.
    private func go() async throws {
        calls += 1
        await server.clock.sleep(for: .milliseconds(1 + rng.below(15)))
        if cut { throw RemoteError.transport("simulated: the network is down") }
        if unauthorized {
            throw RemoteError.server(status: 401, code: APIErrorCode.unauthorized.rawValue, message: "simulated: unknown or revoked token", missing: nil)
        }
        if unavailable > 0, rng.below(unavailable) == 0 {
            throw RemoteError.server(status: 503, code: APIErrorCode.unavailable.rawValue, message: "simulated: unavailable", missing: nil)
        }
    }

    /// The way back: a delay; the answer is lost when the network went down meanwhile.
    private func back() async throws {
        await server.clock.sleep(for: .milliseconds(1 + rng.below(15)))
        if cut { throw RemoteError.transport("simulated: the connection was lost before the answer") }
    }

    private func call<T>(_ body: () throws -> T) async throws -> T {
        try await go()
        let r: T
        do { r = try body() } catch let e as APIError {
            try await back()
            throw RemoteError.server(status: e.code.httpStatus, code: e.code.rawValue, message: e.message, missing: e.missing, quota: e.quota)
        }
        try await back()
        return r
    }

    func createContainer(_ name: String) async throws -> ContainerInfo {
        try await call { ContainerInfo(name: name, cursor: server.t.cursor) }
    }

    func commit(_ container: String, _ request: CommitRequest) async throws -> CommitResponse {
        try await call {
            // A small file's bytes inside the commit: stored as `putChunk` stores them.
            if let wrong = InlineChunk.checkCommit(request) { throw APIError(.badRequest, wrong) }
            for c in request.inline ?? [] {
                if overQuota { throw APIError.quotaExceeded(usage: 1 << 20, quota: 1 << 20, size: Int64(c.bytes.count)) }
                guard ContentHash(digest: SHA256.hash(data: c.bytes)) == c.hash else { throw APIError(.badRequest, "chunk bytes do not match \(c.hash)") }
                server.chunks[c.hash] = Array(c.bytes)
            }
            let r = try server.commit(request, by: device)
            if dropAnswers > 0, rng.below(dropAnswers) == 0 {
                throw APIError(.internal, "simulated: the answer to an applied commit was lost")
            }
            return r
        }
    }

    /// One request: the commits applied in order, each on its own (as the server's route does);
    /// the answer to all of them may be lost like a single commit's.
    func commitBatch(_ container: String, _ requests: [CommitRequest]) async throws -> [Result<CommitResponse, RemoteError>] {
        try await go()
        var results: [Result<CommitResponse, RemoteError>] = []
        for request in requests {
            do {
                if let wrong = InlineChunk.checkCommit(request) { throw APIError(.badRequest, wrong) }
                for c in request.inline ?? [] {
                    if overQuota { throw APIError.quotaExceeded(usage: 1 << 20, quota: 1 << 20, size: Int64(c.bytes.count)) }
                    guard ContentHash(digest: SHA256.hash(data: c.bytes)) == c.hash else { throw APIError(.badRequest, "chunk bytes do not match \(c.hash)") }
                    server.chunks[c.hash] = Array(c.bytes)
                }
                results.append(.success(try server.commit(request, by: device)))
            } catch let e as APIError {
                results.append(.failure(.server(status: e.code.httpStatus, code: e.code.rawValue, message: e.message, missing: e.missing, quota: e.quota)))
            }
        }
        try await back()
        if dropAnswers > 0, rng.below(dropAnswers) == 0 {
            throw RemoteError.server(status: 500, code: APIErrorCode.internal.rawValue, message: "simulated: the answer to an applied batch was lost", missing: nil)
        }
        return results
    }

    func changes(_ container: String, since: Int64, wait: Int, limit: Int) async throws -> ChangesResponse {
        try await go()
        if wait > 0, server.t.cursor <= since {
            await server.nextCommit(within: .seconds(wait))
        }
        let r = server.changes(since: since, limit: limit)
        try await back()
        return r
    }

    func items(_ container: String, after: ItemID?, limit: Int) async throws -> ItemsResponse {
        try await call { server.items(after: after, limit: limit) }
    }

    func item(_ container: String, _ id: ItemID) async throws -> ItemRecord {
        try await call { try server.item(id) }
    }

    func versions(_ container: String, _ id: ItemID) async throws -> [VersionRecord] {
        try await call { server.versions(id) }
    }

    func resolve(_ container: String, _ id: ItemID, _ request: ResolveRequest) async throws -> CommitResponse {
        try await call { try server.resolve(request, item: id, by: device) }
    }

    func missingChunks(_ hashes: [ContentHash]) async throws -> [ContentHash] {
        try await call { hashes.filter { server.chunks[$0] == nil } }
    }

    func putChunk(_ hash: ContentHash, _ bytes: [UInt8]) async throws {
        try await call {
            if overQuota { throw APIError.quotaExceeded(usage: 1 << 20, quota: 1 << 20, size: Int64(bytes.count)) }
            guard ContentHash(digest: SHA256.hash(data: bytes)) == hash else { throw APIError(.badRequest, "chunk bytes do not match \(hash)") }
            server.chunks[hash] = bytes
        }
    }

    /// Answered without the faults' random draws (no delay, no 503), so that asking for it
    /// leaves every seed's path as it was; a cut or refused link still fails it.
    func trashTotals(_ container: String) async throws -> TrashTotals? {
        if cut { throw RemoteError.transport("simulated: the network is down") }
        if unauthorized { throw RemoteError.server(status: 401, code: APIErrorCode.unauthorized.rawValue, message: "simulated: unknown or revoked token", missing: nil) }
        return try SimServer.Transaction(server: server).trashTotals()
    }

    // Recently Deleted, from the simulated server's tables (kept 30 days).
    func trash(_ container: String) async throws -> TrashResponse {
        try await call {
            let keep: Int64 = 30 * 86_400
            let entries = try TrashStore(tx: SimServer.Transaction(server: server)).entries(after: nil, limit: 100_000).map { e in
                TrashEntry(item: e.row.item.record, path: e.path, deletedAt: e.row.deletedAt, deletedBy: e.row.deletedBy,
                           expires: e.row.deletedAt + keep * 1_000_000_000, items: e.row.items, bytes: e.row.bytes)
            }
            return TrashResponse(entries: entries, next: nil, keepSeconds: keep)
        }
    }

    func trashItems(_ container: String, _ id: ItemID) async throws -> TrashItemsResponse {
        try await call {
            guard let e = try TrashStore(tx: SimServer.Transaction(server: server)).entry(id) else {
                throw APIError(.notInTrash, "simulated: \(id) is not in Recently Deleted")
            }
            let entry = TrashEntry(item: e.row.item.record, path: e.path, deletedAt: e.row.deletedAt, deletedBy: e.row.deletedBy,
                                   expires: Int64.max, items: e.row.items, bytes: e.row.bytes)
            return TrashItemsResponse(entry: entry, items: e.items.map(\.record), next: nil)
        }
    }

    func restoreTrash(_ container: String, _ id: ItemID, to folder: ItemID?) async throws -> TrashRestoreResponse {
        try await call { try server.restoreTrash(id, to: folder, by: device) }
    }

    func purgeTrash(_ container: String, _ id: ItemID?) async throws -> TrashPurgeResponse {
        try await call {
            let trash = TrashStore(tx: SimServer.Transaction(server: server))
            return try trash.purge(id.map { [$0] } ?? trash.allEntries())
        }
    }

    func devices() async throws -> [DeviceInfo] {
        try await call { server.deviceNames.map { DeviceInfo(id: $0.key, name: $0.value, created: 0, revoked: nil) } }
    }

    func getChunk(_ hash: ContentHash, range: Range<Int64>?) async throws -> [UInt8] {
        try await call {
            guard let c = server.chunks[hash] else { throw APIError(.chunkNotFound, "no chunk \(hash)") }
            guard let range else { return c }
            let lo = Int(min(max(range.lowerBound, 0), Int64(c.count))), hi = Int(min(max(range.upperBound, 0), Int64(c.count)))
            return Array(c[lo..<max(lo, hi)])
        }
    }

    func streamChunk(_ hash: ContentHash, _ part: (UnsafeRawBufferPointer) throws -> Void) async throws -> Int64 {
        let bytes = try await getChunk(hash, range: nil)
        try bytes.withUnsafeBytes { try part($0) }
        return Int64(bytes.count)
    }
}

/// Ids that replay: the n-th of a kind is the same UUID in every run.
enum SimIDs {
    static func uuid(_ n: UInt64, kind: UInt8) -> UUID {
        let b = withUnsafeBytes(of: n.bigEndian) { Array($0) }
        return UUID(uuid: (kind, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, b[2], b[3], b[4], b[5], b[6], b[7]))
    }
}
