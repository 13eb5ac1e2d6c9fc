/// The clock of the engine's own timers: the pull and push back-offs after a failure, the
/// tick loop (quiet-period uploads, the cache limit), the recheck of a first upload held as a
/// possible editor's save, and the window during which the server counts as unreachable after a
/// failed download. Network deadlines (the HTTP client's) stay on real time, and so does the
/// read deadline (`Options.hydrationSeconds`: it pairs with a program waiting in `read`) unless
/// the clock is driven.
///
/// `EngineClock.real` in a mount. `scaled(n)` runs `n` engine seconds per real second (tests on
/// real threads). `driven(by:)` hands every timer — the read deadline too — to a
/// `TimeSource`: the deterministic simulation (Tests/EngineSimTests) advances it itself, so a
/// run takes no real time and replays exactly.
public struct EngineClock: Sendable {
    /// How many engine seconds pass per real second (1 when driven).
    public let speed: Int
    private let origin: ContinuousClock.Instant
    private let source: (any TimeSource)?

    public static let real = EngineClock(speed: 1, source: nil)
    public static func scaled(_ speed: Int) -> EngineClock { EngineClock(speed: max(1, speed), source: nil) }
    public static func driven(by source: any TimeSource) -> EngineClock { EngineClock(speed: 1, source: source) }

    private init(speed: Int, source: (any TimeSource)?) {
        self.speed = speed
        self.source = source
        origin = ContinuousClock.now
    }

    /// Now, on this clock.
    public var now: ContinuousClock.Instant {
        if let source { return source.now }
        return speed == 1 ? ContinuousClock.now : origin + (ContinuousClock.now - origin) * speed
    }

    /// Sleeps for `d` of this clock's time; returns early (without throwing) when cancelled.
    public func sleep(for d: Duration) async {
        if let source { return await source.sleep(for: d) }
        try? await Task.sleep(for: speed == 1 ? d : d / speed)
    }

    /// Sleeps for `d` of real time — of simulated time when driven; returns early when cancelled.
    func sleepReal(for d: Duration) async {
        if let source { return await source.sleep(for: d) }
        try? await Task.sleep(for: d)
    }
}

/// Time that someone else advances (the deterministic simulation's clock).
public protocol TimeSource: Sendable {
    var now: ContinuousClock.Instant { get }
    /// Returns once `d` has passed on this source, or at once when the task is cancelled.
    func sleep(for d: Duration) async
}
