import Coordination
import ContainerFS
import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote

// Pull: first sync (listing) and the long-poll loop. Runs in the engine's pull task only, so
// cursor updates are not concurrent with each other.

extension SyncEngine {
    /// Lists the whole container and shows every item as a placeholder. Done once per state
    /// directory (when it has no cursor yet); afterwards the journal keeps it current.
    /// Bounded by the client's deadline per page.
    public func initialSync() async throws {
        _ = try await client.createContainer(container)
        guard !state.withLock({ $0.listed }) else { return }
        var all: [ServerItem] = []
        var after: ItemID?
        var cursor: Int64?
        repeat {
            let page = try await client.items(container, after: after, limit: ProtocolLimits.maxPage)
            if cursor == nil { cursor = page.cursor }
            all += page.items
            after = page.next
        } while after != nil
        try apply(all)
        try setCursor(cursor ?? 0)
        setConnection("online")
        log("first sync: \(all.count) items, cursor \(cursor ?? 0)")
    }

    /// Lists the whole container again and shows what is missing here (items already current
    /// are skipped by `apply`). The cursor is left alone: the journal still covers what follows.
    func relist() async throws {
        var all: [ServerItem] = []
        var after: ItemID?
        repeat {
            let page = try await client.items(container, after: after, limit: ProtocolLimits.maxPage)
            all += page.items
            after = page.next
        } while after != nil
        // Whatever is still skipped after this is recorded again by `apply`.
        state.withLock { $0.minSkipped = nil }
        try apply(all)
        log("relisted \(all.count) items after a folder came back")
    }

    func pullLoop() async {
        var backoff = 1
        while !Task.isCancelled {
            do {
                if !state.withLock({ $0.listed }) { try await initialSync() }
                // Versions held back for a program's lock when the daemon last stopped.
                if try store.meta("sync.relist") == "1" {
                    try await relist()
                    try store.setMeta("sync.relist", "0")
                }
                let since = state.withLock { $0.cursor }
                let r = try await client.changes(container, since: since, wait: options.longPoll, limit: ProtocolLimits.maxPage)
                // The last change per item is its state (docs/protocol.md "Changes").
                var last: [ItemID: Change] = [:]
                for c in r.changes { last[c.item.id] = c }
                try apply(last.values.sorted { $0.seq < $1.seq }.map(\.item))
                try setCursor(r.cursor)
                setConnection("online")
                backoff = 1
            } catch is CancellationError {
                return
            } catch {
                if Task.isCancelled { return }
                setConnection("offline (retrying in \(backoff) s)", error: "\(error)")
                log("pull failed: \(error); retrying in \(backoff) s")
                try? await Task.sleep(for: .seconds(backoff))
                backoff = min(backoff * 2, 30)
            }
        }
    }

    func setCursor(_ c: Int64) throws {
        state.withLock { s in s.cursor = c; s.listed = true }
        try store.setMeta("sync.cursor", "\(c)")
    }

    /// Shows server states here. Items with local changes not yet pushed are left alone: their
    /// commit carries the old base, the server merges or keeps both, and the commit's answer is
    /// applied then (a remote change never overwrites unsynced local bytes).
    func apply(_ items: [ServerItem]) throws {
        guard let fs = state.withLock({ $0.fs }) else { return }
        var claims: [Claim] = []
        defer { for c in claims { c.release() } }
        var states: [RemoteState] = []
        var newBases: [ItemID: Base?] = [:]
        var oldBases: [ItemID: Base?] = [:]
        for item in items {
            let (old, busy) = state.withLock { s in (s.bases[item.id], s.queued.contains(item.id) || s.inFlight == item.id) }
            if let old, old.version >= item.version { continue }  // our own commit coming back, or old news
            if busy { continue }
            // New content is applied under a write claim; while a program holds the file (a
            // lock) the new version waits until it lets go (SyncEngine+Claims.swift).
            if let old, item.kind == .file, !item.deleted, old.record.chunks != item.chunks {
                guard let claim = applyClaim(item, fs: fs) else { continue }
                claims.append(claim)
            }
            // A folder deleted elsewhere that holds local work not yet uploaded stays: the
            // upload makes the server keep (or bring back) the folder, as the rules say.
            if item.deleted && item.kind == .folder {
                let below = Set(fs.descendants(of: item.id))
                if !below.isEmpty && state.withLock({ s in !s.queued.isDisjoint(with: below) || s.inFlight.map(below.contains) == true }) {
                    log("folder \(item.name.value) was deleted elsewhere but holds changes not yet uploaded here; keeping it")
                    continue
                }
            }
            oldBases[item.id] = .some(old)
            let contentChanged = old.map { $0.record.chunks != item.chunks } ?? true
            states.append(Self.remoteState(item, resetContent: item.kind == .file && contentChanged))
            if item.deleted {
                newBases[item.id] = .some(nil)
            } else {
                newBases[item.id] = contentChanged ? Base.placeholder(item) : Base(record: item, present: old?.present)
            }
        }
        guard !states.isEmpty else { return }
        // Presence first, then the tree: a read that sees the new size must see "not present".
        try saveBases(newBases)
        let (actions, skipped) = fs.applyRemote(states)
        let versions = Dictionary(items.map { ($0.id, $0.version) }, uniquingKeysWith: max)
        if let low = skipped.compactMap({ versions[$0] }).min() {
            state.withLock { s in s.minSkipped = min(s.minSkipped ?? low, low) }
        }
        for id in skipped {
            // Keep the old base: the item is retried on its next change or commit answer.
            if let old = oldBases[id] { try saveBase(id, old) }
            log("remote item \(id) not shown here yet (its folder is missing, its name is taken, or it is being written here)")
        }
        sendKernel(actions)
    }

    static func remoteState(_ r: ServerItem, resetContent: Bool) -> RemoteState {
        RemoteState(id: r.id, parent: r.parent, name: r.name.value, kind: r.kind, perm: r.mode & 0o7777,
                    size: r.size, mtime: r.modified, target: r.symlinkTarget, deleted: r.deleted, resetContent: resetContent)
    }
}
