import NimbusCore
import NimbusProtocol
import NimbusServer
import SyncCore

/// The model's clock: nanoseconds of simulated time.
struct SimInstant: InstantProtocol, Sendable {
    var ns: Int64
    func advanced(by d: Duration) -> SimInstant {
        let (s, a) = d.components
        return SimInstant(ns: ns &+ s &* 1_000_000_000 &+ a / 1_000_000_000)
    }
    func duration(to other: SimInstant) -> Duration { .nanoseconds(other.ns &- ns) }
    static func < (a: SimInstant, b: SimInstant) -> Bool { a.ns < b.ns }
}

/// File contents in the model: a token per write; a non-empty content is one chunk whose hash
/// carries the token.
enum ModelContent {
    static let chunkSize: Int64 = 8

    static func chunks(_ token: UInt64) -> [ChunkRef] {
        guard token != 0 else { return [] }
        var digest = [UInt8](repeating: 0, count: 32)
        for i in 0..<8 { digest[i] = UInt8(truncatingIfNeeded: token >> (56 - 8 * UInt64(i))) }
        return [ChunkRef(hash: ContentHash(digest: digest), size: chunkSize)]
    }

    static func token(_ chunks: [ChunkRef]) -> UInt64 {
        chunks.first.flatMap { UInt64($0.hash.hex.prefix(16), radix: 16) } ?? 0
    }
}

/// One entry of a device's tree.
struct ModelNode: Equatable {
    var parent: ItemID
    var name: String
    var kind: ItemKind
    var content: UInt64 = 0
    var modified: Int64
    /// Bumped by every local write of the content (ContainerFS's write generation).
    var writeGen = 0
}

/// What a device's requests ask of the server, and what comes back.
enum ModelRequest {
    case commit(CommitRequest)
    /// A delete of an item this device never got an answer for (`createdWithoutAnswer`): the
    /// server is asked for the item, and the delete goes on its first version.
    case deleteUnanswered(ItemID, seenCursor: Int64)
    /// The journal after `since`, and the current states of folders whose delete was kept here.
    case changes(since: Int64, folders: [ItemID])
    /// The whole container (first sync, or a relist after a restart), and the current states of
    /// `missing` (items shown here that the listing may lack).
    case list(missing: [ItemID])
    /// The server's current state of an item (a refused move is put back).
    case item(ItemID)
}

enum ModelAnswer {
    case commit(Result<CommitResponse, APIError>)
    case nothing
    case changes(ChangesResponse, folders: [ItemRecord])
    case list([ItemRecord], cursor: Int64, missing: [ItemRecord])
    case item(ItemRecord?)
}

/// One device of the model simulation: the state a mount keeps on disk (the tree, the bases, the
/// pending changes, the cursor, the relist mark) and in memory (the `SyncItem` records, what is
/// on its way), driven by the same SyncCore decisions as the engine (`pushStep`, `planApply`).
/// Requests go out through the world's network; answers come back as calls.
struct ModelDevice {
    struct Disk {
        var tree: [ItemID: ModelNode] = [:]
        var bases: [ItemID: ItemRecord] = [:]
        /// Pending local changes per item: the sequence numbers of the first and last.
        var ops: [ItemID: (first: Int, last: Int)] = [:]
        var opSeq = 0
        var cursor: Int64 = 0
        var listed = false
        var relist = false
    }

    struct InFlight {
        var request: Int
        var id: ItemID
        var sent: ItemDraft?
        var previous: ItemRecord?
        var writeGen: Int
        var upTo: Int
        var deadline: SimInstant
    }

    let index: Int
    let record: DeviceRecordLike
    var disk = Disk()
    // Memory (lost in a crash).
    var items: [ItemID: SyncItem<SimInstant>] = [:]
    var queue = UploadQueue<ItemID>()
    var inFlight: InFlight?
    var pull: (request: Int, deadline: SimInstant, relist: Bool)?
    var minSkipped: Int64?
    /// Set at a start when the disk says a state was held back: the first pull lists the container.
    var relistNow = false
    var online = true
    var log: [String] = []

    struct DeviceRecordLike { var id: DeviceID; var name: String }

    static let timeout: Duration = .seconds(5)
    static let rules = UploadPacing<SimInstant>.Rules(quietPeriod: .seconds(2))

