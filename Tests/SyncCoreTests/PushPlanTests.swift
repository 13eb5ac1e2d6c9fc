import SyncCore
import Testing

@Suite struct PushPlanTests {
    typealias Step = PushStep<T>
    let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))

    static func facts(exists: Bool = true, isFile: Bool = true, hasBase: Bool = true, complete: Bool = true,
                      localOnly: Bool = false, pendingSafeSave: Bool = false, midSave: UInt64? = nil,
                      locked: Bool = false, written: UInt64 = 0, unnoticed: Bool = false, below: Bool = false,
                      ignored: Bool? = false) -> PushFacts<T> {
        PushFacts(exists: exists, isFile: isFile, hasBase: hasBase, complete: complete, localOnly: localOnly,
                  pendingSafeSave: pendingSafeSave, midSaveGeneration: midSave, lockedExclusively: locked, written: written,
                  unnoticedChange: unnoticed, belowStillToPush: below, ignored: ignored, now: .s(100))
    }

    /// The decision at the start of a push for an item with no upload record: (facts, step).
    @Test(arguments: [
        (facts(exists: false), Step.commitDelete),
        (facts(exists: false, isFile: false, below: true), .waitForBelow(until: T.s(101))),
        (facts(exists: false, midSave: 3, locked: true), .commitDelete),
        (facts(isFile: false), .commit(snapshot: nil)),
        (facts(isFile: false, locked: true), .commit(snapshot: nil)),
        (facts(), .commit(snapshot: nil)),
        (facts(hasBase: false, localOnly: true), .keepLocal),
        (facts(hasBase: true, localOnly: true), .commit(snapshot: nil)),
        (facts(hasBase: false, pendingSafeSave: true), .waitForSafeSave(until: T.s(100).advanced(by: .milliseconds(500)))),
        (facts(hasBase: false, localOnly: true, pendingSafeSave: true), .keepLocal),
        (facts(midSave: 7), .waitForWriter),
        (facts(midSave: 7, locked: true), .waitForWriter),
        (facts(locked: true), .waitForLock),
        (facts(complete: false, locked: true), .waitForLock),
        // A change on its way to the engine: a placeholder's base would say "nothing to send".
        (facts(complete: false, unnoticed: true), .waitForNotice(until: T.s(100).advanced(by: .milliseconds(20)))),
        (facts(locked: true, unnoticed: true), .waitForNotice(until: T.s(100).advanced(by: .milliseconds(20)))),
        (facts(exists: false, unnoticed: true), .commitDelete),
        // Ignored here (`.nimbusignore`), or under rules not here yet: parked, whatever else holds.
        (facts(ignored: true), .park),
        (facts(ignored: nil), .park),
        (facts(hasBase: false, ignored: true), .park),
        (facts(isFile: false, hasBase: false, ignored: true), .park),
        (facts(midSave: 7, locked: true, ignored: true), .park),
        (facts(exists: false, ignored: true), .park),
        // Deleted here and never on the server: nothing to keep, its entries go.
        (facts(exists: false, hasBase: false, ignored: true), .commitDelete),
    ] as [(PushFacts<T>, Step)])
    func withoutARecord(_ f: PushFacts<T>, _ step: Step) {
        #expect(SyncItem<T>().pushStep(f, rules: rules) == step)
    }

    @Test func aSnapshotIsDueForAFileKeptOpen() {
        var item = SyncItem<T>()
        item.upload.on(.wrote, at: .s(0), rules: rules)
        #expect(item.upload.on(.quiet(generation: 7, queued: false), at: .s(10), rules: rules) == [.queue])
        #expect(item.pushStep(Self.facts(midSave: 7), rules: rules) == .commit(snapshot: 7))
        #expect(item.pushStep(Self.facts(midSave: 7, locked: true), rules: rules) == .waitForLock)
        #expect(item.pushStep(Self.facts(), rules: rules) == .commit(snapshot: nil))
    }

    @Test func aFileThatKeepsChangingIsPacedUnlessItsBytesAreNotHere() {
        var item = SyncItem<T>()
        for second in 97...99 {
            item.upload.on(.changed(content: true), at: .s(second), rules: rules)
            item.upload.on(.uploaded(sent: 10, written: 1000), at: .s(second), rules: rules)
        }
        #expect(item.pushStep(Self.facts(written: 100_000), rules: rules) == .paced(until: .s(107)))
        // A placeholder's metadata change commits its base chunks: nothing to pace.
        #expect(item.pushStep(Self.facts(complete: false, written: 100_000), rules: rules) == .commit(snapshot: nil))
        // Folders are never paced.
        #expect(item.pushStep(Self.facts(isFile: false), rules: rules) == .commit(snapshot: nil))
    }

    @Test(arguments: [
        (Step.commitDelete, false), (.keepLocal, false), (.park, false), (.waitForSafeSave(until: .s(1)), false), (.waitForWriter, true),
        (.waitForLock, true), (.paced(until: .s(1)), true), (.commit(snapshot: nil), true), (.waitForNotice(until: .s(1)), false),
    ] as [(Step, Bool)])
    func presentersAreAskedForContentSteps(_ step: Step, _ asks: Bool) {
        #expect(step.concernsContent == asks)
    }
}

/// What a push step records in the item's upload record.
@Suite struct PushStepEventsTests {
    typealias S = PushStep<T>

    @Test func eachStepRecordsWhatItMeans() {
        #expect(S.keepLocal.uploadEvents(isFile: true, hasBase: false) == [.deviceLocal(true)])
        #expect(S.park.uploadEvents(isFile: true, hasBase: true) == [.deviceLocal(true)])
        #expect(S.park.uploadEvents(isFile: false, hasBase: false) == [.deviceLocal(true)])
        // Any other step: not device-local (a file no longer ignored is synced again).
        #expect(S.commit(snapshot: nil).uploadEvents(isFile: true, hasBase: false) == [.deviceLocal(false), .committing(snapshot: false)])
        #expect(S.commit(snapshot: 3).uploadEvents(isFile: true, hasBase: true) == [.deviceLocal(false), .committing(snapshot: true)])
        #expect(S.commit(snapshot: nil).uploadEvents(isFile: false, hasBase: false) == [.deviceLocal(false), .committing(snapshot: false)])
        #expect(S.commitDelete.uploadEvents(isFile: false, hasBase: true) == [.deviceLocal(false)])
        #expect(S.waitForLock.uploadEvents(isFile: true, hasBase: true) == [.deviceLocal(false), .lockHeld])
        #expect(S.paced(until: .s(9)).uploadEvents(isFile: true, hasBase: true) == [.deviceLocal(false), .paced(until: .s(9))])
        #expect(S.waitForWriter.uploadEvents(isFile: true, hasBase: true) == [.deviceLocal(false)])
        #expect(S.waitForSafeSave(until: .s(1)).uploadEvents(isFile: true, hasBase: false) == [.deviceLocal(false)])
        #expect(S.waitForBelow(until: .s(1)).uploadEvents(isFile: false, hasBase: true) == [.deviceLocal(false)])
    }
}
