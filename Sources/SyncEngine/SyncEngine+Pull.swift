import Coordination
import Foundation
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusRemote
import PresenterProtocol
import SyncCore

// Pull: first sync (listing) and the long-poll loop. Runs in the engine's pull task only, so
// cursor updates are not concurrent with each other. What arrives is shown in turns of the
// engine loop (EngineLoop.swift); the network waits happen between them.

extension SyncEngine {
    /// Lists the whole container and shows every item as a placeholder. Done once per state
    /// directory (when it has no cursor yet); afterwards the journal keeps it current.
    /// Bounded by the client's deadline per page.
    public func initialSync() async throws {
        _ = try await client.createContainer(container)
        guard !state.withLock({ $0.pull.listed }) else { return }
        let started = ContinuousClock.now
        let (all, cursor) = try await listAll()
        let listed = ContinuousClock.now
        try await loop.turn(.listed(all.count)) {
            try apply(all)
            try setCursor(cursor)
        }
        setConnection(.online)
        log("first sync: \(all.count) items, cursor \(cursor); listed in \(listed - started), shown in \(ContinuousClock.now - listed)")
    }

    /// Lists the whole container again and shows what is missing here (items already current
    /// are skipped by `apply`). The cursor is left alone: the journal still covers what follows.
    func relist() async throws {
        let (all, cursor) = try await listAll()
        // A listing holds live items only: an item shown here from the server (it has a base)
        // that the listing lacks was deleted there. Its delete was not shown here (a folder kept
        // for local work, a state held while its upload was on its way) and the journal is past
        // it, so this is the only way it still comes: ask for its state and apply it
        // (EngineSimTests: a folder deleted elsewhere goes on a device that restarted meanwhile).
        let listed = Set(all.map(\.id))
        let missing: [(id: ItemID, version: Int64)] = try await loop.turn(.listed(all.count)) {
            // Whatever is still skipped after this is recorded again by `apply`.
            state.withLock { $0.pull.minSkipped = nil }
            try apply(all)
            return state.withLock { s in
                s.items.bases.compactMap { id, b in !b.record.deleted && id != .root && !listed.contains(id) ? (id, b.version) : nil }
                    .sorted { $0.id < $1.id }
            }
        }
        var gone: [ServerItem] = []
        var purged: [(id: ItemID, asked: Int64)] = []
        for (id, version) in missing {
            do {
                let now = try await client.item(container, id)
                if now.deleted { gone.append(now) }
            } catch {
                switch MissingItemAsk.of(code: (error as? RemoteError)?.code, failure: Self.classify(error)) {
                case .purged: purged.append((id, version))
                case .relistAgain: throw error
                case .skip: continue
                }
            }
        }
        if !gone.isEmpty || !purged.isEmpty {
            try await loop.turn(.listed(gone.count + purged.count)) {
                // Made from what is shown now: a state shown since the server was asked is newer
                // than its answer (SyncCore `PurgedItem`).
                let made = state.withLock { s in
                    purged.compactMap { p in s.base(p.id).flatMap { PurgedItem.deleted($0.record, asked: p.asked, cursor: cursor) } }
                }
                try apply(gone + made)
            }
        }
        log("listed the container again (\(all.count) items\(gone.isEmpty ? "" : ", \(gone.count) deleted there")): states not shown here before are shown now where they fit")
    }

