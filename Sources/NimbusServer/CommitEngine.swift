import NimbusCore
import NimbusProtocol

/// Applies one commit or resolve inside a store transaction, following docs/protocol.md "Commit":
/// the state at the committer's base is compared by `ConflictRules`, placement rules (parent must
/// be a live folder — a deleted one is restored —, no cycles, `name 2.ext` on a taken name) are
/// applied, and every change gets its own journal sequence number and version row. Last, the
/// earlier versions of the items it touched are pruned under `history` (CommitEngine+History).
///
/// `now` is the server's time for this operation, passed in: the engine reads no clock.
struct CommitEngine<T: StoreTransaction> {
    let tx: T
    let device: DeviceRecord
    let now: Int64
    let history: HistoryRetention
    private(set) var restored: [ItemID] = []
    private(set) var lastSeq: Int64 = 0
    /// Items that got a new earlier version in this operation, in order: the ones to prune.
    var retiredItems: [ItemID] = []
    /// Recently Deleted entries that lost items this operation (CommitEngine+Trash).
    var trashToRegroup: [ItemID] = []

    init(tx: T, device: DeviceRecord, now: Int64, history: HistoryRetention) {
        self.tx = tx
        self.device = device
        self.now = now
        self.history = history
    }

    // MARK: commit

    mutating func commit(_ req: CommitRequest) throws -> CommitResponse {
        let response = try apply(req)
        try regroupTrash()
        try pruneHistory()
        try tx.recordMetadata()
        try checkQuota(deleting: req.state.deleted)
        return response
    }

    /// What an account stores in version rows and journal entries counts in its usage: a commit
    /// that stores any and leaves the account over its quota is refused (and rolled back), so
    /// chunk lists that reuse a chunk the account owns cannot grow the server past the quota.
    /// Deletes always go through: they are how an account gets back under it.
    private func checkQuota(deleting: Bool) throws {
        let added = tx.metadataAdded
        guard !deleting, added > 0, let quota = try tx.accountQuota() else { return }
        let usage = try tx.accountUsage()
        if usage > quota { throw APIError.quotaExceededByCommit(usage: usage - added, quota: quota, size: added) }
    }

    /// `req` has passed `CommitRequest.check()` at the protocol boundary.
    private mutating func apply(_ req: CommitRequest) throws -> CommitResponse {
        let incoming = req.state.state(by: device.id)
        try checkChunks(incoming.content)

        guard let current = try tx.loadItem(req.item) else {
            if incoming.deleted { throw APIError.itemNotFound(req.item) }
            return try create(req.item, incoming)
        }
        guard current.state.kind == incoming.kind else {
            throw APIError(.kindMismatch, "item \(req.item) is a \(current.state.kind.rawValue), not a \(incoming.kind.rawValue); an item's kind never changes — create a new item instead")
        }
        let baseIsCurrent = req.baseVersion == current.version
        var base: ItemState? = baseIsCurrent ? current.state : try ancestor(req)
        // A stale base followed by states of this device's own: commits whose answers were lost
        // (a dropped connection, a crash before it recorded them). What it sends now descends
        // from the last of them, which it sent as it was, so that state is the ancestor: an
        // attribute it removed since is removed (a field its draft lacks counts as emptied), an
        // edit is no conflict with its own earlier one, a delete is no delete of an edit it never
        // saw; what other devices changed after that state stays theirs. (History that no longer
        // has the base's state, or a deleted item, keep the rules below.)
        if !baseIsCurrent, base != nil, let since = req.baseVersion, !current.state.deleted, !Mutation.ownVersionsMergedAsOthers.isOn,
           let own = try tx.currentStatesMade(of: req.item, after: since).prefix(while: { $0.by == device.id }).last,
           let sent = try tx.stateCurrent(at: own.seq, of: req.item) {
            base = sent
        }

        switch ConflictRules.decide(base: base, current: current.state, incoming: incoming, baseIsCurrent: baseIsCurrent,
                                    placeIfUnmoved: req.placeIfUnmoved == true && !Mutation.besideMoveOverridesRename.isOn, mergeExtra: Self.mergeExtra) {
        case .unchanged:
            return response(.unchanged, current)
        case .deleteLost:
            return response(.deleteIgnored, current)
        case .apply(let next):
            if next.deleted, !current.state.deleted, next.kind == .folder {
                return try deleteFolder(current, tombstone: next, seenCursor: req.seenCursor ?? 0)
            }
            let (item, renamed) = try write(current, next)
            return CommitResponse(outcome: .applied, item: item.record, renamed: renamed, restored: restored, cursor: lastSeq)
        case .conflict(let winner, let loser):
            let yoursWon = winner.content == incoming.content
            var item = current
            var renamed = false
            if yoursWon {
                // The old current state becomes the conflict version; ours becomes current.
                var next = winner
                renamed = try place(&next, id: current.id, previous: current.state)
                let seq = try tx.nextSeq()
                if let old = try tx.currentVersionSeq(of: current.id) { try setRole(current.id, old, .conflict) }
                try tx.insertVersion(item: current.id, seq: seq, role: .current, wasCurrent: true, state: next)
                item = StoredItem(id: current.id, version: seq, conflicts: current.conflicts + 1, state: next)
                try tx.saveItem(item)
                if next.deleted != current.state.deleted { try trashChanged(current.id, deleted: next.deleted, state: next) }
                try journal(seq, .conflict, item)
            } else {
                if winner != current.state {
                    (item, renamed) = try write(current, winner)
                }
                var kept = loser
                kept.location = item.state.location
                let seq = try tx.nextSeq()
                try tx.insertVersion(item: current.id, seq: seq, role: .conflict, wasCurrent: false, state: kept)
                item.version = seq
                item.conflicts += 1
                try tx.saveItem(item)
                try journal(seq, .conflict, item)
            }
            return CommitResponse(outcome: .conflict, yours: yoursWon ? "current" : "conflict", item: item.record,
                                  renamed: renamed, restored: restored, cursor: lastSeq)
        }
    }

