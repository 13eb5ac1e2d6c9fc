import Foundation
import LocalStore
import NimbusCore

/// Where the filesystem's time and new item ids come from: the system's clocks and random UUIDs
/// in a mount; a simulated clock and a seeded sequence in the deterministic simulation
/// (Tests/EngineSimTests), so a run replays exactly.
public struct MountClock: Sendable {
    /// Nanoseconds since the epoch (times that `stat` shows).
    public var wall: @Sendable () -> Int64
    /// Nanoseconds of a clock that never goes back (safe-save windows, idle times of open files).
    public var monotonic: @Sendable () -> UInt64
    /// The id of an item created here.
    public var newItemID: @Sendable () -> ItemID

    public init(wall: @escaping @Sendable () -> Int64, monotonic: @escaping @Sendable () -> UInt64,
                newItemID: @escaping @Sendable () -> ItemID) {
        self.wall = wall
        self.monotonic = monotonic
        self.newItemID = newItemID
    }

    public static let system = MountClock(
        wall: { WallClock.nowNanoseconds() },
        monotonic: {
            var ts = timespec()
            clock_gettime(CLOCK_MONOTONIC, &ts)
            return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
        },
        newItemID: { ItemID(FastUUID.make()) })
}
