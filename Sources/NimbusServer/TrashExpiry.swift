import Logging
import NimbusProtocol
import ServiceLifecycle

/// How long Recently Deleted keeps a deleted item (`nimbus serve --keep-deleted-days D`).
public enum TrashRetention {
    /// 30 days.
    public static let defaultDays: Double = 30
    /// The longest retention (100 years), so that it fits in nanoseconds.
    public static let maxDays: Double = 36_500

    /// A sentence saying what is wrong with `days`, or nil. Fractions are allowed (0.5: 12 hours);
    /// 0 keeps nothing (a deleted item is purged at the next run, within a second).
    public static func problem(days: Double) -> String? {
        days.isFinite && days >= 0 && days <= maxDays ? nil
            : "--keep-deleted-days takes 0…\(Int(maxDays)) days, fractions allowed (got \(days)); 30 is what iCloud Drive keeps"
    }

    /// `days` in whole seconds (at least 0).
    public static func seconds(days: Double) -> Int64 { Int64((max(0, min(days, maxDays)) * 86_400).rounded()) }
}

/// Purges the Recently Deleted entries older than the retention (`nimbus serve
/// --keep-deleted-days`, docs/trash.md): at start, then every tenth of the retention (at least a
/// second, at most an hour). Purging drops the entries' items and version rows; the chunk
/// collector then frees the chunks nothing else refers to. Several instances may purge at once:
/// each purge is a transaction that skips what is no longer an entry.
struct TrashExpiry: Service {
    let store: any ServerStore
    let keepSeconds: Int64
    let clock: @Sendable () -> Int64
    let metrics: ServerMetrics
    let logger: Logger

    var period: Duration { .seconds(min(3_600, max(1, keepSeconds / 10))) }

    /// Returns (never throws) at graceful shutdown: a service that throws fails the whole group.
    func run() async throws {
        await cancelWhenGracefulShutdown { await self.loop() }
    }

    private func loop() async {
        while true {
            do {
                let r = try await store.expireTrash(deletedBefore: clock() - keepSeconds * 1_000_000_000)
                metrics.purged(r)
                if r.entries > 0 {
                    logger.info("Recently Deleted: purged \(r.entries) entr\(r.entries == 1 ? "y" : "ies") (\(r.items) item(s), \(r.bytes) bytes) older than \(keepSeconds) s")
                }
            } catch {
                if Task.isCancelled { return }
                logger.warning("purging expired Recently Deleted entries failed (next try in \(period)): \(error)")
            }
            do { try await Task.sleep(for: period) } catch { return }
        }
    }
}
