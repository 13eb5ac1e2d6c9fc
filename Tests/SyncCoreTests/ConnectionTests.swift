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

    @Test func thePullWaitsLongerAfterEachFailureAndAnAnswerStartsOver() {
        var r = PullRetry()
        var waits: [Int] = []
        for _ in 0..<7 { waits.append(r.failed(tokenRefused: false).wait) }
        #expect(waits == [1, 2, 4, 8, 16, 30, 30])
        #expect(r.failed(tokenRefused: true).state == .unauthorized)
        r.answered()
        let next = r.failed(tokenRefused: false)
        #expect(next.state == .offline(retryIn: 1) && next.wait == 1)
        var c = Connection()
        c.pullFailed("gone", tokenRefused: false)
        #expect(c.tokenRefused == nil)
        c.pullFailed("401", tokenRefused: true)
        #expect(c.tokenRefused == "401")
        c.lastError = "upload of x: refused"
        c.pushesClear(anyQueuedFailure: true)
        #expect(c.lastError != nil)
        c.pushesClear(anyQueuedFailure: false)
        #expect(c.lastError == nil)
    }

    @Test func theCacheIsEvictedToNinetyPercentOnlyAboveItsLimit() {
        #expect(CacheLimit.target(used: 100, limit: nil) == nil)
        #expect(CacheLimit.target(used: 100, limit: 100) == nil)
        #expect(CacheLimit.target(used: 101, limit: 100) == 90)
    }

    @Test func whatIsWrittenIsMemorysBaseWhenItIsTheSameVersion() {
        let r = BaseTests().record([10, 20])
        let placeholder = Base.placeholder(r), whole = Base(record: r, present: nil)
        #expect(Base.toWrite(passed: placeholder, memory: whole) == whole)
        #expect(Base.toWrite(passed: nil, memory: whole) == nil)
        #expect(Base.toWrite(passed: placeholder, memory: nil) == placeholder)
        var newer = r
        newer.version += 1
        #expect(Base.toWrite(passed: placeholder, memory: Base.placeholder(newer)) == placeholder)
    }

    @Test func aDownloadThatFoundNoServerMakesReadsFailAtOnceForAWhile() {
        var c = Connection()
        let now = ContinuousClock.now
        #expect(c.downloadFailed("download: bad bytes", unreachable: false, at: now) == nil)
        #expect(c.lastError == "download: bad bytes" && !c.failsReads(at: now))
        #expect(c.downloadFailed("download: no route", unreachable: true, at: now) == .offline(retryIn: nil))
        #expect(c.failsReads(at: now + .seconds(1)) && !c.failsReads(at: now + .seconds(2)) && c.lastError == "download: no route")
    }
}

