import NimbusCore

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

    /// Queues `id` at the end; an item already queued keeps its place. A parked item is
    /// unparked (a change of it is looked at).
    public mutating func append(_ id: ID) {
        parked.remove(id)
        if members.insert(id).inserted { order.append(id) }
    }

    /// Queues `id` first (it goes next); an item already queued keeps its place.
    public mutating func prepend(_ id: ID) {
        parked.remove(id)
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
        parked.remove(id)
        guard members.remove(id) != nil else { return }
        order.removeAll { $0 == id }
    }

    /// The items being pushed now (one, or the commits of one batch: `CommitBatch`): out of the
    /// order, still local work not on the server.
    public private(set) var inFlight: Set<ID> = []

    public func isInFlight(_ id: ID) -> Bool { inFlight.contains(id) }

    /// Queued, being pushed, or parked.
    public func hasWork(_ id: ID) -> Bool {
        inFlight.contains(id) || members.contains(id) || (parked.contains(id) && !Mutation.parkedItemOverwritten.isOn)
    }

    /// Items waiting and in flight (`.nimbus/status`'s `upload-queue`; parked ones are not).
    public var workCount: Int { order.count + inFlight.count }

    /// Items whose changes stay on this device for now (`PushStep.park`: ignored here by a
    /// `.nimbusignore`, or under rules not known yet): out of the order, so no push looks at
    /// them, but still local work — a pull waits for them as for any queued item, and their
    /// entries stay in the store's queue. `unparkAll` puts them back when the rules change.
    public private(set) var parked: Set<ID> = []

    /// Whether `id`'s push holds back the delete of a folder above it on the server
    /// (`CommitPlan.deleteWaitsForBelow`): queued or in flight, not parked — an ignored item's
    /// changes stay here, and the folder's delete takes it on the server as it went here.
    public func holdsFolderDelete(_ id: ID) -> Bool {
        inFlight.contains(id) || members.contains(id) || (parked.contains(id) && Mutation.parkedHoldsFolderDelete.isOn)
    }

    /// Bumped by every `unparkAll`: a push decided under older rules is not parked.
    public private(set) var rulesEpoch: UInt64 = 0

    /// The push of `id`, just taken and decided while the rules were at `epoch`, is parked —
    /// unless the item was queued again meanwhile (a change of it) or the rules changed since:
    /// then it is queued, to be looked at again. Returns whether it was parked.
    @discardableResult
    public mutating func park(_ id: ID, decidedAt epoch: UInt64) -> Bool {
        inFlight.remove(id)
        if members.contains(id) { return false }
        if epoch != rulesEpoch {
            append(id)
            return false
        }
        parked.insert(id)
        return true
    }

    /// The tree's rules generation last seen (`MountedTree.rulesGeneration`).
    public private(set) var rulesSeen: UInt64 = 0

    /// The tree says its rules generation is `generation`: a new one unparks every item.
    /// Returns how many went back, nil when the generation was seen already.
    public mutating func rules(at generation: UInt64) -> Int? {
        guard generation != rulesSeen else { return nil }
        rulesSeen = generation
        return unparkAll()
    }

    /// Every parked item goes back at the end of the order (the rules changed: each is looked
    /// at again, and a push being decided now is not parked). Returns how many.
    @discardableResult
    public mutating func unparkAll() -> Int {
        rulesEpoch &+= 1
        let back = parked
        parked = []
        for id in back { append(id) }
        return back.count
    }

    /// Takes the first item that `ready` accepts and marks it in flight.
    public mutating func takeNext(where ready: (ID) -> Bool) -> ID? {
        guard let id = takeFirst(where: ready) else { return nil }
        inFlight.insert(id)
        return id
    }

    /// `first` must be pushed before `id`, just taken (a folder above it that the server lacks):
    /// `first` flies now and `id` goes next.
    public mutating func sendFirst(_ first: ID, before id: ID) {
        remove(first)
        inFlight.remove(id)
        prepend(id)
        inFlight.insert(first)
    }

    /// The push of `id` is over; the other items in flight still fly.
    public mutating func landed(_ id: ID) {
        inFlight.remove(id)
    }
}
