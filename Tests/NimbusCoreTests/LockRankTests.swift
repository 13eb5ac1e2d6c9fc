import NimbusCore
import Testing

/// The written lock order: what may be taken under what, and that a ranked lock records itself
/// on the taking thread while held (the record debug builds check every acquisition against).
@Suite struct LockRankTests {
    @Test func locksAreTakenInIncreasingRankOnly() {
        #expect(LockRank.engineState.violation(holding: [.tree, .storeQueue]) == nil)
        #expect(LockRank.contentGate.violation(holding: [.engineState]) == nil)
        // The read path's lock is never held around a store write or a tree call.
        #expect(LockRank.storeWriteOrder.violation(holding: [.engineState])?.contains("LocalStore writeOrder") == true)
        #expect(LockRank.tree.violation(holding: [.engineState]) != nil)
        #expect(LockRank.engineState.violation(holding: [.engineState]) != nil, "not reentrant")
        #expect(LockRank.tree.violation(holding: []) == nil)
    }

    @Test func aRankedMutexIsRecordedWhileHeld() {
        let m = RankedMutex(.engineState, 0)
        #expect(LockRank.holding.isEmpty)
        let inside = m.withLock { value -> [LockRank] in
            value += 1
            return LockRank.holding
        }
        #if DEBUG
        #expect(inside == [.engineState])
        #endif
        #expect(LockRank.holding.isEmpty)
        #expect(m.withLock { $0 } == 1)
    }
}
