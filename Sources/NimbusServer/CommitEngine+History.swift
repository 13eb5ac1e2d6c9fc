import NimbusCore

extension CommitEngine {
    /// Prunes the earlier versions of every item this operation gave a new earlier version,
    /// inside the same transaction, under `history` (the rule is `HistoryRetention.prunable`).
    ///
    /// Only items touched now are pruned: the cost stays bounded by what the operation wrote, and
    /// an item nobody changes keeps its history until its next change (docs/deploy.md). The current
    /// version and unresolved conflict versions are never earlier versions, so they always stay.
    mutating func pruneHistory() throws {
        for id in retiredItems {
            let doomed = history.prunable(try tx.earlierVersions(of: id), now: now)
            guard !doomed.isEmpty else { continue }
            // Once a row that was current is gone, a base version at or above it has no known state.
            let floor = doomed.filter(\.wasCurrent).map(\.seq).max()
            try tx.deleteVersions(item: id, seqs: doomed.map(\.seq).sorted(), historyFloor: floor)
        }
        retiredItems = []
    }
}
