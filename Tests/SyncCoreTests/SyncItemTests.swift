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
        item.upload.on(.lockHeld, at: .s(0), rules: rules)
        #expect(item.busy)
        item.upload.on(.lockReleased, at: .s(1), rules: rules)  // back to nothing under way: the phase goes at once
        #expect(!item.busy)
        _ = item.remote.holdForLock(RemoteHoldsTests.v(4))
        #expect(item.busy && item.remote.forLock?.version == 4)
        item.remote.drop(upTo: 4)
        #expect(!item.busy)
        #expect(item.base?.version == 3)
    }

    @Test func settlingForgetsIdlePhasesAndKeepsTheBase() {
        var item = SyncItem<T>(base: Base.placeholder(RemoteHoldsTests.v(3)))
        item.upload.on(.changed(content: true), at: .s(0), rules: rules)
        #expect(item.busy)
        item.settle(at: .s(1), rules: rules)
        #expect(item.busy, "still pacing within the quiet period")
        item.settle(at: .s(7200), rules: rules)
        #expect(!item.busy && item.base?.version == 3)
    }

    @Test func aHeldStateIsNeverSettledAway() {
        var item = SyncItem<T>()
        item.remote.skip(RemoteHoldsTests.v(9))
        item.settle(at: .s(100_000), rules: rules)
        #expect(item.remote.skipped?.version == 9)
    }

    @Test func copiesAreIndependent() {
        var a = SyncItem<T>()
        a.upload.on(.pushedAhead, at: .s(0), rules: rules)
        var b = a
        let c = a
        b.upload.on(.pushedAhead, at: .s(0), rules: rules)
        b.remote.skip(RemoteHoldsTests.v(1))
        #expect(a.upload.pushedAhead == 1 && a.remote.isEmpty)
        #expect(b.upload.pushedAhead == 2 && a != b)
        #expect(a == c)
    }
}
