import NimbusCore
import NimbusProtocol

/// The engine's one record per item (SyncCore `SyncItem`): every item it shows has one, as does
/// every item with work under way or a server state held back. A record with neither is removed.
/// The table also knows which records are busy, so the checks after each push and pull look at
/// those only, not at every item of the container.
/// On the engine's clock (`ContinuousClock`): not generic, so the engine's calls into it, on
/// the read path among others, are direct.
public struct ItemTable: Sendable {
    public typealias Instant = ContinuousClock.Instant
    public typealias Item = SyncItem<Instant>

    public init() {}

    public private(set) var all: [ItemID: Item] = [:]
    /// The ids of the records with an upload or remote phase (`SyncItem.busy`).
    public private(set) var busy: Set<ItemID> = []
    /// The busy records with a server state skipped here (`RemoteHolds.skipped`), and those
    /// backing off from a failed upload (`UploadState.failure`): read after every push and pull,
    /// so a burst of thousands of queued items is not looked through each time.
    public private(set) var skipped: Set<ItemID> = []
    public private(set) var failed: Set<ItemID> = []
    /// The busy records holding a server state not shown here (`RemoteHolds`, not empty): read
    /// at every delete's push (`heldVersions`), so a burst of deletes does not look through every
    /// busy record each.
    private var held: Set<ItemID> = []
    /// The busy records of files a program has open for writing (`UploadState.writing`), and
    /// those waiting for an instant in the queue (`UploadState.notBefore`): the tick looks at
    /// these each second, not at every busy record.
    private var writing: Set<ItemID> = []
    private var paced: Set<ItemID> = []
    /// Which busy records only time will make idle (`settle`): those whose upload and remote
    /// phases hold nothing but the pacing's memory, by the instant they become idle (a min-heap
    /// of `(instant, id)`; an entry whose instant is no longer the record's, in `settleDue`, is
    /// stale and skipped), and those idle at any instant. Kept for the rules of the last
    /// `settle` (nil before it: the first one looks at every busy record).
    private var settleRules: UploadPacing<Instant>.Rules?
    private var settleHeap: [(at: Instant, id: ItemID)] = []
    private var settleDue: [ItemID: Instant] = [:]
    private var settleAny: Set<ItemID> = []
    /// Bytes of content held here: present chunks of shown files (kept as records change).
    public private(set) var contentBytes: Int64 = 0
    /// Shown items whose content is not all here, and live items with unresolved conflict
    /// versions (`.nimbus/status` reads these counts at every `cat`).
    public private(set) var placeholders = 0
    public private(set) var conflicted = 0
    /// Items that live on this device only (`UploadState.deviceLocal`: FIFOs, sockets, device
    /// nodes, SQLite's journals).
    public private(set) var localOnly = 0
    /// Which item the server has at each place (folder and name), as this device last heard
    /// (`Place(item)`): `CommitPlan.nameFirst` asks which item holds a name there.
    private var atPlace: [Place: ItemID] = [:]
    /// The places more than one item is at as this device last heard (an older state of one that
    /// left, not heard of yet, and a newer state of another that came): all of them. The one
    /// whose state there is newest holds the name; when it leaves, the others still do.
    /// (`atPlace` holds one of them.)
    private var crowded: [Place: Set<ItemID>] = [:]
    public struct Place: Hashable, Sendable {
        public var parent: ItemID
        public var name: ItemName
        public init(parent: ItemID, name: ItemName) {
            self.parent = parent
            self.name = name
        }
        /// Where the server has the item, as this device last heard: its newest state, shown
        /// (the base) or held back here (a state held for its push can be the one that answered
        /// a commit whose answer was lost).
        /// An item of which no state was heard, whose create went without its answer, may be
        /// where that commit asked (`UploadState.sentPlace`).
        init?(_ item: Item?) {
            guard let r = Self.newest(item) else {
                guard let item, item.upload.unanswered, let sent = item.upload.sentPlace, !Mutation.unansweredCreateHoldsNoName.isOn else { return nil }
                self = sent
                return
            }
            guard !r.deleted else { return nil }
            self.init(parent: r.parent, name: r.name)
        }

        /// The item's newest server state known here, shown or held back.
        static func newest(_ item: Item?) -> ServerItem? {
            guard let item else { return nil }
            // The first of the highest version, in this order (read at every change of a
            // record: no arrays built).
            func later(_ a: ServerItem?, _ b: ServerItem?) -> ServerItem? {
                guard let b else { return a }
                guard let a else { return b }
                return b.version > a.version ? b : a
            }
            let h = item.remote
            return later(later(later(item.base?.record, h.forLock), h.forWriter), h.skipped)
        }
    }

    /// The item the server had at `place` when this device last heard.
    public func holder(of place: Place) -> ItemID? {
        guard let many = crowded[place] else { return atPlace[place] }
        func version(_ id: ItemID) -> Int64 { Place.newest(all[id])?.version ?? -1 }
        return many.max { (version($0), $0) < (version($1), $1) }
    }

