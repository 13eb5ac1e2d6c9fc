/// The clock of the engine's own timers: the pull and push back-offs after a failure, the
/// tick loop (quiet-period uploads, the cache limit), the recheck of a first upload held as a
/// possible editor's save, and the window during which the server counts as unreachable after a
/// failed download. Network deadlines (the HTTP client's) and the kernel-facing timers of
/// ContainerFS (safe-save windows, idle time of open files) stay on real time: they pair with
/// things outside the engine.
///
/// `EngineClock.real` in a mount. The engine-level simulation (Tests/EngineSimTests) runs its
/// engines on `scaled(10)`: a back-off of 1 s after an injected disconnect takes 100 ms, so the
/// seeds settle sooner and more of them fit in a test run.
public struct EngineClock: Sendable {
    /// How many engine seconds pass per real second.
    public let speed: Int
    private let origin: ContinuousClock.Instant

    public static let real = EngineClock(speed: 1)
    public static func scaled(_ speed: Int) -> EngineClock { EngineClock(speed: max(1, speed)) }

    private init(speed: Int) {
        self.speed = speed
        origin = ContinuousClock.now
    }

    /// Now, on this clock.
    public var now: ContinuousClock.Instant {
        speed == 1 ? ContinuousClock.now : origin + (ContinuousClock.now - origin) * speed
    }

    /// Sleeps for `d` of this clock's time; returns early (without throwing) when cancelled.
    public func sleep(for d: Duration) async {
        try? await Task.sleep(for: speed == 1 ? d : d / speed)
    }
}
