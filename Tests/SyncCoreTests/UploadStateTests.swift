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

    /// A parked item (ignored here) is out of the order and the count, but still local work;
    /// a change of it, or of the rules, puts it back.
    @Test func aParkedItemIsWorkOutsideTheOrder() {
        var q = UploadQueue<Int>()
        for i in 1...3 { q.append(i) }
        #expect(q.takeNext { _ in true } == 1)
        let parked = q.park(1, decidedAt: q.rulesEpoch)
        #expect(parked)
        #expect(q.items == [2, 3] && q.inFlight.isEmpty && q.workCount == 2)
        #expect(q.hasWork(1) && !q.contains(1) && q.parked == [1])
        #expect(q.takeNext { $0 == 2 } == 2)
        q.park(2, decidedAt: q.rulesEpoch)
        q.append(1)  // a change of 1
        #expect(q.items == [3, 1] && q.parked == [2])
        let back = q.unparkAll()
        #expect(back == 1 && q.items == [3, 1, 2] && q.parked.isEmpty)
        #expect(q.takeNext { $0 == 3 } == 3)
        q.park(3, decidedAt: q.rulesEpoch)
        // Local work, but no hold on a folder delete made here.
        #expect(q.hasWork(3) && !q.holdsFolderDelete(3) && q.holdsFolderDelete(1))
        q.remove(3)
        #expect(!q.hasWork(3) && q.parked.isEmpty)
    }

    /// A push decided while its item changed again, or while the rules changed, is not parked:
    /// it is looked at again (a rules file's close must not be lost to a decision in flight).
    @Test func aDecisionOvertakenByAChangeIsNotParked() {
        var q = UploadQueue<Int>()
        q.append(1); q.append(2)
        #expect(q.takeNext { $0 == 1 } == 1)
        q.append(1)  // changed again while its push was decided
        let parked1 = q.park(1, decidedAt: q.rulesEpoch)
        #expect(!parked1 && q.items == [2, 1] && q.parked.isEmpty)
        #expect(q.takeNext { $0 == 2 } == 2)
        let epoch = q.rulesEpoch
        let back = q.unparkAll()  // a rules file changed meanwhile
        let parked2 = q.park(2, decidedAt: epoch)
        #expect(back == 0 && !parked2 && q.items == [1, 2] && q.parked.isEmpty)
    }

    @Test func theItemInFlightIsStillWorkAndLandsOnlyItself() {
        var q = UploadQueue<Int>()
        for i in 1...3 { q.append(i) }
        #expect(q.takeNext { $0 != 1 } == 2)
        #expect(q.inFlight == [2] && q.hasWork(2) && !q.contains(2) && q.workCount == 3)
        q.landed(3)  // another item's push ended: 2 still flies
        #expect(q.inFlight == [2])
        q.landed(2)
        #expect(q.inFlight.isEmpty && !q.hasWork(2) && q.workCount == 2)
        // A folder above 3 that the server lacks goes first; 3 goes next.
        #expect(q.takeNext { $0 == 3 } == 3)
        q.sendFirst(1, before: 3)
        #expect(q.inFlight == [1] && q.items == [3] && q.hasWork(3))
        #expect(q.takeNext { _ in false } == nil && q.inFlight == [1])
        // A batch: several fly at once, each lands alone.
        #expect(q.takeNext { _ in true } == 3 && q.inFlight == [1, 3] && q.workCount == 2)
        q.landed(1)
        #expect(q.inFlight == [3] && q.isInFlight(3) && !q.isInFlight(1))
    }
}

/// `CommitBatch`: what joins the commits gathered for one request, and when it is full.
@Suite struct CommitBatchTests {
    @Test func aDeleteOrAnUploadSendsTheGatheredFirst() {
        let small = Int64(ProtocolLimits.inlineFileBytes)
        #expect(CommitBatch.next(needsContent: false, size: 1 << 30) == .join, "a rename or a delete of a big file")
        #expect(CommitBatch.next(needsContent: true, size: small) == .join, "its bytes inside the commit")
        #expect(CommitBatch.next(needsContent: true, size: small + 1) == .sendFirst)
    }