    /// Every item of the container and the journal cursor the listing starts from (changes
    /// after it come through the journal; `apply` skips versions it has). A big container is
    /// listed in four id ranges at once (ids are random UUIDs, so the ranges are about equal):
    /// the server's page encoding is the bottleneck and runs on all its threads.
    func listAll() async throws -> (items: [ServerItem], cursor: Int64) {
        let limit = ProtocolLimits.maxPage
        let first = try await client.items(container, after: nil, limit: limit)
        guard let next = first.next else { return (first.items, first.cursor) }
        // Range k holds the ids after starts[k] (exclusive) and below ends[k]; range 0 goes on
        // after page one. Each range starts right below the next one's end, so no id falls between.
        let ends3 = ["40000000-0000-0000-0000-000000000000", "80000000-0000-0000-0000-000000000000",
                     "c0000000-0000-0000-0000-000000000000"].compactMap(ItemID.init)
        let below = ["3fffffff-ffff-ffff-ffff-ffffffffffff", "7fffffff-ffff-ffff-ffff-ffffffffffff",
                     "bfffffff-ffff-ffff-ffff-ffffffffffff"].compactMap(ItemID.init)
        var starts: [ItemID] = [next] + below
        var ends: [ItemID?] = ends3 + [nil]
        // Ranges page one already covered entirely are dropped.
        while starts.count > 1, next >= starts[1] { starts.remove(at: 1); ends.remove(at: 0) }
        let client = self.client, container = self.container
        let parts = try await withThrowingTaskGroup(of: (Int, [ServerItem]).self) { group in
            for k in starts.indices {
                let (start, end) = (starts[k], ends[k])
                group.addTask {
                    var out: [ServerItem] = []
                    var after: ItemID? = start
                    while let a = after {
                        let page = try await client.items(container, after: a, limit: limit)
                        for item in page.items {
                            if let end, item.id >= end { return (k, out) }
                            out.append(item)
                        }
                        after = page.next
                    }
                    return (k, out)
                }
            }
            var parts: [[ServerItem]] = Array(repeating: [], count: starts.count)
            for try await (k, items) in group { parts[k] = items }
            return parts
        }
        var all = first.items
        for p in parts { all += p }
        return (all, first.cursor)
    }

    func pullLoop() async {
        var backoff = PullRetry()
        while !Task.isCancelled, !isPaused {
            do {
                if !state.withLock({ $0.pull.listed }) { try await initialSync() }
                // Remote states not shown when the daemon last stopped (held for a writer or a
                // lock, name taken, folder missing) were retried from memory only, and items a
                // folder delete took with it after the server moved them out: list again.
                if state.withLock({ $0.pull.relist.due }) {
                    try await relist()
                    clearRelistMark()
                    setConnection(.online)
                }
                // Until the server has answered, ask without waiting: the status says "online"
                // as soon as it is, not after a long-poll.
                let (since, online) = state.withLock { ($0.pull.cursor, $0.link.state == .online) }
                let r = try await client.changes(container, since: since, wait: online ? options.longPoll : 0, limit: ProtocolLimits.maxPage)
                if Task.isCancelled || isPaused { return }  // paused while waiting: apply nothing
                // Small files' bytes came with the page: the files shown are filled from them.
                if let inline = r.inline {
                    state.withLock { s in for c in inline { s.downloads.inline.add(c.hash, Array(c.bytes)) } }
                }
                // The last change per item is its state (docs/protocol.md "Changes").
                var last: [ItemID: Change] = [:]
                for c in r.changes { last[c.item.id] = c }
                // Items skipped earlier (name taken, folder missing) may fit now that this page
                // moved things: tried again after it.
                let restored = Set(last.values.filter { $0.kind == .restore }.map(\.item.id))
                let skipped = try await applyAskingPresenters(last.values.sorted { $0.seq < $1.seq }.map(\.item), event: .page(r.changes.count),
                                                              restored: restored) {
                    state.withLock { s in s.skippedRemote().filter { r in last[r.id] == nil } }
                }
                let retry = skipped.isEmpty ? SkippedRetry() : await current(skipped)
                try await loop.turn(.skippedRetried(retry.items.count)) {
                    try applyRetry(retry)
                    try setCursor(r.cursor)
                }
                setConnection(.online)
                backoff.answered()
                if Self.changesTrash(r.changes) || state.withLock({ $0.trashFigures.at == nil }) { refreshTrashFigures() }
            } catch is CancellationError {
                return
            } catch {
                if Task.isCancelled { return }
                let refused = Self.classify(error) == .unauthorized
                let (next, wait) = backoff.failed(tokenRefused: refused)
                state.withLock { $0.link.pullFailed("\(error)", tokenRefused: refused) }
                setConnection(next, error: "\(error)")
                log("pull failed: \(error); retrying in \(wait) s")
                await options.clock.sleep(for: .seconds(wait))
            }
        }
    }

