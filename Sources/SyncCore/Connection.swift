/// The engine's connection to the server, as `.nimbus/status` shows it (its `connection:` line).
public enum ConnectionState: Sendable, Equatable, CustomStringConvertible {
    /// Not answered yet since the start or a resume.
    case connecting
    case online
    /// The last request could not reach the server; `retryIn`: the pull's next try, in seconds.
    case offline(retryIn: Int?)
    /// The server refused this device's token (401): uploads wait, changes stay queued.
    case unauthorized
    /// `nimbus pause`: no request to the server until `nimbus resume`.
    case paused

    /// Downloads asked for now would only fail (the long-poll found the server gone or the
    /// token refused).
    public var isDisconnected: Bool {
        switch self {
        case .offline, .unauthorized: true
        case .connecting, .online, .paused: false
        }
    }

    public var description: String {
        switch self {
        case .connecting: "connecting"
        case .online: "online"
        case .offline(let s?): "offline (retrying in \(s) s)"
        case .offline(nil): "offline (retrying)"
        case .unauthorized:
            "unauthorized (the server refused this device's token: it was revoked or is wrong; changes stay queued — mount again with a valid --token-file)"
        case .paused: "paused (nimbus resume goes online)"
        }
    }
}

/// The engine's connection to the server and what follows from it: the status line, whether
/// uploads wait for a valid token, and whether reads fail at once. Pure value type.
public struct Connection: Sendable, Equatable {
    public private(set) var state: ConnectionState = .connecting
    /// Why the server refused this device's token (401); uploads wait while set.
    public var tokenRefused: String?
    /// The engine's last error (`.nimbus/status`'s `sync-error`).
    public var lastError: String?
    /// After a download could not reach the server, reads fail at once until then (so a read
    /// answers EIO within one deadline, not one per kernel retry or read-ahead).
    public var offlineUntil: ContinuousClock.Instant?

    public init() {}

    /// Enters `next`, noting `error`. While `paused` only a pause is shown. Online, the server
    /// answers this device again: reads may try at once, uploads go on after a refused token
    /// (true: they resume), and an error of the connection is over unless an item's upload
    /// failed (`anyItemFailure`).
    public mutating func enter(_ next: ConnectionState, error: String? = nil, paused: Bool, anyItemFailure: Bool) -> Bool {
        if let error { lastError = error }
        if paused && next != .paused { return false }
        state = next
        guard next == .online else { return false }
        offlineUntil = nil
        let resumed = tokenRefused != nil
        tokenRefused = nil
        if !anyItemFailure { lastError = nil }
        return resumed
    }

    /// An upload found this device's token refused: uploads wait, and the status says so.
    public mutating func refuseToken(_ why: String) {
        tokenRefused = why
        state = .unauthorized
    }

    /// `nimbus pause` / `nimbus resume`.
    public mutating func pause(_ on: Bool) { state = on ? .paused : .connecting }

    /// A download could not reach the server: reads fail at once for `seconds`.
    public mutating func unreachable(at now: ContinuousClock.Instant, seconds: Int64) { offlineUntil = now + .seconds(seconds) }

    /// Reads fail at once: the server just proved unreachable.
    public func failsReads(at now: ContinuousClock.Instant) -> Bool { offlineUntil.map { now < $0 } ?? false }

    /// Downloads asked for now would fail: paused, the long-poll found the server gone or the
    /// token refused, or a download just could not reach it.
    public func refusesDownloads(paused: Bool, at now: ContinuousClock.Instant) -> Bool {
        paused || state.isDisconnected || failsReads(at: now)
    }
}

/// The pull's wait after a failure: 1 s doubling to 30 s; an answer starts it over.
public struct PullRetry: Sendable, Equatable {
    public private(set) var seconds = 1

    public init() {}

    /// A pull failed: the connection to show (the token refused, or offline until the next try)
    /// and the seconds to wait.
    public mutating func failed(tokenRefused: Bool) -> (state: ConnectionState, wait: Int) {
        let wait = seconds
        seconds = min(seconds * 2, 30)
        return (tokenRefused ? .unauthorized : .offline(retryIn: wait), wait)
    }

    public mutating func answered() { seconds = 1 }
}

extension Connection {
    /// The journal's request failed: a refused token makes uploads wait too.
    public mutating func pullFailed(_ why: String, tokenRefused: Bool) {
        if tokenRefused { self.tokenRefused = why }
    }

    /// A download failed (`unreachable`: no answer from the server): the error is the last one,
    /// and an unreachable server makes reads fail at once for 2 s. Returns the connection to
    /// show when the failure says the server is gone (the long-poll notices only after its wait).
    public mutating func downloadFailed(_ why: String, unreachable: Bool, at now: ContinuousClock.Instant) -> ConnectionState? {
        lastError = why
        guard unreachable else { return nil }
        self.unreachable(at: now, seconds: 2)
        return .offline(retryIn: nil)
    }

    /// Pushes ended with no queued item failing: an item's error shown as the last one is over.
    public mutating func pushesClear(anyQueuedFailure: Bool) {
        if !anyQueuedFailure { lastError = nil }
    }
}

/// The cache limit (`--cache-size`): above it, content is evicted down to 90 % of it.
public enum CacheLimit {
    /// The bytes to evict down to, or nil when `used` is within `limit` (or there is none).
    public static func target(used: Int64, limit: Int64?) -> Int64? {
        guard let limit, used > limit else { return nil }
        return limit / 10 * 9
    }
}