    @Test func fullByCountOrByWeight() {
        var b = CommitBatch()
        for _ in 1..<CommitBatch.maxCommits { b.add(chunks: 1, inlineBytes: 100) }
        #expect(!b.isFull)
        b.add(chunks: 1, inlineBytes: 100)
        #expect(b.isFull && b.commits == CommitBatch.maxCommits)
        var heavy = CommitBatch()
        for _ in 0..<15 { heavy.add(chunks: 1, inlineBytes: 64 * 1024) }
        #expect(heavy.isFull == (heavy.bytes >= CommitBatch.maxBytes) && heavy.bytes > 15 * 64 * 1024)
        var long = CommitBatch()
        long.add(chunks: 20_000, inlineBytes: 0)
        #expect(long.isFull, "one state with a long chunk list goes alone")
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

    /// When the push loop may take a queued item: (the wait, now, ready).
    @Test(arguments: [
        (S.Wait?.none, 0, true),
        (.failed(.retrying(at: .s(5), delay: 1)), 4, false),
        (.failed(.retrying(at: .s(5), delay: 1)), 5, true),
        (.failed(.refused(at: .s(300))), 299, false),
        (.failed(.refused(at: .s(300))), 300, true),
        (.until(.s(10)), 9, false),
        (.until(.s(10)), 10, true),
        (.paced(.s(10)), 9, false),
        (.lock, 0, true),
        (.content, 1_000, false),
    ] as [(S.Wait?, Int, Bool)])
    func ready(_ wait: S.Wait?, _ now: Int, _ ready: Bool) {
        var u = S()
        switch wait {
        case .failed(.retrying(let at, _))?: u.on(.failed(.transient, message: "x", missingChunks: false), at: at.advanced(by: .seconds(-1)), rules: rules)
        case .failed(.refused(let at))?: u.on(.failed(.refused, message: "x", missingChunks: false), at: at.advanced(by: .seconds(-300)), rules: rules)
        case .failed(.overQuota)?: Issue.record("not a case here")
        case .until(let t)?: u.on(.askAgain(until: t), at: .s(0), rules: rules)
        case .paced(let t)?: u.on(.paced(until: t), at: .s(0), rules: rules)
        case .lock?: u.on(.lockHeld, at: .s(0), rules: rules)
        case .content?: u.on(.contentApart, at: .s(0), rules: rules)
        case nil: break
        }
        #expect(u.wait == wait)
        #expect(u.ready(at: .s(now)) == ready)
        #expect(u.refused == (wait.map { if case .failed(.refused) = $0 { true } else { false } } ?? false))
    }

    @Test func aRecordIsForgottenOnlyWhenNothingIsLeft() {
        var u = S()
        #expect(u.isIdle(at: .s(0), rules: rules))
        u.on(.wrote, at: .s(-100), rules: rules)
        #expect(!u.isIdle(at: .s(0), rules: rules))
        u.on(.writersGone, at: .s(0), rules: rules)
        #expect(u.isIdle(at: .s(0), rules: rules))
        u.on(.download(failed: "download failed"), at: .s(0), rules: rules)
        #expect(!u.isIdle(at: .s(0), rules: rules))
        u.on(.download(failed: nil), at: .s(0), rules: rules)
        u.on(.changed(content: true), at: .s(0), rules: rules)
        u.on(.uploaded(sent: 10, written: 10), at: .s(0), rules: rules)
        #expect(!u.isIdle(at: .s(5), rules: rules))
        #expect(u.isIdle(at: .s(30), rules: rules))
    }
}

@Suite struct DeletedHereTests {
    typealias S = UploadState<T>
    let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))

    /// A delete is never paced, held for a save, a snapshot or a lock, nor kept back by a refusal
    /// of the state it deletes; server trouble still backs it off.
    @Test func aDeleteGoesAtOnceUnlessTheServerIsInTrouble() {
        var paced = S()
        paced.on(.wrote, at: .s(0), rules: rules)
        paced.on(.quiet(generation: 3, queued: false), at: .s(10), rules: rules)
        paced.on(.askAgain(until: .s(200)), at: .s(10), rules: rules)
        paced.on(.deletedHere, at: .s(100), rules: rules)
        #expect(paced.ready(at: .s(100)) && !paced.snapshotDue)

        var locked = S()
        locked.on(.lockHeld, at: .s(0), rules: rules)
        locked.on(.deletedHere, at: .s(100), rules: rules)
        #expect(!locked.waitingForLock && locked.ready(at: .s(100)))

        var refused = S()
        refused.on(.failed(.refused, message: "invalid_name", missingChunks: false), at: .s(100), rules: rules)
        refused.on(.deletedHere, at: .s(100), rules: rules)
        #expect(refused.ready(at: .s(100)) && refused.failure == nil && refused.error == nil)

        var q = S()
        q.on(.failed(.overQuota(nil), message: "over quota", missingChunks: false), at: .s(100), rules: rules)
        q.on(.deletedHere, at: .s(100), rules: rules)
        #expect(q.ready(at: .s(100)))

        var r = S()
        r.on(.failed(.transient, message: "upload failed: 503", missingChunks: false), at: .s(100), rules: rules)
        r.on(.failed(.transient, message: "upload failed: 503", missingChunks: false), at: .s(101), rules: rules)
        r.on(.failed(.transient, message: "upload failed: 503", missingChunks: false), at: .s(103), rules: rules)
        r.on(.deletedHere, at: .s(104), rules: rules)
        #expect(!r.ready(at: .s(106)) && r.ready(at: .s(107)) && r.error != nil)
    }
}

