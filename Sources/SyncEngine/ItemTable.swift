import NimbusCore
import SyncCore

/// The engine's one record per item (SyncCore `SyncItem`): every item it shows has one, as does
/// every item with work under way or a server state held back. A record with neither is removed.
/// The table also knows which records are busy, so the checks after each push and pull look at
/// those only, not at every item of the container.
struct ItemTable {
    typealias Item = SyncItem<ContinuousClock.Instant>

    private(set) var all: [ItemID: Item] = [:]
    /// The ids of the records with an upload or remote phase (`SyncItem.busy`).
    private(set) var busy: Set<ItemID> = []
    /// Shown items whose content is not all here, and live items with unresolved conflict
    /// versions (`.nimbus/status` reads these counts at every `cat`).
    private(set) var placeholders = 0
    private(set) var conflicted = 0
    /// Generations handed out so far (`CacheUse.generation`): never reused, so a download that
    /// started on a record that has since been removed and created again does not count either.
    private var generations: UInt64 = 0

    subscript(id: ItemID) -> Item? {
        get { all[id] }
        set {
            let old = all[id]
            count(old?.base, -1)
            guard var item = newValue, item.base != nil || item.busy else {
                if old != nil {
                    all[id] = nil
                    busy.remove(id)
                }
                return
            }
            count(item.base, 1)
            if old == nil {
                generations &+= 1
                item.cache.generation = generations
            }
            all[id] = item
            if item.busy { busy.insert(id) } else { busy.remove(id) }
        }
    }

    subscript(id: ItemID, default item: @autoclosure () -> Item) -> Item {
        get { all[id] ?? item() }
        set { self[id] = newValue }
    }

    private mutating func count(_ base: Base?, _ sign: Int) {
        guard let base else { return }
        if !base.complete { placeholders += sign }
        if base.record.conflicts > 0 && !base.record.deleted { conflicted += sign }
    }

    /// The item's cache file was reset or swapped: downloads started before count for nothing.
    mutating func newGeneration(_ id: ItemID) {
        guard all[id] != nil else { return }
        generations &+= 1
        all[id]?.cache.generation = generations
    }

    /// Changes how the item's cache file is used, in place (the read path calls it).
    @discardableResult
    mutating func withCache<R>(_ id: ItemID, _ body: (inout CacheUse) -> R) -> R? {
        guard all[id] != nil else { return nil }
        return body(&all[id]!.cache)
    }

    /// The busy records, in id order (a set's order differs from run to run: what is decided
    /// from this list must not).
    var busyItems: [(id: ItemID, item: Item)] { busy.sorted().compactMap { id in all[id].map { (id, $0) } } }

    /// The ids of the busy records that satisfy `test`, in id order (only those are sorted).
    func busyIDs(where test: (Item) -> Bool) -> [ItemID] {
        busy.filter { all[$0].map(test) ?? false }.sorted()
    }

    /// Whether a busy record satisfies `test` (no order needed, so none is made).
    func anyBusy(_ test: (Item) -> Bool) -> Bool { busy.contains { all[$0].map(test) ?? false } }

    /// The shown items and their bases.
    var bases: some Sequence<(key: ItemID, value: Base)> {
        all.lazy.compactMap { id, item in item.base.map { (id, $0) } }
    }

    var count: Int { all.count }

    /// Forgets the upload and remote phases that have become idle.
    mutating func settle(at now: ContinuousClock.Instant, rules: UploadPacing<ContinuousClock.Instant>.Rules) {
        for id in busy {
            guard var item = all[id], item.busy else { continue }
            item.settle(at: now, rules: rules)
            if !item.busy { self[id] = item }
        }
    }

    mutating func reserveCapacity(_ n: Int) { all.reserveCapacity(n) }
}