    /// Generations handed out so far (`CacheUse.generation`): never reused, so a download that
    /// started on a record that has since been removed and created again does not count either.
    private var generations: UInt64 = 0

    public subscript(id: ItemID) -> Item? {
        get { all[id] }
        set {
            let old = all[id]
            let oldUpload = old?.upload
            count(old?.base, -1)
            if oldUpload?.deviceLocal == true { localOnly -= 1 }
            let was = Place(old)
            guard var item = newValue, item.base != nil || item.busy else {
                unplace(was, id)
                if old != nil {
                    all[id] = nil
                    busy.remove(id)
                    skipped.remove(id)
                    failed.remove(id)
                    held.remove(id)
                    writing.remove(id)
                    paced.remove(id)
                    unscheduleSettle(id)
                }
                return
            }
            let upload = item.upload
            count(item.base, 1)
            if upload.deviceLocal { localOnly += 1 }
            let now = Place(item)
            if now != was {
                unplace(was, id)
                if let now { place(now, id) }
            }
            if old == nil {
                generations &+= 1
                item.cache.generation = generations
            }
            all[id] = item
            // The sets follow the stored record: touched only when its membership changes.
            let wasBusy = old?.busy == true
            let wasSkipped = wasBusy && old?.remote.skipped != nil, wasFailed = wasBusy && oldUpload?.failure != nil
            let isSkipped = item.busy && item.remote.skipped != nil, isFailed = item.busy && upload.failure != nil
            let wasHeld = wasBusy && old?.remote.isEmpty == false, isHeld = item.busy && !item.remote.isEmpty
            let wasWriting = wasBusy && oldUpload?.writing == true, isWriting = item.busy && upload.writing
            let wasPaced = wasBusy && oldUpload?.notBefore != nil, isPaced = item.busy && upload.notBefore != nil
            if item.busy != wasBusy { if item.busy { busy.insert(id) } else { busy.remove(id) } }
            if isSkipped != wasSkipped { if isSkipped { skipped.insert(id) } else { skipped.remove(id) } }
            if isFailed != wasFailed { if isFailed { failed.insert(id) } else { failed.remove(id) } }
            if isHeld != wasHeld { if isHeld { held.insert(id) } else { held.remove(id) } }
            if isWriting != wasWriting { if isWriting { writing.insert(id) } else { writing.remove(id) } }
            if isPaced != wasPaced { if isPaced { paced.insert(id) } else { paced.remove(id) } }
            if item.busy || wasBusy { scheduleSettle(id, item, upload) }
        }
    }

    /// Files open for writing (`UploadState.writing`), in id order.
    public var writingIDs: [ItemID] { writing.sorted() }
    /// Records waiting for an instant in the queue (`UploadState.notBefore`), in id order.
    public var pacedIDs: [ItemID] { paced.sorted() }