/// The phases change only by events, and each event says what the engine does next.
@Suite struct UploadEventTests {
    typealias S = UploadState<T>
    let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))

    /// A file kept open: its quiet period asks for one snapshot per write generation, never while
    /// it is queued or being pushed; once no program writes it, nothing of the writer is left.
    @Test func aWriterAsksForOneSnapshotPerGeneration() {
        var s = S()
        s.on(.wrote, at: .s(0), rules: rules)
        #expect(s.writing && !s.snapshotDue)
        #expect(s.on(.quiet(generation: 4, queued: true), at: .s(10), rules: rules).isEmpty && !s.snapshotDue)
        #expect(s.on(.quiet(generation: 4, queued: false), at: .s(10), rules: rules) == [.queue] && s.snapshotDue)
        s.on(.committing(snapshot: true), at: .s(11), rules: rules)
        #expect(!s.snapshotDue && s.writing)
        s.on(.snapshotSent(4), at: .s(12), rules: rules)
        #expect(s.snapshotSent == 4)
        #expect(s.on(.quiet(generation: 4, queued: false), at: .s(30), rules: rules).isEmpty, "the same generation is not sent twice")
        #expect(s.on(.quiet(generation: 5, queued: false), at: .s(40), rules: rules) == [.queue])
        s.on(.writersGone, at: .s(41), rules: rules)
        #expect(!s.writing && !s.snapshotDue && s.snapshotSent == nil)
        #expect(s.on(.quiet(generation: 6, queued: false), at: .s(50), rules: rules).isEmpty, "no writer, no snapshot")
    }

    /// A commit that failed without an answer may have applied (server trouble, a lost
    /// connection), as may one queued at a start: until an answer is settled, the item is
    /// `unanswered` and its next push is sent even when its state is its base's. A refusal or a
    /// refused token is an answer: nothing applied.
    @Test func aCommitWithoutAnAnswerMayHaveAppliedUntilOneIsSettled() {
        var s = S()
        s.on(.failed(.refused, message: "invalid_name", missingChunks: false), at: .s(0), rules: rules)
        s.on(.failed(.unauthorized, message: "401", missingChunks: false), at: .s(0), rules: rules)
        #expect(!s.unanswered)
        s.on(.failed(.transient, message: "500: the answer was lost", missingChunks: false), at: .s(1), rules: rules)
        #expect(s.unanswered)
        s.on(.pushEnded(closed: true), at: .s(3), rules: rules)
        #expect(s.unanswered && !s.isIdle(at: .s(100), rules: rules), "kept until an answer, the record with it")
        s.on(.settling, at: .s(4), rules: rules)
        #expect(!s.unanswered && s.isIdle(at: .s(100), rules: rules))
        s.on(.queuedAtStart, at: .s(5), rules: rules)
        #expect(s.unanswered)
        let base = LocalRulesTests.item()
        #expect(CommitPlan.nothingToSend(base: base, draft: ItemDraft(base), timeSetOnPurpose: false, unanswered: false))
        #expect(!CommitPlan.nothingToSend(base: base, draft: ItemDraft(base), timeSetOnPurpose: false, unanswered: true),
                "the server may hold what the unanswered commit sent")
    }

    /// A push that ends closes the writer phase only when no program writes the file; a wait
    /// for the item's next look (paced) outlives it, a back-off does not.
    @Test func aPushThatEndsClearsTheFailureButNotAWait() {
        var s = S()
        s.on(.wrote, at: .s(0), rules: rules)
        s.on(.failed(.transient, message: "upload failed: offline", missingChunks: true), at: .s(1), rules: rules)
        #expect(s.failure != nil && s.chunksMissing && s.error != nil)
        s.on(.pushEnded(closed: false), at: .s(3), rules: rules)
        #expect(s.failure == nil && !s.chunksMissing && s.error == nil && s.writing)
        s.on(.askAgain(until: .s(20)), at: .s(4), rules: rules)
        s.on(.pushEnded(closed: true), at: .s(4), rules: rules)
        #expect(s.notBefore == .s(20) && !s.writing && !s.ready(at: .s(19)))
        #expect(s.on(.waitLook(written: 0), at: .s(5), rules: rules).isEmpty && !s.ready(at: .s(5)))
        #expect(s.on(.waitLook(written: 0), at: .s(20), rules: rules) == [.queue] && s.wait == nil)
        // Paced: released early once the program has written enough (here: no run of uploads
        // to pace any more).
        s.on(.paced(until: .s(40)), at: .s(21), rules: rules)
        #expect(s.on(.waitLook(written: 0), at: .s(22), rules: rules) == [.queue] && s.ready(at: .s(22)))
    }

    /// The unlock queues the item again only when its upload waited for the lock.
    @Test func anUnlockQueuesOnlyWhatWaitedForIt() {
        var s = S()
        #expect(s.on(.lockReleased, at: .s(0), rules: rules).isEmpty)
        s.on(.lockHeld, at: .s(1), rules: rules)
        #expect(s.waitingForLock && s.ready(at: .s(1)))
        #expect(s.on(.lockReleased, at: .s(2), rules: rules) == [.queue] && !s.waitingForLock)
        #expect(s.on(.lockReleased, at: .s(3), rules: rules).isEmpty)
    }

    /// Every failure keeps the change queued, first in line, except a refused move, which is put
    /// back where the server has it; a refused token stops uploads until a valid one comes.
    @Test(arguments: [
        (UploadFailure.transient, [S.Action.retryIn(seconds: 1), .queueFirst]),
        (.refused, [.retryIn(seconds: 300), .queueFirst]),
        (.overQuota(nil), [.retryIn(seconds: 60), .queueFirst]),
        (.unauthorized, [.waitForToken, .queueFirst]),
        (.moveRefused, [.putBack]),
    ] as [(UploadFailure, [S.Action])])
    func aFailureSaysWhatHappensToTheChange(_ f: UploadFailure, _ actions: [S.Action]) {
        var s = S()
        #expect(s.on(.failed(f, message: "x", missingChunks: false), at: .s(0), rules: rules) == actions)
    }

    /// A place moved back here since a commit is kept by the next answer only.
    @Test func aMovedBackPlaceIsKeptByOneAnswer() {
        var s = S()
        #expect(s.on(.settling, at: .s(0), rules: rules).isEmpty)
        s.on(.movedBackSinceCommit, at: .s(1), rules: rules)
        #expect(s.on(.settling, at: .s(2), rules: rules) == [.keepPlace])
        #expect(s.on(.settling, at: .s(3), rules: rules).isEmpty)
        #expect(s.isIdle(at: .s(1000), rules: rules))
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
        let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))
        func delay(_ s: inout S, _ f: UploadFailure, at t: Int) -> Int {
            for case .retryIn(let seconds) in s.on(.failed(f, message: "x", missingChunks: false), at: .s(t), rules: rules) { return seconds }
            return 0
        }
        var s = S()
        #expect(delay(&s, .transient, at: 100) == 1 && s.failure == .retrying(at: .s(101), delay: 1))
        #expect(delay(&s, .transient, at: 101) == 2 && s.failure == .retrying(at: .s(103), delay: 2))
        #expect(delay(&s, .refused, at: 103) == 300 && s.refused && !s.ready(at: .s(402)) && s.ready(at: .s(403)))
        let figures = QuotaFigures(usage: 10, quota: 5)
        #expect(delay(&s, .overQuota(figures), at: 500) == 60 && s.overQuota == .some(figures))
        var t = S()
        #expect(delay(&t, .unauthorized, at: 1) == 0 && t.failure == nil)
        #expect(delay(&t, .moveRefused, at: 1) == 0 && t.failure == nil)
    }
}
