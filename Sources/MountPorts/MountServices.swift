import Coordination
import LocalStore

/// What a mount's filesystem and its sync engine share: the coordinator of program locks and
/// sync claims, the `.nimbus/events` log and the presenter hub. The daemon opens them once and
/// hands them to both sides (ContainerFS opens its own when none are given: local tests).
public struct MountServices: Sendable {
    public let coordinator: Coordinator
    public let events: EventLog
    public let presenters: PresenterHub

    public init(coordinator: Coordinator, events: EventLog, presenters: PresenterHub) {
        self.coordinator = coordinator
        self.events = events
        self.presenters = presenters
    }

    /// Opens the services of the mount whose state is `store`. Event sequence numbers keep
    /// increasing across restarts, also after kill -9: this run's first numbers are promised on
    /// disk before the first line (EventLog.reserve).
    public static func open(store: LocalStore, presenterTimeout: Duration) throws -> MountServices {
        // A damaged number (beyond any run's) is taken as the highest one, never trapped on.
        let first = min((try? store.meta("events.seq")).flatMap { $0.flatMap { UInt64($0) } } ?? 1, EventLog.highest)
        try store.setMeta("events.seq", "\(first + EventLog.reservation)")
        store.commitQueued()
        // The reservation runs on EventLog's own queue, where waiting for the commit holds no one.
        let events = EventLog(firstSequence: first, reserve: { [store] next in
            try? store.setMeta("events.seq", "\(next)")
            store.commitQueued()
        })
        let presenters = PresenterHub(timeout: presenterTimeout)
        events.setListener { [presenters] in presenters.event($0) }
        return MountServices(coordinator: Coordinator(), events: events, presenters: presenters)
    }
}