    init(index: Int, id: DeviceID) {
        self.index = index
        self.record = DeviceRecordLike(id: id, name: String(UnicodeScalar(UInt8(97 + index))))
    }

    // MARK: local operations (what programs do in the mount)

    func isLiveFolder(_ id: ItemID) -> Bool { id.isRoot || disk.tree[id]?.kind == .folder }

    func nameTaken(_ name: String, in parent: ItemID, excluding id: ItemID? = nil) -> Bool {
        disk.tree.contains { $0.key != id && $0.value.parent == parent && $0.value.name == name }
    }

    func descendants(of id: ItemID) -> [ItemID] {
        var out: [ItemID] = []
        var stack = [id]
        while let next = stack.popLast() {
            for (child, node) in disk.tree.sorted(by: { $0.key < $1.key }) where node.parent == next {
                out.append(child)
                if node.kind == .folder { stack.append(child) }
            }
        }
        return out
    }

    func isInside(_ folder: ItemID, _ id: ItemID) -> Bool {
        var p: ItemID? = folder
        while let x = p, !x.isRoot {
            if x == id { return true }
            p = disk.tree[x]?.parent
        }
        return false
    }

    mutating func localChange(_ id: ItemID) {
        disk.opSeq += 1
        disk.ops[id] = (disk.ops[id]?.first ?? disk.opSeq, disk.opSeq)
        queue.append(id)
    }

    mutating func create(_ id: ItemID, kind: ItemKind, name: String, in parent: ItemID, content: UInt64, now: Int64) {
        disk.tree[id] = ModelNode(parent: parent, name: name, kind: kind, content: content, modified: now)
        localChange(id)
    }

    mutating func write(_ id: ItemID, content: UInt64, now: Int64) {
        disk.tree[id]?.content = content
        disk.tree[id]?.modified = now
        disk.tree[id]?.writeGen += 1
        localChange(id)
    }

    mutating func move(_ id: ItemID, to parent: ItemID, name: String) {
        disk.tree[id]?.parent = parent
        disk.tree[id]?.name = name
        localChange(id)
    }

    /// `rm -r`: the items below first, then the item; returns what went.
    mutating func remove(_ id: ItemID) -> [ItemID] {
        let gone = descendants(of: id).reversed() + [id]
        for g in gone {
            disk.tree[g] = nil
            localChange(g)
        }
        return gone
    }

    // MARK: crash and restart

    /// Whatever was only in memory goes; the next start relists if a state was held back.
    mutating func crash() {
        items = [:]
        inFlight = nil
        pull = nil
        minSkipped = nil
        relistNow = disk.relist
        // The queue is rebuilt from the pending changes on disk, in the order of their first.
        queue = UploadQueue()
        for (id, _) in disk.ops.sorted(by: { $0.value.first < $1.value.first }) { queue.append(id) }
    }

    // MARK: push

