import Foundation
import Logging
import ServiceLifecycle
import Synchronization

/// How a revocation reaches the requests already authenticated: every instance reads the store's
/// revocation mark once a second (the instance that revokes does at once); when it moves, every
/// token is looked up again on its next use (`Authenticator`) and every waiting long-poll wakes to
/// check its own, so a revoked device's open polls are answered 401 within that second on every
/// instance sharing the database. Polls whose device is still enrolled wait on.
public final class Revocations: Sendable {
    private struct State {
        var epoch: UInt64 = 0
        var mark: RevocationMark?
    }
    private let state = Mutex(State())
    let notifier: CommitNotifier

    init(notifier: CommitNotifier) { self.notifier = notifier }

    /// Moves on every revocation seen: a token checked in an earlier epoch is looked up again.
    var epoch: UInt64 { state.withLock { $0.epoch } }

    /// Reads the store's mark; when it moved since the last read, tokens are checked again and
    /// waiting long-polls wake. The first read only records it.
    func check(_ store: any ServerStore) async throws {
        let mark = try await store.revocationMark()
        let moved = state.withLock { s -> Bool in
            defer { s.mark = mark }
            guard let old = s.mark, old != mark else { return false }
            s.epoch &+= 1
            return true
        }
        if moved { notifier.wakeAll() }
    }

    /// How often every instance reads the mark.
    static let interval: Duration = .seconds(1)
}

/// What the store says of its revocations: changes whenever a device is revoked.
public struct RevocationMark: Sendable, Equatable {
    public var count: Int64
    public var latest: Int64
    public init(count: Int64, latest: Int64) {
        self.count = count
        self.latest = latest
    }
}

/// Reads the revocation mark every `Revocations.interval` while the server runs.
struct RevocationWatch: Service {
    let revocations: Revocations
    let store: any ServerStore
    let logger: Logger

    func run() async throws {
        var failing = false
        while !Task.isCancelled, !Task.isShuttingDownGracefully {
            do {
                try await revocations.check(store)
                if failing { logger.info("revocation watch: reading the store again") }
                failing = false
            } catch {
                if !failing { logger.warning("revocation watch: cannot read the store's revocations (\(error)); tokens are still checked again every second") }
                failing = true
            }
            try? await Task.sleep(for: Revocations.interval)
        }
    }
}
