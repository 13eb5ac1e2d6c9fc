/// The downloader's schedule: the chunks asked for, each with the readers waiting for it,
/// fetched once at a time, at most a given number at once, in order of priority — 0 a read
/// waits, 1 pinned or asked for, 2 prefetch — and in the order asked within one. Pure: the
/// engine starts and ends the fetches it returns.
public struct FetchQueue<Key: Hashable, Fetch, Waiter> {
    /// Every key asked for (queued or being fetched), with its waiters.
    private var asked: [Key: [Waiter]] = [:]
    private var queues: [[(key: Key, fetch: Fetch)]] = [[], [], []]
    private var started: Set<Key> = []
    /// Fetches under way.
    public private(set) var active = 0

    public init() {}

    /// Keys asked for and not ended.
    public var count: Int { asked.count }

    /// Whether a key asked for satisfies `test` (the chunks of one item).
    public func contains(where test: (Key) -> Bool) -> Bool { asked.keys.contains(where: test) }

    /// Whether a reader waits for `key`.
    public func hasWaiters(_ key: Key) -> Bool { asked[key]?.isEmpty == false }

    /// Asks for `key` at `priority`, with a reader's `waiter` or none (pins, prefetch). Queues a
    /// fetch unless one is under way, or queued already when this is a prefetch (a higher
    /// priority queues it again; the stale entry is skipped when it comes up). True when a fetch
    /// was queued: `next` has work.
    public mutating func want(_ key: Key, priority: Int, waiter: Waiter?, _ fetch: () -> Fetch) -> Bool {
        let known = asked[key] != nil
        if let waiter { asked[key, default: []].append(waiter) } else if !known { asked[key] = [] }
        if started.contains(key) || (known && priority == 2) { return false }
        queues[min(max(priority, 0), 2)].append((key, fetch()))
        return true
    }

    /// The fetches to start now, highest priority first, while fewer than `limit` run. When
    /// `refuse` (offline or paused), every queued key ends instead and its waiters are returned
    /// to be failed.
    public mutating func next(limit: Int, refuse: Bool) -> (start: [(key: Key, fetch: Fetch)], fail: [[Waiter]]) {
        var start: [(key: Key, fetch: Fetch)] = [], fail: [[Waiter]] = []
        for p in queues.indices {
            var taken = 0
            for entry in queues[p] {
                guard refuse || active < limit else { break }
                taken += 1
                guard asked[entry.key] != nil, !started.contains(entry.key) else { continue }  // ended, or under way
                if refuse {
                    fail.append(asked.removeValue(forKey: entry.key) ?? [])
                    continue
                }
                started.insert(entry.key)
                active += 1
                start.append(entry)
            }
            queues[p].removeFirst(taken)
        }
        return (start, fail)
    }

    /// A fetch `next` started has ended (or could not start): its key is no longer asked for,
    /// and its waiters are returned to be answered.
    public mutating func ended(_ key: Key) -> [Waiter] {
        if started.remove(key) != nil { active -= 1 }
        return asked.removeValue(forKey: key) ?? []
    }

    /// Forgets the keys satisfying `test` that nobody waits for and that are not under way
    /// (prefetches of a file that cannot be downloaded here).
    public mutating func dropUnwaited(where test: (Key) -> Bool) {
        for (key, waiters) in asked where test(key) && waiters.isEmpty && !started.contains(key) { asked[key] = nil }
    }
}

extension FetchQueue: Sendable where Key: Sendable, Fetch: Sendable, Waiter: Sendable {}