    /// `extra` merged field by field and attribute by attribute (`ExtraMerge`).
    static func mergeExtra(base: String?, current: String?, incoming: String?) -> String? {
        Mutation.extraReplacedWhole.isOn ? incoming : ExtraMerge.threeWay(base: base, current: current, incoming: incoming)
    }

    /// The common ancestor of a commit whose base is not current: the state at its base version.
    /// A commit with no base of an item the server has comes from the device that made the item
    /// and never recorded an answer for it (the answer was lost, or its store lost the record, e.g.
    /// a full disk or `kill -9` before a save): what it has descends from its own first state, so
    /// that state is the ancestor. Then only what it changed since counts as its change — an older
    /// copy of the item never moves it back over a rename, nor turns its content into a conflict.
    private func ancestor(_ req: CommitRequest) throws -> ItemState? {
        if let version = req.baseVersion { return try tx.stateCurrent(at: version, of: req.item) }
        guard !Mutation.baselessCommitMovesBack.isOn, var first = try tx.firstState(of: req.item), first.modifiedBy == device.id else { return nil }
        // The name it asked for, when the server gave the item another for a taken one: that
        // rename was the server's, not the device's.
        if first.location.parent == req.state.parent, ItemName.isTakenName(first.location.name.value, of: req.state.name.value) {
            first.location.name = req.state.name
        }
        return first
    }

    private mutating func create(_ id: ItemID, _ incoming: ItemState) throws -> CommitResponse {
        var state = incoming
        let renamed = try place(&state, id: id, previous: nil)
        let seq = try tx.nextSeq()
        try tx.insertVersion(item: id, seq: seq, role: .current, wasCurrent: true, state: state)
        let item = StoredItem(id: id, version: seq, conflicts: 0, state: state)
        try tx.saveItem(item)
        try journal(seq, .create, item)
        return CommitResponse(outcome: .applied, item: item.record, renamed: renamed, restored: restored, cursor: lastSeq)
    }

    /// Makes `next` the current state of `current`: placement, a new version row, the journal.
    mutating func write(_ current: StoredItem, _ next: ItemState, conflicts: Int? = nil) throws -> (StoredItem, Bool) {
        var state = next
        var renamed = false
        if !state.deleted, state.location != current.state.location || current.state.deleted {
            renamed = try place(&state, id: current.id, previous: current.state)
        }
        let seq = try tx.nextSeq()
        if let old = try tx.currentVersionSeq(of: current.id) { try setRole(current.id, old, .previous) }
        try tx.insertVersion(item: current.id, seq: seq, role: .current, wasCurrent: true, state: state)
        let item = StoredItem(id: current.id, version: seq, conflicts: conflicts ?? current.conflicts, state: state)
        try tx.saveItem(item)
        if state.deleted != current.state.deleted { try trashChanged(current.id, deleted: state.deleted, state: state) }
        let kind: ChangeKind
        if state.deleted { kind = .delete }
        else if current.state.deleted { kind = .restore }
        else if state.content != current.state.content || state.mode != current.state.mode || state.modified != current.state.modified { kind = .update }
        else if state.location != current.state.location { kind = .move }
        else { kind = .update }
        try journal(seq, kind, item)
        return (item, renamed)
    }

