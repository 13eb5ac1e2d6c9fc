import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

/// The record an engine keeps per item: its phases are there only while something is under way.
@Suite struct SyncItemTests {
    let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))

    @Test func aRecordAtRestHasNoPhases() {
        var item = SyncItem<T>(base: Base.placeholder(RemoteHoldsTests.v(3)))
        #expect(!item.busy && item.upload == UploadState() && item.remote.isEmpty)
        item.upload.writing = true
        #expect(item.busy)
        item.upload.writing = false  // back to nothing under way: the phase goes at once
        #expect(!item.busy)
        item.remote.forLock = RemoteHoldsTests.v(4)
        #expect(item.busy && item.remote.forLock?.version == 4)
        item.remote.drop(upTo: 4)
        #expect(!item.busy)
        #expect(item.base?.version == 3)
    }

    @Test func settlingForgetsIdlePhasesAndKeepsTheBase() {
        var item = SyncItem<T>(base: Base.placeholder(RemoteHoldsTests.v(3)))
        item.upload.pacing.changed(at: .s(0), rules: rules)
        #expect(item.busy)
        item.settle(at: .s(1), rules: rules)
        #expect(item.busy, "still pacing within the quiet period")
        item.settle(at: .s(7200), rules: rules)
        #expect(!item.busy && item.base?.version == 3)
    }

    @Test func aHeldStateIsNeverSettledAway() {
        var item = SyncItem<T>()
        item.remote.skipped = RemoteHoldsTests.v(9)
        item.settle(at: .s(100_000), rules: rules)
        #expect(item.remote.skipped?.version == 9)
    }

    @Test func copiesAreIndependent() {
        var a = SyncItem<T>()
        a.upload.pushedAhead = 1
        var b = a
        b.upload.pushedAhead = 2
        b.remote.skipped = RemoteHoldsTests.v(1)
        #expect(a.upload.pushedAhead == 1 && a.remote.isEmpty)
        #expect(b.upload.pushedAhead == 2 && a != b)
        b.upload.pushedAhead = 1
        b.remote.skipped = nil
        #expect(a == b)
    }
}
