import NimbusCore

/// When the container is listed again. Remote states not shown here (skipped for a taken name
/// or a missing folder, or held for a writer or a lock) are retried from memory while the daemon
/// runs; the mark on disk (`sync.relist`) makes the next start list the container again, so a
/// crash or a restart never forgets them. It is written once per run. Pure value type.
public struct RelistMark: Sendable, Equatable {
    /// The pull lists the container before its next page.
    public var due: Bool
    private var markedThisRun = false

    public init(due: Bool) { self.due = due }

    /// A state is not shown here: true when the mark must be written now (the first time this
    /// run).
    public mutating func mark() -> Bool {
        if Mutation.forgetHeldAcrossCrash.isOn { return false }
        defer { markedThisRun = true }
        return !markedThisRun
    }

    /// The start's listing is done: true when the mark on disk goes (nothing was marked since
    /// the start, so nothing is left not shown).
    public mutating func listed() -> Bool {
        due = false
        return !markedThisRun
    }
}
