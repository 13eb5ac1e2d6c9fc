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
    private let source: any TimeSource

    public static let real = EngineClock(source: ScaledTime(speed: 1))
    public static func scaled(_ speed: Int) -> EngineClock { EngineClock(source: ScaledTime(speed: max(1, speed))) }
    public static func driven(by source: any TimeSource) -> EngineClock { EngineClock(source: source) }

    /// Now, on this clock.
    public var now: ContinuousClock.Instant { source.now }

    /// Sleeps for `d` of this clock's time; returns early (without throwing) when cancelled.
    public func sleep(for d: Duration) async { await source.sleep(for: d) }

    /// Sleeps for `d` of real time — of simulated time when driven; returns early when cancelled.
    func sleepReal(for d: Duration) async { await source.sleepReal(for: d) }
}

/// Real time, `speed` engine seconds per real second.
struct ScaledTime: TimeSource {
    let speed: Int
    let origin = ContinuousClock.now

    var now: ContinuousClock.Instant { speed == 1 ? ContinuousClock.now : origin + (ContinuousClock.now - origin) * speed }
    func sleep(for d: Duration) async { try? await Task.sleep(for: speed == 1 ? d : d / speed) }
    func sleepReal(for d: Duration) async { try? await Task.sleep(for: d) }
}

/// Time that someone else advances (the deterministic simulation's clock).
public protocol TimeSource: Sendable {
    var now: ContinuousClock.Instant { get }
    /// Returns once `d` has passed on this source, or at once when the task is cancelled.
    func sleep(for d: Duration) async
    /// Returns once `d` of real time has passed (of this source's time when it is simulated).
    func sleepReal(for d: Duration) async
}

extension TimeSource {
    public func sleepReal(for d: Duration) async { await sleep(for: d) }
}