    /// Checks and fixes where a live item goes: its parent must be a live folder (a deleted one is
    /// brought back), a folder cannot go inside itself, and a taken name becomes `name 2.ext`.
    /// Returns whether the name was changed.
    private mutating func place(_ state: inout ItemState, id: ItemID, previous: ItemState?) throws -> Bool {
        // A change inside a folder purged from Recently Deleted since (a device that had not
        // heard of it): the item goes to the top of the container, where a restore of an entry
        // whose folder is gone puts it too. Nothing written is refused for good.
        if !state.location.parent.isRoot, !Mutation.changeInPurgedFolderRefused.isOn,
           try tx.loadItem(state.location.parent) == nil, try tx.wasPurged(state.location.parent) {
            state.location.parent = .root
        }
        let parent = state.location.parent
        if parent == id { throw APIError(.moveCycle, "an item cannot be its own parent") }
        if state.kind == .folder, previous?.location.parent != parent || previous?.deleted == true {
            let cycle = try ConflictRules.wouldCreateCycle(moving: id, into: parent) { try tx.loadItem($0)?.state.location.parent }
            if cycle {
                throw APIError(.moveCycle, "moving this folder into \(parent) would put it inside itself; the move was refused — put the folder back where it was")
            }
        }
        try ensureLiveFolder(parent)
        let wanted = state.location.name
        let name = try wanted.deduplicated { try tx.isNameTaken(parent: parent, name: $0, excluding: id) }
        state.location.name = name
        return name != wanted
    }

    private mutating func ensureLiveFolder(_ id: ItemID) throws {
        if id.isRoot { return }
        guard let folder = try tx.loadItem(id) else {
            throw APIError(.parentNotFound, "the folder \(id) does not exist in this container; pull changes and retry")
        }
        guard folder.state.kind == .folder else {
            throw APIError(.parentNotFolder, "the parent \(id) is a \(folder.state.kind.rawValue), not a folder")
        }
        guard folder.state.deleted else { return }
        // A change inside a deleted folder brings the folder (and its deleted ancestors) back.
        var state = folder.state
        state.deleted = false
        _ = try place(&state, id: id, previous: folder.state)
        let seq = try tx.nextSeq()
        if let old = try tx.currentVersionSeq(of: id) { try setRole(id, old, .previous) }
        try tx.insertVersion(item: id, seq: seq, role: .current, wasCurrent: true, state: state)
        let item = StoredItem(id: id, version: seq, conflicts: folder.conflicts, state: state)
        try tx.saveItem(item)
        try trashChanged(id, deleted: false, state: state)
        try journal(seq, .restore, item)
        restored.append(id)
    }

    /// Deletes a folder and the descendants the deleter had seen. Descendants changed after
    /// `seenCursor` survive, and so do the folders that hold them (the folder itself included).
    private mutating func deleteFolder(_ folder: StoredItem, tombstone: ItemState, seenCursor: Int64) throws -> CommitResponse {
        var all: [StoredItem] = []
        var parentOf: [ItemID: ItemID] = [:]
        var queue = [folder.id]
        while let next = queue.popLast() {
            for child in try tx.liveChildren(of: next) {
                all.append(child)
                parentOf[child.id] = next
                if child.state.kind == .folder { queue.append(child.id) }
            }
        }
        var keep = Set<ItemID>()
        for item in all where item.version > seenCursor {
            var c: ItemID? = item.id
            while let id = c, id != folder.id, keep.insert(id).inserted { c = parentOf[id] }
        }
        // Deepest first, so the journal reads children before their folder.
        for item in all.reversed() where !keep.contains(item.id) {
            var gone = item.state
            gone.deleted = true
            gone.modified = max(now, item.state.modified)
            gone.modifiedBy = device.id
            _ = try write(item, gone)
        }
        if !keep.isEmpty {
            return response(.deleteIgnored, try tx.loadItem(folder.id) ?? folder)
        }
        let (item, _) = try write(folder, tombstone)
        return CommitResponse(outcome: .applied, item: item.record, restored: restored, cursor: lastSeq)
    }

    // MARK: resolve

    mutating func resolve(_ req: ResolveRequest, item id: ItemID) throws -> CommitResponse {
        let response = try apply(req, item: id)
        try regroupTrash()
        try pruneHistory()
        try tx.recordMetadata()
        return response
    }

