import Coordination
import FuseKit
import Glibc
import MountPorts
import NimbusCore

// fcntl and flock locks on the mount (ContainerFS+Locks.swift): decoded here, decided by the
// coordinator. A blocking request (F_SETLKW, flock without LOCK_NB) is answered later, when the
// coordinator grants or refuses it; a signal to the waiting program interrupts it (EINTR).

extension FuseAdapter {
    public var handlesLocks: Bool { true }

    static func posixOwner(_ owner: UInt64, pid: Int32, holdsSync: Bool = true) -> LockOwner {
        LockOwner(.posix(owner), label: "pid \(pid)" + (holdsSync ? "" : " (cannot write: sync not held)"), pid: pid, holdsSync: holdsSync)
    }
    static func flockOwner(_ owner: UInt64, pid: Int32, holdsSync: Bool = true) -> LockOwner {
        LockOwner(.flock(owner), label: "pid \(pid)" + (holdsSync ? "" : " (cannot write: sync not held)"), pid: pid, holdsSync: holdsSync)
    }

    /// Whether the caller of `reply` may write `node`: only then do its locks hold sync back.
    private func holdsSync(_ node: NodeID, _ reply: borrowing FuseReply) -> Bool {
        let c = reply.context
        return fs.mayWrite(node: node, caller: Caller(c, groups: c.uid == 0 ? [] : reply.groups))
    }

    /// The item of a regular file of the tree that locks may be taken on (EINVAL for `.nimbus/`).
    private func lockable(_ node: NodeID) throws(Errno) -> ItemID {
        guard case .item = fs.ids.owner(of: node) else { throw .EINVAL }
        return try fs.lockableItem(node)
    }

    public func getlk(node: NodeID, handle: HandleID, owner: UInt64, lock: FuseLock, reply: consuming FuseReply) {
        let id: ItemID
        do { id = try lockable(node) } catch { return reply.error(error) }
        var answer = lock
        answer.type = Int16(F_UNLCK)
        if lock.type != Int16(F_UNLCK),
           let c = fs.coordinator.conflict(item: id, owner: Self.posixOwner(owner, pid: reply.context.pid),
                                           range: ByteRange(start: lock.start, length: lock.length),
                                           mode: lock.type == Int16(F_WRLCK) ? .exclusive : .shared) {
            answer = FuseLock(type: Int16(c.mode == .exclusive ? F_WRLCK : F_RDLCK), start: c.range.start,
                              length: c.range.end == .max ? 0 : c.range.end - c.range.start, pid: c.owner.pid)
        }
        reply.lock(answer)
    }

    public func setlk(node: NodeID, handle: HandleID, owner: UInt64, lock: FuseLock, wait: Bool, reply: consuming FuseReply) {
        let id: ItemID
        do { id = try lockable(node) } catch { return reply.error(error) }
        let who = Self.posixOwner(owner, pid: reply.context.pid, holdsSync: holdsSync(node, reply))
        let range = ByteRange(start: lock.start, length: lock.length)
        switch Int32(lock.type) {
        case F_UNLCK:
            fs.coordinator.unlock(item: id, owner: who, range: range)
            reply.ok()
        case F_RDLCK, F_WRLCK:
            take(id, who, range, lock.type == Int16(F_WRLCK) ? .exclusive : .shared, wait: wait, reply: reply)
        default:
            reply.error(.EINVAL)
        }
    }

    public func flock(node: NodeID, handle: HandleID, owner: UInt64, operation: Int32, reply: consuming FuseReply) {
        let id: ItemID
        do { id = try lockable(node) } catch { return reply.error(error) }
        let who = Self.flockOwner(owner, pid: reply.context.pid, holdsSync: holdsSync(node, reply))
        let wait = operation & LOCK_NB == 0
        switch operation & ~LOCK_NB {
        case LOCK_UN:
            fs.coordinator.unlock(item: id, owner: who)
            reply.ok()
        case LOCK_SH: take(id, who, .whole, .shared, wait: wait, reply: reply)
        case LOCK_EX: take(id, who, .whole, .exclusive, wait: wait, reply: reply)
        default: reply.error(.EINVAL)
        }
    }

    public func releaseLocks(node: NodeID, owner: UInt64, flock: Bool) {
        guard let id = try? lockable(node) else { return }
        fs.coordinator.releaseAll(owner: LockOwner(flock ? .flock(owner) : .posix(owner), label: ""), item: id)
    }

    public func interrupted(token: UInt64) { fs.coordinator.cancel(token) }

    private func take(_ id: ItemID, _ who: LockOwner, _ range: ByteRange, _ mode: LockMode, wait: Bool, reply: consuming FuseReply) {
        let request = fs.coordinator.newRequest()
        if wait { reply.watchInterrupt(token: request) }
        let box = ReplyBox(reply)
        let coordinator = fs.coordinator
        coordinator.lock(request, item: id, owner: who, range: range, mode: mode, wait: wait) { result in
            // Only the sync engine is in the way (a read claim while it chunks the file for an
            // upload, a write claim while it applies a version): those last milliseconds, so a
            // program's non-blocking lock waits for them (at most 2 s) instead of failing —
            // sqlite3 without a busy timeout reported "database is locked" on a file just created.
            if case .failure(.wouldBlock(let blockers)) = result, !blockers.isEmpty,
               blockers.allSatisfy({ if case .claim = $0.kind { true } else { false } }) {
                coordinator.lock(coordinator.newRequest(), item: id, owner: who, range: range, mode: mode, wait: true,
                                 timeout: .seconds(2)) { second in
                    guard let r = box.take() else { return }
                    switch second {
                    case .success: r.ok()
                    case .failure(.deadlock): r.error(.EDEADLK)
                    case .failure: r.error(.EAGAIN)
                    }
                }
                return
            }
            guard let r = box.take() else { return }
            switch result {
            case .success: r.ok()
            case .failure(.wouldBlock), .failure(.timedOut): r.error(.EAGAIN)
            case .failure(.deadlock): r.error(.EDEADLK)
            case .failure(.cancelled): r.error(.EINTR)
            }
        }
    }
}