    /// The first ready item of the queue goes (a folder above it not on the server yet first).
    mutating func startPush(now: SimInstant, send: (ModelRequest) -> Int) {
        guard online, inFlight == nil, disk.listed else { return }
        guard var id = queue.takeFirst(where: { items[$0]?.upload.ready(at: now) ?? true }) else { return }
        if let first = folderToCreateFirst(for: id) {
            queue.remove(first)
            queue.prepend(id)
            id = first
        }
        let upTo = disk.ops[id]?.last ?? 0
        let base = disk.bases[id]
        let node = disk.tree[id]
        let facts = PushFacts(exists: node != nil, isFile: node?.kind == .file, hasBase: base != nil, complete: true, now: now)
        let step = (items[id] ?? SyncItem()).pushStep(facts, rules: Self.rules)
        switch step {
        case .commitDelete:
            if let base, base.deleted { return finishPush(id, upTo: upTo) }
            let held = items.values.flatMap(\.remote.heldVersions) + (minSkipped.map { [$0] } ?? [])
            let seen = SeenCursor.forDelete(cursor: disk.cursor, notShown: held)
            guard let base else {
                let r = send(.deleteUnanswered(id, seenCursor: seen))
                inFlight = InFlight(request: r, id: id, sent: nil, previous: nil, writeGen: 0, upTo: upTo, deadline: now.advanced(by: Self.timeout))
                return
            }
            var d = ItemDraft(base)
            d.deleted = true
            let r = send(.commit(CommitRequest(item: id, baseVersion: base.version, state: d, seenCursor: seen)))
            inFlight = InFlight(request: r, id: id, sent: d, previous: base, writeGen: 0, upTo: upTo, deadline: now.advanced(by: Self.timeout))
        case .keepLocal, .waitForSafeSave, .waitForWriter, .waitForLock:
            log.append("push \(id): \(step) (the model has no such facts)")
        case .paced(let until):
            items[id, default: SyncItem()].upload.notBefore = until
            queue.prepend(id)
        case .commit:
            guard let node else { return }
            var draft = ItemDraft(kind: node.kind, parent: node.parent, name: ItemName(trusted: node.name),
                                  mode: node.kind == .folder ? 0o755 : 0o644, modified: node.modified, extra: base?.extra)
            draft.chunks = ModelContent.chunks(node.content)
            if CommitPlan.nothingToSend(base: base, draft: draft, timeSetOnPurpose: false) {
                log.append("push \(id): nothing to send")
                finishPush(id, upTo: upTo)
                if let held = items[id]?.remote.forWriter {
                    items[id]?.remote.forWriter = nil
                    apply([held])
                }
                return
            }
            let r = send(.commit(CommitRequest(item: id, baseVersion: base?.version, state: draft, seenCursor: disk.cursor)))
            inFlight = InFlight(request: r, id: id, sent: draft, previous: base, writeGen: node.writeGen, upTo: upTo, deadline: now.advanced(by: Self.timeout))
        }
    }

    func folderToCreateFirst(for id: ItemID) -> ItemID? {
        var above: [ItemID] = []
        var p = disk.tree[id]?.parent
        while let x = p, !x.isRoot { above.append(x); p = disk.tree[x]?.parent }
        return above.last { disk.bases[$0] == nil && queue.contains($0) }
    }

    /// The pending changes up to `upTo` are on the server.
    mutating func finishPush(_ id: ItemID, upTo: Int) {
        if let ops = disk.ops[id], ops.last <= upTo { disk.ops[id] = nil }
        items[id]?.upload.failure = nil
        // The push is over: a state held for it goes in now (`planApply` lets old news go).
        if inFlight?.id != id, !queue.contains(id), let held = items[id]?.remote.forWriter {
            items[id]?.remote.forWriter = nil
            apply([held])
        }
    }

    /// No answer in time, or an error to retry: the item stays queued, with a back-off.
    mutating func pushFailed(_ f: InFlight, now: SimInstant, why: String) {
        let delay = items[f.id, default: SyncItem()].upload.failed(.transient, at: now)
        queue.prepend(f.id)
        log.append("push \(f.id) failed (\(why)); retry in \(delay) s")
    }

    mutating func commitAnswered(_ f: InFlight, _ result: Result<CommitResponse, APIError>?, now: SimInstant, send: (ModelRequest) -> Int) {
        inFlight = nil
        guard let result else {
            // `deleteUnanswered`: the server never had the item.
            return finishPush(f.id, upTo: f.upTo)
        }
        switch result {
        case .failure(let e):
            if e.code == .moveCycle {
                // A refused move goes back to where the server has it.
                disk.relist = true
                relistNow = true
                disk.ops[f.id] = nil
                items[f.id]?.upload.failure = nil
                _ = send(.item(f.id))
                log.append("push \(f.id): move refused (cycle); put back")
                return
            }
            return pushFailed(f, now: now, why: "\(e.code.rawValue)")
        case .success(let r):
            if f.sent?.deleted ?? true {
                deleteAnswered(f, r)
            } else {
                items[f.id]?.remote.answered(r.item.version)
                settle(f, r)
                if let held = items[f.id]?.remote.forWriter {
                    items[f.id]?.remote.forWriter = nil
                    apply([held])
                }
            }
            finishPush(f.id, upTo: f.upTo)
            if queue.isEmpty { retrySkipped(current: [:]) }
        }
    }

