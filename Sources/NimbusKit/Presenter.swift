// NimbusKit: Foundation-shaped file coordination for programs on a Nimbus mount.
// The wire protocol is docs/presenters.md; this is one client of it.
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
    /// Where this presenter's methods run (default: a serial queue of its own).
    var presentedItemOperationQueue: DispatchQueue { get }
    /// The file is about to be uploaded: write what is not saved yet.
    func savePresentedItemChanges() throws
    /// Another version is about to replace or delete the file, or another program's coordinated
    /// write starts: finish writing, then call `writer` (with a block to run when the file may be
    /// used again, or nil). The daemon goes on after its bound whether or not `writer` was called.
    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void)
    /// Content or attributes changed (here or on another device).
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

/// The default serial queue of each presenter object.
enum PresenterQueues {
    private static let queues = Mutex<[ObjectIdentifier: DispatchQueue]>([:])
    static func queue(for p: AnyObject) -> DispatchQueue {
        queues.withLock { q in
            let id = ObjectIdentifier(p)
            if let existing = q[id] { return existing }
            let made = DispatchQueue(label: "nimbuskit.presenter.\(q.count)")
            q[id] = made
            return made
        }
    }
    static func forget(_ p: AnyObject) { queues.withLock { _ = $0.removeValue(forKey: ObjectIdentifier(p)) } }
}

/// What went wrong, said so a person knows what to do.
public enum CoordinationError: Error, CustomStringConvertible {
    case timedOut(path: String, seconds: Double)
    case notInMount(String)
    case refused(String)
    case unreachable(socket: String, reason: String)
    case posix(path: String, errno: Int32)

    public var description: String {
        switch self {
        case .timedOut(let path, let s):
            return "timed out after \(s) s waiting for a claim on \(path) (held by another program; `nimbus debug claims` shows who)"
        case .notInMount(let p): return "not inside a Nimbus mount: \(p)"
        case .refused(let why): return "the mount's daemon refused: \(why)"
        case .unreachable(let socket, let reason): return "cannot reach the mount daemon at \(socket): \(reason)"
        case .posix(let path, let e): return "\(path): \(String(cString: strerror(e)))"
        }
    }
}
