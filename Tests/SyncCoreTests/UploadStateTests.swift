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
