import NimbusProtocol

// `.nimbus/status`'s Recently Deleted lines: what the container's Recently Deleted holds, as
// the server last said (docs/trash.md). Purges and expiry leave no journal entry, so the figure
// is asked for again: after a page of changes that deletes or restores, after a listing or a
// purge from here, and when the status is read while the figure is over 10 s old. One ask
// at a time; a trigger during it asks once more after it.

extension SyncEngine {
    struct TrashFigures {
        /// The server's last answer (nil: not asked yet, or a server without the figure).
        var totals: TrashTotals?
        /// When it came.
        var at: ContinuousClock.Instant?
        var asking = false
        var again = false
    }

    /// The status lines, from `figures`.
    static func trashLines(_ figures: TrashFigures) -> [(String, String)] {
        guard let t = figures.totals else { return [("recently-deleted", "unknown"), ("recently-deleted-bytes", "unknown")] }
        return [("recently-deleted", "\(t.entries)"), ("recently-deleted-bytes", "\(t.bytes)")]
    }

    /// Asks the server for the figures (in a job), unless an ask is under way (then it asks
    /// once more after it).
    func refreshTrashFigures() {
        let start = state.withLock { s -> Bool in
            if s.trashFigures.asking { s.trashFigures.again = true; return false }
            s.trashFigures.asking = true
            return true
        }
        guard start else { return }
        let spawned = jobs.spawn {
            while true {
                let totals = try? await self.client.trashTotals(self.container)
                let now = self.options.clock.now
                let again = self.state.withLock { s -> Bool in
                    if let totals { s.trashFigures.totals = totals; s.trashFigures.at = now }
                    if s.trashFigures.again { s.trashFigures.again = false; return true }
                    s.trashFigures.asking = false
                    return false
                }
                if !again || Task.isCancelled { return }
            }
        }
        if !spawned { state.withLock { $0.trashFigures.asking = false } }
    }

    /// A full listing says what the figures are: no need to ask.
    func noteTrashListing(_ entries: [TrashEntry]) {
        let now = options.clock.now
        state.withLock { s in
            s.trashFigures.totals = TrashTotals(entries: entries.count, items: entries.reduce(0) { $0 + $1.items },
                                                bytes: entries.reduce(0) { $0 + $1.bytes })
            s.trashFigures.at = now
        }
    }

    /// Whether a page of changes changes Recently Deleted (a delete or a restore).
    static func changesTrash(_ changes: [Change]) -> Bool {
        changes.contains { $0.item.deleted || $0.kind == .restore }
    }

    /// The status was read: the figures are asked for again when they are over 10 s old.
    func trashFiguresRead() {
        let (at, online) = state.withLock { ($0.trashFigures.at, $0.link.state == .online) }
        guard online else { return }
        if let at, options.clock.now - at < .seconds(10) { return }
        refreshTrashFigures()
    }
}
