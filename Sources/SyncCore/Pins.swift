import NimbusCore

/// The items pinned here (`user.nimbus.pinned`): their content is downloaded and kept, and a
/// pinned folder pins everything below it, present and future. Pure value type; the tree's
/// answers (what is above or below an item) are asked only when something is pinned.
public struct Pins: Sendable, Equatable {
    public private(set) var ids: Set<ItemID>

    public init(_ ids: Set<ItemID> = []) { self.ids = ids }

    public var count: Int { ids.count }
    /// Pinned itself (not through a folder).
    public func contains(_ id: ItemID) -> Bool { ids.contains(id) }

    public mutating func set(_ id: ItemID, _ on: Bool) {
        if on { ids.insert(id) } else { ids.remove(id) }
    }

    /// Pinned itself or through one of `ancestors`.
    public func covers(_ id: ItemID, ancestors: [ItemID]) -> Bool {
        ids.contains(id) || ancestors.contains(where: ids.contains)
    }

    /// Pinned itself or through a folder above it (`ancestors` of the tree here).
    public func covers(_ id: ItemID, ancestors: (ItemID) -> [ItemID]) -> Bool {
        !ids.isEmpty && covers(id, ancestors: ancestors(id))
    }

    /// The ids of `items` that are pinned, themselves or through a folder above.
    public func covered(_ items: [ItemID], ancestors: (ItemID) -> [ItemID]) -> [ItemID] {
        ids.isEmpty ? [] : items.filter { covers($0, ancestors: ancestors) }
    }

    /// Every pinned item and everything below one (`descendants` of the tree here), pinned
    /// items in id order, each followed by what is below it.
    public func everything(descendants: (ItemID) -> [ItemID]) -> [ItemID] {
        ids.sorted().flatMap { [$0] + descendants($0) }
    }

    /// What eviction keeps: every pinned item, everything below one, and `also`.
    public func kept(descendants: (ItemID) -> [ItemID], also: ItemID? = nil) -> Set<ItemID> {
        Set(everything(descendants: descendants) + (also.map { [$0] } ?? []))
    }
}