    private mutating func apply(_ req: ResolveRequest, item id: ItemID) throws -> CommitResponse {
        guard let current = try tx.loadItem(id) else { throw APIError.itemNotFound(id) }
        let conflicts = try tx.versionSeqs(item: id, role: .conflict)
        switch req.action {
        case .keepCurrent:
            if conflicts.isEmpty { return response(.unchanged, current) }
            for seq in conflicts { try setRole(id, seq, .discarded) }
            return try bump(current, conflicts: 0, kind: .resolve)
        case .discard:
            let wanted = req.versions ?? []
            guard !wanted.isEmpty else { throw APIError(.badRequest, "\"discard\" needs \"versions\": the conflict versions to discard") }
            for seq in wanted where !conflicts.contains(seq) {
                throw APIError(.notAConflict, "version \(seq) is not an unresolved conflict version of this item; list them with GET …/versions")
            }
            for seq in Set(wanted) { try setRole(id, seq, .discarded) }
            return try bump(current, conflicts: conflicts.count - Set(wanted).count, kind: .resolve)
        case .keepVersion, .restore:
            guard let seq = req.version else { throw APIError(.badRequest, "\"\(req.action.rawValue)\" needs \"version\"") }
            guard let (role, state) = try tx.version(item: id, seq: seq), role != .discarded else {
                throw APIError(.versionNotFound, "item \(id) has no version \(seq): it never had one, it was discarded, or the server's history retention pruned it; list the versions with GET …/versions")
            }
            if req.action == .restore, role == .conflict {
                throw APIError(.badRequest, "version \(seq) is a conflict version; use \"keep_version\" to make it current")
            }
            var keptConflicts = conflicts
            if req.action == .keepVersion {
                for other in conflicts { try setRole(id, other, .discarded) }
                keptConflicts = []
            } else if role == .current {
                return response(.unchanged, current)
            }
            if role == .current {
                return try bump(current, conflicts: 0, kind: .resolve)
            }
            if role == .conflict { try setRole(id, seq, .discarded) }
            var next = state
            next.location = current.state.location
            next.deleted = false
            next.modified = max(now, WireRange.timeAfter(current.state.modified))
            next.modifiedBy = device.id
            let (item, renamed) = try write(current, next, conflicts: keptConflicts.count)
            return CommitResponse(outcome: .applied, item: item.record, renamed: renamed, restored: restored, cursor: lastSeq)
        }
    }

    /// Records a change of the conflict set only (the state stays).
    private mutating func bump(_ current: StoredItem, conflicts: Int, kind: ChangeKind) throws -> CommitResponse {
        let seq = try tx.nextSeq()
        let item = StoredItem(id: current.id, version: seq, conflicts: conflicts, state: current.state)
        try tx.saveItem(item)
        try journal(seq, kind, item)
        return CommitResponse(outcome: .applied, item: item.record, cursor: lastSeq)
    }

    // MARK: helpers

    /// Every role change goes through here: it stamps the time and remembers items that got an
    /// earlier version, for `pruneHistory`.
    private mutating func setRole(_ id: ItemID, _ seq: Int64, _ role: StoredRole) throws {
        try tx.setRole(item: id, seq: seq, role: role, at: now)
        if role.isEarlier, !retiredItems.contains(id) { retiredItems.append(id) }
    }

    private mutating func journal(_ seq: Int64, _ kind: ChangeKind, _ item: StoredItem) throws {
        try tx.appendJournal(seq: seq, kind: kind, item: item, device: device.id)
        lastSeq = seq
    }

    private func response(_ outcome: CommitOutcome, _ item: StoredItem) -> CommitResponse {
        CommitResponse(outcome: outcome, item: item.record, restored: restored, cursor: lastSeq)
    }

    private func checkChunks(_ content: ItemContent) throws {
        guard !content.chunks.isEmpty else { return }
        let owned = try tx.ownedChunks(content.chunks.map(\.hash))
        let missing = content.chunks.filter { owned[$0.hash] == nil }.map(\.hash)
        if !missing.isEmpty {
            let unique = Array(Set(missing)).sorted()
            throw APIError(.missingChunks, "\(unique.count) chunk(s) of this version are not on the server; upload them with PUT /v1/chunks/{hash} and commit again", missing: unique)
        }
        for c in content.chunks where owned[c.hash] != c.size {
            throw APIError(.chunkSizeMismatch, "chunk \(c.hash) has \(owned[c.hash] ?? 0) bytes on the server, not \(c.size); fix the chunk list and commit again")
        }
    }
}
