import NimbusProtocol
import SyncCore
import Testing

@Suite struct UploadQueueTests {
    @Test func orderWithoutRepeats() {
        var q = UploadQueue<Int>()
        q.append(1); q.append(2); q.append(1); q.prepend(3); q.prepend(2)
        #expect(q.items == [3, 1, 2])
        #expect(q.count == 3 && q.contains(2) && !q.contains(4))
        #expect(q.contains(anyOf: [9, 1]) && !q.contains(anyOf: [9]))
    }

    @Test func takeFirstReadySkipsThoseWaitingAndKeepsTheirPlace() {
        var q = UploadQueue<Int>()
        for i in 1...4 { q.append(i) }
        #expect(q.takeFirst { $0 % 2 == 0 } == 2)
        #expect(q.items == [1, 3, 4] && !q.contains(2))
        #expect(q.takeFirst { $0 > 10 } == nil)
        q.remove(3); q.remove(42)
        #expect(q.items == [1, 4])
        q.append(2)
        #expect(q.items == [1, 4, 2])
    }
}

@Suite struct UploadStateTests {
    typealias S = UploadState<T>
    let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))

    /// Back-off of a failing upload: (previous failure, next delay).
    @Test(arguments: [
        (S.Failure?.none, 1),
        (.retrying(at: .s(0), delay: 1), 2),
        (.retrying(at: .s(0), delay: 8), 16),
        (.retrying(at: .s(0), delay: 16), 30),
        (.retrying(at: .s(0), delay: 30), 30),
        (.retrying(at: .s(0), delay: .max), 30),
        (.retrying(at: .s(0), delay: .min), 1),
        (.retrying(at: .s(0), delay: 0), 1),
        (.refused(at: .s(0)), 30),
    ] as [(S.Failure?, Int)])
    func backOff(_ previous: S.Failure?, _ next: Int) {
        #expect((previous?.nextDelay ?? 1) == next)
    }

    /// When the push loop may take a queued item: (failure, notBefore, now, ready).
    @Test(arguments: [
        (S.Failure?.none, T?.none, 0, true),
        (.retrying(at: .s(5), delay: 1), nil, 4, false),
        (.retrying(at: .s(5), delay: 1), nil, 5, true),
        (.refused(at: .s(300)), nil, 299, false),
        (.refused(at: .s(300)), nil, 300, true),
        (nil, .s(10), 9, false),
        (nil, .s(10), 10, true),
        (.retrying(at: .s(5), delay: 1), .s(10), 7, false),
    ] as [(S.Failure?, T?, Int, Bool)])
    func ready(_ failure: S.Failure?, _ notBefore: T?, _ now: Int, _ ready: Bool) {
        var u = S()
        u.failure = failure
        u.notBefore = notBefore
        #expect(u.ready(at: .s(now)) == ready)
        #expect(u.refused == (failure.map { if case .refused = $0 { true } else { false } } ?? false))
    }

    @Test func aRecordIsForgottenOnlyWhenNothingIsLeft() {
        var u = S()
        #expect(u.isIdle(at: .s(0), rules: rules))
        u.writing = true
        #expect(!u.isIdle(at: .s(0), rules: rules))
        u.writing = false
        u.error = "download failed"
        #expect(!u.isIdle(at: .s(0), rules: rules))
        u.error = nil
        u.pacing.changed(at: .s(0), rules: rules)
        u.pacing.uploaded(at: .s(0), sent: 10, written: 10, rules: rules)
        #expect(!u.isIdle(at: .s(5), rules: rules))
        #expect(u.isIdle(at: .s(30), rules: rules))
    }
}

@Suite struct DeletedHereTests {
    typealias S = UploadState<T>

    /// A delete is never paced, held for a save, a snapshot or a lock, nor kept back by a refusal
    /// of the state it deletes; server trouble still backs it off.
    @Test func aDeleteGoesAtOnceUnlessTheServerIsInTrouble() {
        var s = S()
        s.notBefore = .s(200)
        s.snapshotDue = true
        s.waitingForLock = true
        s.failure = .refused(at: .s(400))
        s.error = "invalid_name"
        s.deletedHere()
        #expect(s.ready(at: .s(100)) && s.failure == nil && s.error == nil && !s.snapshotDue && !s.waitingForLock)

        var q = S()
        q.failure = .overQuota(at: .s(160), nil)
        q.deletedHere()
        #expect(q.ready(at: .s(100)))

        var r = S()
        r.failure = .retrying(at: .s(104), delay: 4)
        r.error = "upload failed: 503"
        r.deletedHere()
        #expect(!r.ready(at: .s(100)) && r.ready(at: .s(104)) && r.error != nil)
    }
}

@Suite struct UploadFailureTests {
    typealias S = UploadState<T>

    /// (HTTP status or none, the server's code, what the failure is)
    @Test(arguments: [
        (Int?.none, APIErrorCode?.none, UploadFailure.transient),
        (500, nil, .transient), (503, .busy, .transient), (507, .storageFull, .transient),
        (413, .bodyTooLarge, .transient), (429, .rateLimited, .transient),
        (409, .missingChunks, .transient), (409, .parentNotFound, .transient), (404, .itemNotFound, .transient),
        (404, .containerNotFound, .transient),
        (401, nil, .unauthorized), (401, .unauthorized, .unauthorized),
        (409, .moveCycle, .moveRefused),
        (400, .invalidName, .refused), (409, .kindMismatch, .refused), (400, nil, .refused), (404, nil, .refused),
        (507, .quotaExceeded, .overQuota(nil)),
    ] as [(Int?, APIErrorCode?, UploadFailure)])
    func whatAFailureIs(_ status: Int?, _ code: APIErrorCode?, _ kind: UploadFailure) {
        #expect(UploadFailure.of(status: status, code: code) == kind)
    }

    @Test func eachFailureWaitsItsTime() {
        var s = S()
        #expect(s.failed(.transient, at: .s(100)) == 1 && s.failure == .retrying(at: .s(101), delay: 1))
        #expect(s.failed(.transient, at: .s(101)) == 2 && s.failure == .retrying(at: .s(103), delay: 2))
        #expect(s.failed(.refused, at: .s(103)) == 300 && s.refused && !s.ready(at: .s(402)) && s.ready(at: .s(403)))
        let figures = QuotaFigures(usage: 10, quota: 5)
        #expect(s.failed(.overQuota(figures), at: .s(500)) == 60 && s.overQuota == .some(figures))
        var t = S()
        #expect(t.failed(.unauthorized, at: .s(1)) == 0 && t.failure == nil)
        #expect(t.failed(.moveRefused, at: .s(1)) == 0 && t.failure == nil)
    }
}