    mutating func deleteAnswered(_ f: InFlight, _ r: CommitResponse) {
        let id = f.id
        items[id]?.remote.answered(r.item.version)
        disk.bases[id] = nil
        if !r.item.deleted {
            // delete_ignored: edited elsewhere meanwhile; it comes back here.
            apply([r.item])
            if r.item.kind == .folder { relistNow = true }
        }
        if let newer = items[id]?.remote.forWriter {
            items[id]?.remote.forWriter = nil
            apply([newer])
        }
    }

    /// The engine's `settle`: the commit's answer becomes the base, and the server's state is
    /// shown where it differs from what was sent.
    mutating func settle(_ f: InFlight, _ r: CommitResponse) {
        let id = f.id, item = r.item
        guard let sent = f.sent else { return }
        let relocate = items[id]?.upload.relocate == true
        items[id]?.upload.relocate = false
        let sameContent = item.chunks == sent.chunks
        let facts = SettleFacts(
            deletedElsewhere: item.deleted && !sent.deleted,
            writtenSince: disk.tree[id].map { $0.writeGen != f.writeGen } ?? false,
            sameContent: sameContent,
            samePlace: item.parent == sent.parent && item.name == sent.name && item.mode == sent.mode,
            existsHere: disk.tree[id] != nil, hadBase: f.previous != nil)
        let resetContent: Bool
        switch (items[id] ?? SyncItem()).planSettle(facts, isFile: item.kind == .file) {
        case .deletedElsewhere(let keptForWrite):
            disk.bases[id] = f.previous
            if !keptForWrite { apply([item]) }
            return
        case .record:
            disk.bases[id] = item
            return
        case .deletedHere(let onAnswer):
            disk.bases[id] = onAnswer ? item : f.previous
            return
        case .show(let reset):
            resetContent = reset
        }
        guard let here = disk.tree[id] else { return }
        disk.bases[id] = item
        let sentPlace = relocate ? (item.parent, item.name.value) : (sent.parent, sent.name.value)
        if !show(item, resetContent: resetContent, unlessWrittenSince: f.writeGen, sentPlace: sentPlace) {
            log.append("settle \(id) v\(item.version): not shown yet")
            disk.bases[id] = f.previous ?? item
            // Without a previous base the engine keeps the answer as a placeholder base: reads
            // here get the server's content from then on (the model has no presence map), unless
            // the file was written since (then it is whole here, and the write goes next).
            if f.previous == nil, !sameContent, here.writeGen == f.writeGen { disk.tree[id]?.content = ModelContent.token(item.chunks) }
            items[id, default: SyncItem()].remote.skipped = item
            disk.relist = true
            if let previous = f.previous, relocate
                || ((previous.parent != sent.parent || previous.name != sent.name)
                    && here.parent == previous.parent && here.name == previous.name.value) {
                items[id, default: SyncItem()].upload.relocate = true
            }
        } else if relocate, let now = disk.tree[id], now.parent != item.parent || now.name != item.name.value {
            localChange(id)
        }
    }

    // MARK: pull

    mutating func startPull(now: SimInstant, send: (ModelRequest) -> Int) {
        guard online, pull == nil else { return }
        if !disk.listed || relistNow {
            let missing = disk.bases.filter { !$0.value.deleted }.map(\.key).sorted()
            pull = (send(.list(missing: missing)), now.advanced(by: Self.timeout), true)
            return
        }
        let folders = skippedRemote().filter { $0.deleted && $0.kind == .folder }.map(\.id)
        pull = (send(.changes(since: disk.cursor, folders: folders)), now.advanced(by: Self.timeout), false)
    }

    mutating func listed(_ all: [ItemRecord], cursor: Int64, missing: [ItemRecord]) {
        pull = nil
        if !disk.listed {
            apply(all)
            disk.cursor = cursor
            disk.listed = true
            return
        }
        // The engine's relist: what is not shown is shown where it fits; items the listing
        // lacks were deleted there.
        relistNow = false
        disk.relist = false
        minSkipped = nil
        apply(all)
        let listedIDs = Set(all.map(\.id))
        let gone = missing.filter { $0.deleted && !listedIDs.contains($0.id) }
        if !gone.isEmpty { apply(gone) }
    }

