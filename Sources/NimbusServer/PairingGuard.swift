import Foundation
import NimbusProtocol
import Synchronization

/// Counts wrong pairing codes over the last minute, per client address and for the instance as
/// a whole; past either limit every `POST /v1/pair` is answered `rate_limited` until the minute
/// has passed. With 60-bit codes living 10 minutes, an attacker gets at most
/// `wrongPerMinute × 10` guesses per code on each instance.
final class PairingGuard: Sendable {
    private struct State {
        var byAddress: [String: [ContinuousClock.Instant]] = [:]
        var all: [ContinuousClock.Instant] = []
    }
    private let state = Mutex(State())
    let perAddress: Int
    let total: Int

    init(perAddress: Int = PairingLimits.wrongPerAddressPerMinute, total: Int = PairingLimits.wrongPerMinute) {
        self.perAddress = perAddress
        self.total = total
    }

    /// Throws `rate_limited` when `address` (or everyone) guessed wrong too often in the last minute.
    func check(_ address: String, now: ContinuousClock.Instant = .now) throws {
        let limited: Bool = state.withLock { s in
            Self.prune(&s, now: now)
            return s.all.count >= total || (s.byAddress[address]?.count ?? 0) >= perAddress
        }
        if limited {
            throw APIError(.rateLimited, "too many wrong pairing codes in the last minute; wait a minute and type the code again (or ask for a new one with `nimbus device add`)")
        }
    }

    func wrong(_ address: String, now: ContinuousClock.Instant = .now) {
        state.withLock { s in
            Self.prune(&s, now: now)
            s.all.append(now)
            s.byAddress[address, default: []].append(now)
        }
    }

    private static func prune(_ s: inout State, now: ContinuousClock.Instant) {
        let since = now - .seconds(60)
        s.all.removeAll { $0 < since }
        for (k, v) in s.byAddress {
            let kept = v.filter { $0 >= since }
            s.byAddress[k] = kept.isEmpty ? nil : kept
        }
    }
}
