// NimbusKit: Foundation-shaped file coordination for programs on a Nimbus mount.
// The wire protocol is docs/presenters.md (claims: docs/coordination.md); this is one client of it.
import Dispatch
import Foundation
import Synchronization

/// A program's view of a file or folder in a Nimbus mount, told when the sync engine needs it
/// (shaped like Foundation's `NSFilePresenter`, which Foundation on Linux lacks). Register with
/// `FileCoordinator.addFilePresenter(_:)`. Every method has a default; each runs on the
/// presenter's own serial `presentedItemOperationQueue`, so a slow presenter never holds up
/// another, and a method may coordinate freely (reads never wait for presenters; docs/presenters.md).
public protocol FilePresenter: AnyObject, Sendable {
    /// The presented item, inside a Nimbus mount.
    var presentedItemURL: URL? { get }
    /// Where this presenter's methods run (default: a serial queue of its own, made on first use).
    var presentedItemOperationQueue: DispatchQueue { get }
    /// The file is about to be uploaded: write what is not saved yet. The daemon is answered when
    /// this returns (a thrown error is passed on to it).
    func savePresentedItemChanges() throws
    /// Another version is about to replace or delete the file, or another program's coordinated
    /// write starts: finish writing, then call `writer` once, with a block to run (on this
    /// presenter's queue) when the file may be used again, or nil. The daemon goes on after its
    /// bound whether or not `writer` was called; the block still runs when the change is done.
    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void)
    /// Content or attributes changed (here or on another device), but not by this presenter's
    /// own coordinated write.
    func presentedItemDidChange()
    /// The item moved; keep presenting it at `newURL`.
    func presentedItemDidMove(to newURL: URL)
    /// The item was deleted; the presentation has ended.
    func accommodatePresentedItemDeletion()
    /// A new version of the item from the server is shown now.
    func presentedItemDidGain(version: Int)
    /// An upload of the item became a conflict version.
    func presentedItemDidConflict()
}

extension FilePresenter {
    public var presentedItemOperationQueue: DispatchQueue { PresenterQueues.queue(for: self) }
    public func savePresentedItemChanges() throws {}
    public func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) { writer(nil) }
    public func presentedItemDidChange() {}
    public func presentedItemDidMove(to newURL: URL) {}
    public func accommodatePresentedItemDeletion() {}
    public func presentedItemDidGain(version: Int) {}
    public func presentedItemDidConflict() {}
}

/// The default serial queue of each presenter object, kept as long as the object lives (the weak
/// reference tells a live object from a new one at a reused address; dead ones are pruned).
enum PresenterQueues {
    private struct Slot {
        weak var object: (any FilePresenter)?
        let queue: DispatchQueue
    }
    private static let slots = Mutex<[ObjectIdentifier: Slot]>([:])

    static func queue(for p: any FilePresenter) -> DispatchQueue {
        slots.withLock { slots in
            let id = ObjectIdentifier(p)
            if let slot = slots[id], slot.object === p { return slot.queue }
            slots = slots.filter { $0.value.object != nil }
            let queue = DispatchQueue(label: "nimbuskit.presenter.\(type(of: p))")
            slots[id] = Slot(object: p, queue: queue)
            return queue
        }
    }
}

/// What went wrong, said so a person knows what to do.
public enum CoordinationError: Error, CustomStringConvertible {
    /// No claim (or no answer from the file's presenters) within the timeout.
    case timedOut(path: String, seconds: Double)
    case notInMount(String)
    case refused(String)
    case unreachable(socket: String, reason: String)
    /// A system call on the file failed (e.g. `ENOENT` for a coordinated read of a missing file).
    case posix(path: String, errno: Int32)

    public var description: String {
        switch self {
        case .timedOut(let path, let s):
            return "timed out after \(Self.text(s)) s waiting for a claim on \(path) (held by another program; `nimbus debug claims` shows who)"
        case .notInMount(let p): return "not inside a Nimbus mount: \(p)"
        case .refused(let why): return "the mount's daemon refused: \(why)"
        case .unreachable(let socket, let reason): return "cannot reach the mount daemon at \(socket): \(reason)"
        case .posix(let path, let e): return "\(path): \(String(cString: strerror(e)))"
        }
    }

    /// 30 → "30", 0.25 → "0.25".
    static func text(_ seconds: Double) -> String {
        seconds == seconds.rounded() && abs(seconds) < 1e15 ? String(Int(seconds)) : String(format: "%g", seconds)
    }
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
