import NimbusCore
import NimbusProtocol

// Recently Deleted (docs/trash.md).
//
// An **entry** is what one delete took away: a file, or a folder with the items deleted with it.
// Every delete the engine writes marks the item an entry of its own (when, by which device, its
// bytes); a folder's delete then takes in the entries directly inside it that were deleted within
// `adoptWindow` before it — a program removing a tree (`rm -r`) deletes the files first, each
// reaching the server as its own delete — and with them their items. A file deleted long before
// its folder stays an entry of its own.
//
// An item that comes back by any road (a restore, an edit made elsewhere that wins over the
// delete, a change inside a deleted folder) leaves its entry; the items still deleted in that
// entry are regrouped at the end of the operation (`regroupTrash`): each goes to its topmost
// still-deleted folder within the old entry, so nothing stays unreachable.
//
// Restoring an entry is a commit like any other: every item gets a new version (journal kind
// `restore`) and keeps its id, history and conflict versions; a name now taken gets the
// `name 2.ext` rule; deleted folders above it come back; an entry whose folder is gone for good
// (purged) comes back at the top of the container. Purging drops the items and their version
// rows, so the chunk collector frees what nothing else refers to.

extension CommitEngine {
    /// A folder's delete takes in the entries inside it deleted at most this long before it (ns).
    static var adoptWindow: Int64 { 10 * 60 * 1_000_000_000 }

    /// Records a delete or an undelete of `id` that `write` just stored (`deleted` is the new state).
    mutating func trashChanged(_ id: ItemID, deleted: Bool, state: ItemState) throws {
        if deleted {
            try tx.markTrashed(id, at: now, by: device.id, bytes: state.kind == .file ? state.size : 0)
            if state.kind == .folder { try tx.adoptTrash(into: id, deletedSince: now - Self.adoptWindow) }
        } else if let root = try tx.trashRoot(of: id) {
            try tx.clearTrash(id)
            if !trashToRegroup.contains(root) { trashToRegroup.append(root) }
        }
    }

    /// The entries that lost items this operation: their remaining items go to their topmost
    /// still-deleted folder within the entry.
    mutating func regroupTrash() throws {
        for root in trashToRegroup {
            let members = try tx.trashMembers(of: root)
            guard !members.isEmpty else { continue }
            let parentOf = Dictionary(members.map { ($0.id, $0.parent) }, uniquingKeysWith: { a, _ in a })
            var moves: [ItemID: [ItemID]] = [:]
            for m in members {
                var top = m.id
                var steps = 0
                while let p = parentOf[top], parentOf[p] != nil, steps < members.count {
                    top = p
                    steps += 1
                }
                if top != root { moves[top, default: []].append(m.id) }
            }
            for (newRoot, ids) in moves.sorted(by: { $0.key.description < $1.key.description }) {
                try tx.setTrashRoot(ids, to: newRoot)
            }
        }
        trashToRegroup = []
    }

    // MARK: restore

    /// Brings entry `id` back, into `folder` or where it was.
    mutating func restoreTrash(_ id: ItemID, to folder: ItemID?) throws -> TrashRestoreResponse {
        guard let root = try tx.loadItem(id), root.state.deleted, try tx.trashRoot(of: id) == id else {
            throw APIError(.notInTrash, "item \(id) is not in Recently Deleted: it is live, it was purged, or it went with a deleted folder (restore the folder); list the entries with GET …/trash")
        }
        let members = try tx.trashMembers(of: id).filter { $0.id != id }
        var next = root.state
        next.deleted = false
        next.modifiedBy = device.id
        if let folder {
            next.location.parent = folder
        } else if !next.location.parent.isRoot, try tx.loadItem(next.location.parent) == nil {
            next.location.parent = .root  // its folder was purged: the top of the container
        }
        let (restoredRoot, renamed) = try write(root, next)
        var count = 1
        // Folders before what they hold.
        let parentOf = Dictionary(members.map { ($0.id, $0.parent) }, uniquingKeysWith: { a, _ in a })
        func depth(_ m: ItemID) -> Int {
            var d = 0
            var c = m
            while let p = parentOf[c], d <= parentOf.count { d += 1; c = p }
            return d
        }
        for m in members.map({ ($0.id, depth($0.id)) }).sorted(by: { $0.1 < $1.1 || ($0.1 == $1.1 && $0.0.description < $1.0.description) }) {
            guard let item = try tx.loadItem(m.0), item.state.deleted else { continue }
            var state = item.state
            state.deleted = false
            state.modifiedBy = device.id
            _ = try write(item, state)
            count += 1
        }
        try regroupTrash()
        try pruneHistory()
        try tx.recordMetadata()
        return TrashRestoreResponse(item: restoredRoot.record, restored: count + restored.count, renamed: renamed, cursor: lastSeq)
    }
}

/// What the trash reads and purges need of a transaction, without a device (expiry runs with
/// none).
struct TrashStore<T: StoreTransaction> {
    let tx: T

    /// A page of entries, newest first, with where each was.
    func entries(after: TrashCursor?, limit: Int) throws -> [(row: TrashRow, path: String)] {
        try tx.trashEntries(after: after, limit: limit).map { ($0, try path(of: $0.item)) }
    }

    /// Entry `id` and its items (its deleted descendants included), by id.
    func entry(_ id: ItemID) throws -> (row: TrashRow, path: String, items: [StoredItem])? {
        guard let row = try tx.trashEntry(id) else { return nil }
        let items = try tx.trashMembers(of: id).compactMap { try tx.loadItem($0.id) }.sorted { $0.id.description < $1.id.description }
        return (row, try path(of: row.item), items)
    }

    /// Where `item` was: its folders' names today, then its own.
    func path(of item: StoredItem) throws -> String {
        var names = [item.state.location.name.value]
        var parent = item.state.location.parent
        var seen = Set<ItemID>()
        while !parent.isRoot, seen.insert(parent).inserted {
            guard let p = try tx.loadItem(parent) else {
                names.append("…")  // a folder purged since
                break
            }
            names.append(p.state.location.name.value)
            parent = p.state.location.parent
        }
        return "/" + names.reversed().joined(separator: "/")
    }

    /// Every entry, newest first.
    func allEntries() throws -> [ItemID] {
        var out: [ItemID] = []
        var after: TrashCursor?
        while true {
            let page = try tx.trashEntries(after: after, limit: 1000)
            out += page.map(\.item.id)
            guard let last = page.last, page.count == 1000 else { return out }
            after = TrashCursor(deletedAt: last.deletedAt, id: last.item.id)
        }
    }

    /// Purges entries `roots` (those that are entries; others are skipped): their items and
    /// every version row of theirs.
    func purge(_ roots: [ItemID]) throws -> TrashPurgeResponse { try purgeWithChunks(roots).response }

    /// `purge`, with the chunks the purged versions referred to.
    func purgeWithChunks(_ roots: [ItemID]) throws -> (response: TrashPurgeResponse, chunks: Set<ContentHash>) {
        var out = TrashPurgeResponse(entries: 0, items: 0, bytes: 0)
        var chunks = Set<ContentHash>()
        for root in roots {
            guard let row = try tx.trashEntry(root) else { continue }
            let ids = try tx.trashMembers(of: root).map(\.id)
            chunks.formUnion(try tx.purgeItems(ids))
            out.entries += 1
            out.items += ids.count
            out.bytes += row.bytes
        }
        return (out, chunks)
    }
}