    /// Puts a record where `settle` will find it when only time stands between it and idle.
    private mutating func scheduleSettle(_ id: ItemID, _ item: Item, _ upload: UploadState<Instant>) {
        guard let rules = settleRules else { return }
        guard item.busy, item.remote.isEmpty, upload.idleButForPacing else { return unscheduleSettle(id) }
        guard let at = upload.pacing.idleFrom(rules: rules) else {
            settleDue[id] = nil
            settleAny.insert(id)
            return
        }
        settleAny.remove(id)
        guard settleDue[id] != at else { return }
        settleDue[id] = at
        settleHeap.append((at, id))
        var i = settleHeap.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            guard settleHeap[i].at < settleHeap[parent].at else { break }
            settleHeap.swapAt(i, parent)
            i = parent
        }
    }

    private mutating func unscheduleSettle(_ id: ItemID) {
        settleDue[id] = nil
        settleAny.remove(id)
    }

    /// Takes the earliest entry of the settle heap.
    private mutating func popSettle() -> (at: Instant, id: ItemID) {
        let top = settleHeap[0]
        let last = settleHeap.removeLast()
        guard !settleHeap.isEmpty else { return top }
        settleHeap[0] = last
        var i = 0
        while true {
            let l = 2 * i + 1, r = l + 1
            var m = i
            if l < settleHeap.count && settleHeap[l].at < settleHeap[m].at { m = l }
            if r < settleHeap.count && settleHeap[r].at < settleHeap[m].at { m = r }
            guard m != i else { return top }
            settleHeap.swapAt(i, m)
            i = m
        }
    }

    public subscript(id: ItemID, default item: @autoclosure () -> Item) -> Item {
        get { all[id] ?? item() }
        set { self[id] = newValue }
    }

    private mutating func place(_ place: Place, _ id: ItemID) {
        if crowded[place] != nil {
            crowded[place]!.insert(id)
        } else if let other = atPlace[place], other != id, !Mutation.placeHeldByTheLastCome.isOn {
            crowded[place] = [other, id]
        } else {
            atPlace[place] = id
        }
    }

    private mutating func unplace(_ place: Place?, _ id: ItemID) {
        guard let place else { return }
        guard var many = crowded[place] else {
            if atPlace[place] == id { atPlace[place] = nil }
            return
        }
        many.remove(id)
        if many.count > 1 {
            crowded[place] = many
            if atPlace[place] == id { atPlace[place] = many.first }
        } else {
            crowded[place] = nil
            atPlace[place] = many.first
        }
    }

    private mutating func count(_ base: Base?, _ sign: Int) {
        guard let base else { return }
        if !base.complete { placeholders += sign }
        if base.record.conflicts > 0 && !base.record.deleted { conflicted += sign }
        if base.record.kind == .file { contentBytes += Int64(sign) * base.presentBytes }
    }

    /// The item's cache file was reset or swapped: downloads started before count for nothing.
    public mutating func newGeneration(_ id: ItemID) {
        guard all[id] != nil else { return }
        generations &+= 1
        all[id]?.cache.generation = generations
    }

    /// Changes how the item's cache file is used, in place (the read path calls it).
    @discardableResult
    public mutating func withCache<R>(_ id: ItemID, _ body: (inout CacheUse) -> R) -> R? {
        guard all[id] != nil else { return nil }
        return body(&all[id]!.cache)
    }

    /// The server states skipped here, oldest first (ties in id order).
    public var skippedStates: [ServerItem] {
        skipped.sorted().compactMap { all[$0]?.remote.skipped }.sorted { $0.version < $1.version }
    }

    /// The versions of the server states received and not shown here, held by busy records
    /// (`RemoteHolds.heldVersions`), in no particular order (`SeenCursor.forDelete` takes them
    /// in any).
    public var heldVersions: [Int64] { held.flatMap { all[$0]?.remote.heldVersions ?? [] } }

    /// Whether a busy record satisfies `test` (no order needed, so none is made).
    public func anyBusy(_ test: (Item) -> Bool) -> Bool { busy.contains { all[$0].map(test) ?? false } }

    /// The shown items and their bases.
    public var bases: some Sequence<(key: ItemID, value: Base)> {
        all.lazy.compactMap { id, item in item.base.map { (id, $0) } }
    }

    public var count: Int { all.count }

    /// Forgets the upload and remote phases that have become idle. Looks at the records only
    /// time was holding (`scheduleSettle`), not at every busy one: a record busy for anything
    /// else becomes idle through a change, which schedules it.
    public mutating func settle(at now: Instant, rules: UploadPacing<Instant>.Rules) {
        if settleRules != rules {
            settleRules = rules
            settleHeap = []
            settleDue = [:]
            settleAny = []
            for id in busy { if let item = all[id] { scheduleSettle(id, item, item.upload) } }
        }
        var due = Array(settleAny)
        while let first = settleHeap.first, first.at <= now {
            let e = popSettle()
            if settleDue[e.id] == e.at { due.append(e.id) }
        }
        for id in due {
            guard var item = all[id], item.busy else { continue }
            item.settle(at: now, rules: rules)
            if !item.busy { self[id] = item } else { unscheduleSettle(id); scheduleSettle(id, item, item.upload) }
        }
    }

    public mutating func reserveCapacity(_ n: Int) { all.reserveCapacity(n) }

    // MARK: the cache keeper's plans

    /// Files whose downloaded content may be evicted, least recently read first (ties by id):
    /// shown files with content here, except those in `keep` (pinned, or being read). Whether
    /// each may go now (open, unsent, downloading) is `SyncItem.evictable`'s decision, at the time.
    public func evictionOrder(keep: Set<ItemID>) -> [ItemID] {
        all.compactMap { id, item -> (ItemID, UInt64)? in
            guard let b = item.base, b.record.kind == .file, b.presentBytes > 0, !keep.contains(id) else { return nil }
            return (id, item.cache.lastUse)
        }.sorted { $0.1 != $1.1 ? $0.1 < $1.1 : $0.0 < $1.0 }.map(\.0)
    }

    /// Evicts the item's downloaded content when `SyncItem.evictable` allows it (`unsent`: a
    /// push of it is queued or on its way; `downloading`: a chunk of it is): it becomes a
    /// placeholder, least recently used. Returns the bytes freed and the new base.
    public mutating func evict(_ id: ItemID, unsent: Bool, downloading: Bool) -> (freed: Int64, base: Base)? {
        guard let record = all[id], record.evictable(unsent: unsent, downloading: downloading), let b = record.base else { return nil }
        let placeholder = Base.placeholder(b.record)
        self[id]?.base = placeholder
        withCache(id) { c in
            c.lastUse = 0
            (c.readEnd, c.readRun) = (-1, 0)
        }
        return (b.presentBytes, placeholder)
    }
}
