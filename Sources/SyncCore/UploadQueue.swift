/// The items waiting to be pushed, in the order of their first queued change (a folder's create
/// goes before its children's), each at most once. Pure value type.
public struct UploadQueue<ID: Hashable & Sendable>: Sendable, Equatable {
    private var order: [ID] = []
    private var members: Set<ID> = []

    public init() {}

    public var isEmpty: Bool { order.isEmpty }
    public var count: Int { order.count }
    public var items: [ID] { order }
    public func contains(_ id: ID) -> Bool { members.contains(id) }
    public func contains(anyOf ids: Set<ID>) -> Bool { !members.isDisjoint(with: ids) }

    /// Queues `id` at the end; an item already queued keeps its place.
    public mutating func append(_ id: ID) {
        if members.insert(id).inserted { order.append(id) }
    }

    /// Queues `id` first (it goes next); an item already queued keeps its place.
    public mutating func prepend(_ id: ID) {
        if members.insert(id).inserted { order.insert(id, at: 0) }
    }

    /// Takes out the first item that `ready` accepts.
    public mutating func takeFirst(where ready: (ID) -> Bool) -> ID? {
        guard let i = order.firstIndex(where: ready) else { return nil }
        let id = order.remove(at: i)
        members.remove(id)
        return id
    }

    public mutating func remove(_ id: ID) {
        guard members.remove(id) != nil else { return }
        order.removeAll { $0 == id }
    }
}
