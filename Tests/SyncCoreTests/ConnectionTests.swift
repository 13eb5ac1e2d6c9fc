import Foundation
import SyncCore
import Testing

/// The connection's status, a refused token, and when reads and downloads are refused.
@Suite struct ConnectionTests {
    @Test func onlineEndsTheConnectionsErrorsAndResumesUploadsAfterARefusedToken() {
        var c = Connection()
        #expect(c.state == .connecting)
        var resumed = c.enter(.offline(retryIn: 2), error: "no route", paused: false, anyItemFailure: false)
        #expect(!resumed && c.state == .offline(retryIn: 2) && c.lastError == "no route")
        let now = ContinuousClock.now
        c.unreachable(at: now, seconds: 2)
        #expect(c.failsReads(at: now + .seconds(1)) && !c.failsReads(at: now + .seconds(3)))
        resumed = c.enter(.online, paused: false, anyItemFailure: true)
        #expect(!resumed && c.state == .online && c.lastError == "no route" && !c.failsReads(at: now), "an item's failure keeps the error")
        resumed = c.enter(.online, paused: false, anyItemFailure: false)
        #expect(!resumed && c.lastError == nil)
        c.refuseToken("401")
        #expect(c.state == .unauthorized && c.tokenRefused == "401" && c.refusesDownloads(paused: false, at: now))
        resumed = c.enter(.online, paused: false, anyItemFailure: false)
        #expect(resumed, "uploads resume")
        #expect(c.tokenRefused == nil && !c.refusesDownloads(paused: false, at: now))
    }

    @Test func whilePausedOnlyAPauseIsShown() {
        var c = Connection()
        c.pause(true)
        let resumed = c.enter(.online, error: "late", paused: true, anyItemFailure: false)
        #expect(!resumed && c.state == .paused && c.lastError == "late" && c.refusesDownloads(paused: true, at: .now))
        c.pause(false)
        #expect(c.state == .connecting)
        #expect(ConnectionState.offline(retryIn: nil).isDisconnected && ConnectionState.unauthorized.isDisconnected && !ConnectionState.paused.isDisconnected)
    }
}