    mutating func changesAnswered(_ r: ChangesResponse, folders: [ItemRecord]) {
        pull = nil
        var last: [ItemID: Change] = [:]
        for c in r.changes { last[c.item.id] = c }
        apply(last.values.sorted { $0.seq < $1.seq }.map(\.item))
        let current = Dictionary(folders.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        retrySkipped(current: current, except: Set(last.keys))
        disk.cursor = r.cursor
    }

    func skippedRemote() -> [ItemRecord] {
        items.sorted { $0.key < $1.key }.compactMap { $0.value.remote.skipped }
    }

    /// Skipped states tried again; a kept folder delete is replaced by the folder's current
    /// state when the server told it (`current`), else waits.
    mutating func retrySkipped(current: [ItemID: ItemRecord], except: Set<ItemID> = []) {
        var out: [ItemRecord] = []
        for s in skippedRemote() where !except.contains(s.id) {
            guard s.deleted, s.kind == .folder else { out.append(s); continue }
            guard let now = current[s.id] else { continue }
            if now.version > s.version { items[s.id]?.remote.skipped = now }
            out.append(now.version >= s.version ? now : s)
        }
        if !out.isEmpty { apply(out) }
    }

    // MARK: apply

    /// The engine's `apply`: `planApply` decides, the tree shows.
    mutating func apply(_ states: [ItemRecord], force: Set<ItemID> = []) {
        var pending: [(ItemRecord, Bool)] = []
        for item in states {
            let old = disk.bases[item.id]
            let busy = queue.contains(item.id) || inFlight?.id == item.id
            var facts = ApplyFacts(shownVersion: old?.version, contentDiffers: old.map { $0.chunks != item.chunks } ?? false,
                                   forced: force.contains(item.id), pushPending: busy)
            var leaving = false
            if let old, old.version == item.version, !busy, !item.deleted {
                facts.placeDiffers = disk.tree[item.id].map { $0.parent != item.parent || $0.name != item.name.value } ?? true
            }
            if item.deleted, item.kind == .folder {
                let below = descendants(of: item.id)
                facts.localWorkBelow = below.contains { queue.contains($0) || inFlight?.id == $0 }
                let moving = Dictionary(states.filter { !$0.deleted }.map { ($0.id, $0.parent) }, uniquingKeysWith: { _, b in b })
                let inside = Set(below)
                let leavers = below.filter { id in
                    let to = moving[id] ?? items[id]?.remote.skipped.flatMap { $0.deleted ? nil : $0.parent }
                    return to.map { $0 != item.id && !inside.contains($0) } ?? false
                }
                leaving = !leavers.isEmpty
                let gone = Set(leavers + leavers.flatMap { descendants(of: $0) })
                facts.newerBelow = below.contains { !gone.contains($0) && (disk.bases[$0]?.version ?? 0) > item.version }
            }
            var rec = items[item.id] ?? SyncItem()
            let step = rec.planApply(item, facts)
            items[item.id] = rec
            if leaving, case .show = step {
                disk.relist = true
                relistNow = true
            }
            if step.holds { disk.relist = true }
            guard case .show(let reset, _) = step else {
                if step != .oldNews {
                    let why = step == .folderKept ? " (" + descendants(of: item.id).map { "\($0) v\(disk.bases[$0]?.version ?? -1)\(queue.contains($0) ? " queued" : "")" }.joined(separator: ", ") + ")" : ""
                    log.append("\(item.id) v\(item.version): \(step)\(why)")
                }
                continue
            }
            pending.append((item, reset))
        }
        // Shown in order; one whose place is taken by an item this batch moves away is tried
        // again after the others (ContainerFS `waitForName`).
        var skipped: [ItemRecord] = []
        var rounds = 0
        while !pending.isEmpty, rounds < 2 * states.count + 2 {
            rounds += 1
            var again: [(ItemRecord, Bool)] = []
            for (item, reset) in pending {
                if show(item, resetContent: reset, unlessWrittenSince: nil, sentPlace: nil) {
                    log.append("\(item.id) v\(item.version): shown\(item.deleted ? " (deleted)" : " at \(item.parent)/\(item.name.value)")")
                    disk.bases[item.id] = item.deleted ? nil : item
                    items[item.id]?.remote.skipped = nil
                } else {
                    again.append((item, reset))
                }
            }
            if again.count == pending.count, !setAsideOneOfACycle(again.map(\.0)) { break }
            pending = again
        }
        skipped = pending.map(\.0)
        for item in skipped {
            log.append("\(item.id) v\(item.version): not shown (\(item.parent)/\(item.name.value)); skipped")
            items[item.id, default: SyncItem()].remote.skipped = item
            disk.relist = true
            minSkipped = min(minSkipped ?? item.version, item.version)
        }
    }

    /// ContainerFS's rule for names that form a cycle among states waiting to be shown (X takes
    /// Y's name while Y takes X's): one item of the cycle gives up its name, so the others move,
    /// and it takes its own new place in the next pass. Only when every move of the cycle can go.
    mutating func setAsideOneOfACycle(_ waiting: [ItemRecord]) -> Bool {
        let ids = Set(waiting.map(\.id))
        // Each waiting state → the waiting item it waits for: the holder of the name it wants,
        // or its folder when that is not here yet and waits too.
        var holder: [ItemID: (ItemID, byName: Bool)] = [:]
        for s in waiting where !s.deleted {
            if !isLiveFolder(s.parent) {
                if ids.contains(s.parent) { holder[s.id] = (s.parent, false) }
                continue
            }
            guard let occupant = disk.tree.first(where: { $0.key != s.id && $0.value.parent == s.parent && $0.value.name == s.name.value })?.key,
                  ids.contains(occupant) else { continue }
            holder[s.id] = (occupant, true)
        }
        let byID = Dictionary(waiting.map { ($0.id, $0) }, uniquingKeysWith: { _, b in b })
        for start in holder.keys.sorted() {
            var path = [start]
            var cur = start
            while let (next, _) = holder[cur] {
                if let at = path.firstIndex(of: next) {
                    let cycle = Array(path[at...])
                    let movable = cycle.allSatisfy { id in
                        guard let st = byID[id], isLiveFolder(st.parent) || ids.contains(st.parent) else { return false }
                        return !(disk.tree[id]?.kind == .folder && isInside(st.parent, id))
                    }
                    // The one set aside holds a name another of the cycle wants.
                    guard movable, let from = cycle.first(where: { holder[$0]?.byName == true }),
                          let aside = holder[from]?.0, disk.tree[aside] != nil else { return false }
                    disk.tree[aside]?.name = "\u{1}aside \(aside)"
                    return true
                }
                path.append(next)
                cur = next
            }
        }
        return false
    }

    /// ContainerFS `applyRemote` for one state: false when it cannot be shown now (its folder is
    /// missing, its name taken, written since, or a folder into itself).
    mutating func show(_ item: ItemRecord, resetContent: Bool, unlessWrittenSince: Int?, sentPlace: (ItemID, String)?) -> Bool {
        let existing = disk.tree[item.id]
        if item.deleted {
            if let n = existing, n.kind == .file, let since = unlessWrittenSince, since != n.writeGen { return false }
            if existing != nil { for g in descendants(of: item.id).reversed() + [item.id] { disk.tree[g] = nil } }
            return true
        }
        var parent = item.parent, name = item.name.value
        if let n = existing, let sent = sentPlace, n.parent != sent.0 || n.name != sent.1 {
            (parent, name) = (n.parent, n.name)
        }
        guard isLiveFolder(parent) else { return false }
        if let n = existing {
            if n.kind == .file, resetContent, let since = unlessWrittenSince, since != n.writeGen { return false }
            if n.parent != parent || n.name != name {
                if nameTaken(name, in: parent, excluding: item.id) { return false }
                if n.kind == .folder, isInside(parent, item.id) { return false }
            }
            var m = n
            m.parent = parent
            m.name = name
            m.modified = item.modified
            if resetContent { m.content = ModelContent.token(item.chunks) }
            disk.tree[item.id] = m
            return true
        }
        if nameTaken(name, in: parent) { return false }
        disk.tree[item.id] = ModelNode(parent: parent, name: name, kind: item.kind, content: ModelContent.token(item.chunks), modified: item.modified)
        return true
    }

    /// Settled: nothing queued, on its way, or held back.
    var idle: Bool {
        queue.isEmpty && inFlight == nil && pull == nil && disk.ops.isEmpty && !relistNow
            && items.values.allSatisfy { $0.remote.isEmpty }
    }
}
