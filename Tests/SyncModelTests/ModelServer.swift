import NimbusCore
import NimbusProtocol
@testable import NimbusServer

/// The server of the model simulation: the real `CommitEngine` (the same rules SQLite and
/// PostgreSQL run) over tables kept in memory. One container; every chunk counts as uploaded.
final class ModelServer {
    struct VersionRow {
        var role: StoredRole
        var wasCurrent: Bool
        var retired: Int64?
        var state: ItemState
    }

    /// The tables of `SQLiteStore`, as values, so a failed operation rolls back by restoring them.
    struct Tables {
        var items: [ItemID: StoredItem] = [:]
        var versions: [ItemID: [Int64: VersionRow]] = [:]
        var historyFloor: [ItemID: Int64] = [:]
        var cursor: Int64 = 0
        var journal: [Change] = []
    }

    var t = Tables()
    /// Every version is kept: the no-loss check reads them all.
    let history = HistoryRetention(keepVersions: 1_000_000, keepDays: HistoryRetention.maxKeepDays)!
    private(set) var operations = 0

    /// `POST …/commit`: the answer, or the error the server would send.
    func commit(_ req: CommitRequest, by device: DeviceRecord, now: Int64) -> Result<CommitResponse, APIError> {
        run(device, now) { engine in try engine.commit(req) }
    }

    /// The one transaction of an operation: the tables are restored when it throws.
    private func run(_ device: DeviceRecord, _ now: Int64, _ body: (inout CommitEngine<Transaction>) throws -> CommitResponse) -> Result<CommitResponse, APIError> {
        operations += 1
        let saved = t
        var engine = CommitEngine(tx: Transaction(server: self), device: device, now: now, history: history)
        do {
            return .success(try body(&engine))
        } catch let e as APIError {
            t = saved
            return .failure(e)
        } catch {
            t = saved
            return .failure(APIError(.internal, "\(error)"))
        }
    }

    /// `GET …/changes?since=`: the journal after `since`, at most `limit` entries.
    func changes(since: Int64, limit: Int) -> ChangesResponse {
        let after = t.journal.drop { $0.seq <= since }
        let page = Array(after.prefix(limit))
        return ChangesResponse(changes: page, cursor: page.last?.seq ?? max(since, t.cursor), more: after.count > limit)
    }

    func item(_ id: ItemID) -> ItemRecord? { t.items[id]?.record }

    /// Live items (a listing) in id order.
    func live() -> [ItemRecord] {
        t.items.values.filter { !$0.state.deleted }.sorted { $0.id < $1.id }.map(\.record)
    }

    /// The first version the server has of `id` (the create).
    func firstVersion(_ id: ItemID) -> Int64? { t.versions[id]?.keys.min() }

    /// Every state the server keeps of `id`: current, conflict and earlier versions.
    func states(of id: ItemID) -> [ItemState] {
        (t.versions[id] ?? [:]).sorted { $0.key < $1.key }.map(\.value.state)
    }

    struct Transaction: StoreTransaction {
        let server: ModelServer

        func loadItem(_ id: ItemID) throws -> StoredItem? { server.t.items[id] }

        func stateCurrent(at version: Int64, of id: ItemID) throws -> ItemState? {
            let floor = server.t.historyFloor[id] ?? 0
            guard let (seq, row) = (server.t.versions[id] ?? [:]).filter({ $0.value.wasCurrent && $0.key <= version }).max(by: { $0.key < $1.key }),
                  seq > floor else { return nil }
            return row.state
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
            Dictionary(hashes.map { ($0, ModelContent.chunkSize) }, uniquingKeysWith: { a, _ in a })
        }
    }
}
