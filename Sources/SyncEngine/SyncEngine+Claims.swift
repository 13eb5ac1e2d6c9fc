import Coordination
import Foundation
import MountPorts
import NimbusCore
import NimbusProtocol
import SyncCore

// The engine and programs' locks (docs/coordination.md). Programs' fcntl/flock locks on the mount
// are claims in the mount's Coordinator:
// - no upload while a program holds a file exclusively (it is mid-save); chunking takes a read
//   claim, so the chunk list is the file's content at one instant;
// - no remote replacement while any program holds a lock on the file: the new version waits
//   (status `downloaded`) and is applied, under a write claim, once the last lock goes. It is
//   never dropped: after a restart the container is listed again.

extension SyncEngine {
    /// The write claim for applying `item`'s new content, or nil when a program holds the file:
    /// then the version waits in `pendingRemote` until `locksReleased`.
    func applyClaim(_ item: ServerItem, fs: any MountedTree) -> Claim? {
        if let c = services?.coordinator.tryClaim(item.id, .exclusive, label: "sync: apply version \(item.version)") {
            state.withLock { $0.items[item.id]?.remote.lockClaimed() }
            return c
        }
        let first = state.withLock { $0.items[item.id, default: SyncItem()].remote.holdForLock(item) }
        if first {
            markRelist()
            log("\(item.name.value) is locked by a program here: version \(item.version) waits until it is unlocked")
        }
        return nil
    }

    /// The coordinator's release handler: locks on `id` went (called on the releasing thread).
    func locksReleased(_ id: ItemID) {
        let now = options.clock.now, rules = pacingRules
        let (requeue, pending) = state.withLock { s -> (Bool, ServerItem?) in
            let requeue = s.uploadEvent(id, .lockReleased, at: now, rules: rules)
            return (requeue, s.items[id]?.remote.forLock)
        }
        if requeue { wake.yield() }
        guard let pending else { return }
        // Not on the releasing (libfuse) thread: apply takes the filesystem lock. (When the
        // engine is stopping it waits: the next start lists the container, `markRelist`.)
        jobs.spawn {
            do {
                try await self.applyAskingPresenters([pending], event: .locksReleased(id))
            } catch {
                self.log("applying the held version of \(pending.name.value) failed: \(error)")
            }
        }
    }
}