    /// `apply` in a turn of the engine loop (then `after`, in the same turn), with the presenters
    /// of files about to be replaced or deleted asked to relinquish first (all at once, bounded)
    /// and told to reacquire after (docs/presenters.md). The asks come before the turn and any
    /// claim, so a presenter that reacts by coordinating never waits for us.
    @discardableResult
    func applyAskingPresenters(_ items: [ServerItem], event: EngineLoop.Event, restored: Set<ItemID> = [],
                               after: () -> [ServerItem] = { [] }) async throws -> [ServerItem] {
        let fs = tree
        guard let presenters = services?.presenters, !presenters.isEmpty else {
            return try await loop.turn(event) { try apply(items, restored: restored); return after() }
        }
        let touched: [(ItemID, RelinquishReason)] = state.withLock { s in
            items.compactMap { item in
                ArrivingChange.of(item, over: s.base(item.id)).map { change in
                    switch change {
                    case .replace: (item.id, .replace)
                    case .delete: (item.id, .delete)
                    }
                }
            }
        }
        let asked = await withTaskGroup(of: (PresenterHub.Outcome, String).self) { group in
            for (id, reason) in touched {
                group.addTask {
                    let path = fs.path(of: id)
                    return (await presenters.ask(.relinquish, paths: [path], reason: reason), path)
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        defer { for (outcome, path) in asked { presenters.reacquire(outcome.asked, path: path) } }
        return try await loop.turn(event) { try apply(items, restored: restored); return after() }
    }

    /// Skipped states to try again, with each folder delete replaced by the folder's current
    /// state on the server (SyncCore `SkippedRetry`; RaceTests). Asked between turns;
    /// `applyRetry` shows the result in one.
    func current(_ skipped: [ServerItem]) async -> SkippedRetry {
        var out = SkippedRetry()
        for item in skipped {
            guard SkippedRetry.asksServer(item) else { out.add(item); continue }
            let asked = state.withLock { $0.base(item.id)?.version }
            do {
                out.add(item, current: try await client.item(container, item.id))
            } catch let e as RemoteError where e.code == .itemNotFound {
                out.addGone(item, asked: asked)
            } catch {
                out.add(item, current: nil)
            }
        }
        return out
    }

    /// Skipped states tried again (`current`, then `applyRetry` in a turn), when there are any.
    func retrySkipped(_ skipped: [ServerItem]) async throws {
        guard !skipped.isEmpty else { return }
        let retry = await current(skipped)
        try await loop.turn(.skippedRetried(retry.items.count)) { try applyRetry(retry) }
    }

    /// Shows what `current` found (in a turn).
    func applyRetry(_ r: SkippedRetry) throws {
        guard !r.isEmpty else { return }
        let made = state.withLock { s in
            for now in r.overtaking { s.items[now.id, default: SyncItem()].remote.skip(now) }
            return r.purgedDeletes(shown: { s.base($0)?.record }, cursor: s.pull.cursor)
        }
        try apply(r.items + made)
    }

    /// Notes on disk that a remote state was not shown here (skipped, or held for a writer or a
    /// lock). While the daemon runs it is retried from memory (after pages, pushes, closes and
    /// unlocks); the mark makes the next start list the container again, so a crash or restart
    /// never forgets it (EngineSimTests: an item renamed elsewhere onto a name taken here,
    /// skipped, then a crash: it still gets its new name). Written once per run.
    func markRelist() {
        relistDiskLock.withLock { _ in
            if state.withLock({ $0.pull.relist.mark() }) { try? store.setMeta("sync.relist", "1") }
        }
    }

    /// After the start's relist: the mark goes unless that relist left something not shown.
    func clearRelistMark() {
        relistDiskLock.withLock { _ in
            if state.withLock({ $0.pull.relist.listed() }) { try? store.setMeta("sync.relist", "0") }
        }
    }

    func setCursor(_ c: Int64) throws {
        state.withLock { s in s.pull.cursor = c; s.pull.listed = true }
        try store.setMeta("sync.cursor", "\(c)")
    }

    /// Shows server states here. Items with local changes not yet pushed are left alone: their
    /// commit carries the old base, the server merges or keeps both, and the commit's answer is
    /// applied then (a remote change never overwrites unsynced local bytes).
    /// `restored`: items whose state is a restore from Recently Deleted (for the event line).
    func apply(_ items: [ServerItem], force: Set<ItemID> = [], restored: Set<ItemID> = []) throws {
        assert(EngineLoop.inTurn, "apply outside a turn of the engine loop")
        let fs = tree
        var claims: [Claim] = []
        defer { for c in claims { c.release() } }
        var states: [RemoteState] = []
        var newBases: [ItemID: Base?] = [:]
        var oldBases: [ItemID: Base?] = [:]
        var relistAfter = false
        var moving: [ItemID: ItemID]?  // the batch's live states: item → folder (folder deletes only)
        defer {
            if relistAfter {
                state.withLock { $0.pull.relist.due = true }
                markRelist()
            }
        }
        let t0 = ContinuousClock.now
        let look = ApplyLookups(
            place: { fs.localState($0).map { (parent: $0.parent, name: $0.name) } },
            openForWriting: { fs.writeState($0).map { $0.writers > 0 || $0.dirty } },
            below: { folder in
                let ids = fs.descendants(of: folder)
                // A file open for writing has local work: its upload waits for the close, so it
                // is in no queue. So has one whose change the engine has not heard of yet (a save
                // renamed over it tells the engine after the tree's lock is released).
                let open = Set(ids.filter { fs.writeState($0).map { $0.writers > 0 || $0.dirty || $0.unnoticed } ?? false })
                if moving == nil {
                    moving = Dictionary(items.filter { !$0.deleted }.map { ($0.id, $0.parent) }, uniquingKeysWith: { _, b in b })
                }
                return self.state.withLock { s in
                    ids.map { id in
                        BelowDeletedFolder(id: id, localWork: open.contains(id) || s.push.queue.hasWork(id) || s.isWriting(id),
                                           baseVersion: s.base(id)?.version,
                                           serverParent: moving?[id] ?? s.items[id]?.remote.skipped.flatMap { $0.deleted ? nil : $0.parent })
                    }
                }
            },
            descendants: fs.descendants)
        items: for item in items {
            // Read before the checks below: a write that starts after them keeps the file.
            let generation = item.kind == .file ? fs.writeState(item.id)?.generation : nil
            // Likewise the moves here the engine has heard of: one since (or one whose notice is
            // still on its way, so it is in no queue yet) keeps the local place.
            let placed = fs.placeGeneration(item.id)
            let (old, busy, gone) = state.withLock { s in (s.base(item.id), s.push.queue.hasWork(item.id), s.pull.deletesShown[item.id]) }
            let (facts, leaving) = ApplyFacts.gather(item, old: old, pushPending: busy, forced: force.contains(item.id), deleteShown: gone, look)
            let step = state.withLock { s -> ApplyStep in
                var record = s.items[item.id] ?? SyncItem()
                let step = record.planApply(item, facts)
                s.items[item.id] = record
                return step
            }
            switch step {
            case .oldNews:
                break
            case .heldForPush, .heldForWriter:
                // Its push answers it: a commit's answer supersedes it (or the server keeps both),
                // a push that finds nothing to send applies it then (never dropped). A writer's
                // close or fsync lets it in.
                trace("pull \(item.id) v\(item.version): held for \(step == .heldForPush ? "its push" : "the writer") (base v\(old?.version ?? -1))")
            case .folderKept:
                // Tried again after the pushes (like a skipped state): once they are done — the
                // server brought the folder back (a newer version overtakes this one), or the
                // local work went too — the delete goes in.
                log("folder \(item.name.value) was deleted elsewhere but holds changes not yet uploaded here; keeping it")
            case .show:
                trace("pull \(item.id) v\(item.version) \(item.deleted ? "deleted" : item.name.value) (base v\(old?.version ?? -1))"
                      + (SyncedXattrs.of(item.extra).map { " xattrs [\($0.keys.sorted().joined(separator: ","))]" } ?? ""))
            }
            for action in step.actions(item, old: old, leaving: leaving) {
                switch action {
                case .markRelist:
                    markRelist()
                case .relistAfter:
                    relistAfter = true
                case .deleteShown(let version):
                    state.withLock { $0.pull.deletesShown[item.id] = version }
                case .claim:
                    // A program holding the file (a lock) makes the new version wait until it
                    // lets go (SyncEngine+Claims.swift).
                    guard let claim = applyClaim(item, fs: fs) else { continue items }
                    claims.append(claim)
                case .show(let resetContent, let base, let frozen):
                    oldBases[item.id] = .some(old)
                    var rs = Self.remoteState(item, resetContent: resetContent)
                    rs.restored = restored.contains(item.id)
                    rs.unlessWrittenSince = generation
                    rs.unlessMovedSince = placed
                    // Open readers keep the old file: they may read what of it was here.
                    rs.oldPresent = frozen.map { f -> @Sendable (Range<Int64>) -> Bool in { f.missing(in: $0).isEmpty } }
                    states.append(rs)
                    newBases[item.id] = .some(base)
                }
            }
        }
        guard !states.isEmpty else { return }
        // Presence switches with the tree, under the filesystem lock (`applied`): a read that
        // sees the new size sees "not present", and a download of the old content started before
        // counts for nothing (`CacheUse.generation`).
        let resets = Set(states.filter(\.resetContent).map(\.id))
        let t1 = ContinuousClock.now
        var shown: [ItemID: Base?] = [:]
        let skipped = fs.show(states) { id in
            guard let nb = newBases[id] else { return }
            state.withLock { s in
                s.setBase(id, nb)
                if resets.contains(id) { s.items.newGeneration(id) }
            }
            shown[id] = nb
        }
        // The bases (and then the cursor) join the store's queue behind the tree changes they
        // stand for, so no crash leaves a base or a cursor on disk that says an item is shown
        // while its row is not (EngineSimTests: a folder created elsewhere appears on a device
        // that crashed just after applying it).
        let t2 = ContinuousClock.now
        if !shown.isEmpty {
            state.withLock { s in for id in shown.keys { s.items[id]?.remote.skippedShown() } }
        }
        try persistBases(shown)
        // Parked items are looked at again when a rules file or a folder's place changed.
        checkRules(why: "states from the server shown")
        if items.count >= 10_000 {
            log("applied \(items.count) items: checks \(t1 - t0), tree \(t2 - t1), bases queued \(ContinuousClock.now - t2)")
        }
        // New content of pinned files is downloaded at once, and so is that of small files whose
        // bytes came with the page (no request: the download takes them).
        let fresh = states.filter { $0.kind == .file && $0.resetContent && !$0.deleted && !skipped.contains($0.id) }.map(\.id)
        let byID = Dictionary(items.map { ($0.id, $0) }, uniquingKeysWith: { a, b in a.version >= b.version ? a : b })
        let (pins, inlined) = state.withLock { s -> (Pins, [ItemID]) in
            guard s.downloads.inline.count > 0 else { return (s.cache.pinned, []) }
            return (s.cache.pinned, fresh.filter { id in byID[id].map { $0.chunks.count == 1 && s.downloads.inline.holds($0.chunks[0].hash) } ?? false })
        }
        // So is that of `.nimbusignore` files: pushes below one wait for its rules.
        let rules = states.filter { $0.kind == .file && $0.resetContent && !$0.deleted && ItemName.same($0.name, IgnoreMatch.fileName) }.map(\.id)
        let pinned = pins.covered(fresh, ancestors: fs.ancestors) + rules.filter { !skipped.contains($0) }
        let pinnedSet = Set(pinned)
        try? fetchWhole(Array(Set(pinned)) + inlined.filter { !pinnedSet.contains($0) }, priority: 1)
        state.withLock { s in s.pull.minSkipped = SeenCursor.lowestSkipped(s.pull.minSkipped, adding: skipped.compactMap { byID[$0]?.version }) }
        for id in skipped {
            // The old base stays: the item is retried on its next change or commit answer.
            // A file that opened for writing meanwhile: its version waits like those above.
            // Its name is taken here (by an item not uploaded yet) or its folder is missing: tried
            // again after each push, which may rename or create what was in the way. A file that
            // opened for writing meanwhile: its version waits for the writer like those above.
            if let item = byID[id] {
                let shownBefore: Bool = if case .some(.some) = oldBases[id] { true } else { false }
                let writing = fs.writeState(id).map { $0.writers > 0 || $0.dirty } ?? false
                state.withLock { $0.items[id, default: SyncItem()].notShown(item, shownBefore: shownBefore, openForWriting: writing) }
                markRelist()
            }
            log("remote item \(id) not shown here yet (its folder is missing, its name is taken, or it is being written here)")
        }
    }

    static func remoteState(_ r: ServerItem, resetContent: Bool) -> RemoteState {
        var s = RemoteState(id: r.id, parent: r.parent, name: r.name.value, kind: r.kind, perm: r.mode & ItemLimits.syncedPermissions,
                            size: r.size, mtime: r.modified, target: r.symlinkTarget, deleted: r.deleted, resetContent: resetContent)
        s.version = r.version
        s.xattrs = SyncedXattrs.of(r.extra)
        return s
    }
}
