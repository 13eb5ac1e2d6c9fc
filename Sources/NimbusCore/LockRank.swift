import Glibc
import Synchronization

/// The written order of the mount's locks: a thread takes them in increasing rank only, so no
/// two threads can wait on each other. Debug builds check every acquisition of a ranked lock
/// (`RankedMutex`, ContainerFS's `FSLock`, LocalStore's locks) against the locks the thread
/// holds, and trap on a lock taken under one of an equal or higher rank, naming both.
///
/// | rank | lock | what it guards |
/// | --- | --- | --- |
/// | 10 `tree` | ContainerFS `lock` | the tree, nodes, handles |
/// | 15 `cacheRetire` | ContainerFS `retiring` | removed items' cache files on their way to the trash |
/// | 20 `baseDisk` | SyncEngine `baseDiskLock` | writing bases to disk in the order memory had them |
/// | 30 `relistDisk` | SyncEngine `relistDiskLock` | the `sync.relist` mark on disk |
/// | 40 `storeWriteOrder` | LocalStore `writeOrder` | a commit and its publication, direct writes |
/// | 50 `storeQueue` | LocalStore `queueLock` | the write-behind queue |
/// | 60 `engineState` | SyncEngine `state` | the engine's memory: items, queue, status (taken by the read path) |
/// | 70 `contentGate` | SyncEngine `contentGate` | truncations asked for while downloads run |
///
/// SQLite is written only under ranks below `engineState`: a write never waits under a lock the
/// read path takes (LocalStore checks it in debug builds).
public enum LockRank: Int, Sendable, Comparable, CustomStringConvertible {
    case tree = 10
    case cacheRetire = 15
    case baseDisk = 20
    case relistDisk = 30
    case storeWriteOrder = 40
    case storeQueue = 50
    case engineState = 60
    case contentGate = 70

    public static func < (a: LockRank, b: LockRank) -> Bool { a.rawValue < b.rawValue }

    public var description: String {
        switch self {
        case .tree: "ContainerFS lock"
        case .cacheRetire: "ContainerFS retiring"
        case .baseDisk: "SyncEngine baseDiskLock"
        case .relistDisk: "SyncEngine relistDiskLock"
        case .storeWriteOrder: "LocalStore writeOrder"
        case .storeQueue: "LocalStore queueLock"
        case .engineState: "SyncEngine state"
        case .contentGate: "SyncEngine contentGate"
        }
    }

    /// What is wrong with taking a lock of this rank while holding `held` (in the order taken);
    /// nil when the order allows it.
    public func violation(holding held: [LockRank]) -> String? {
        guard let top = held.last, top >= self else { return nil }
        return "lock order: \(self) (rank \(rawValue)) taken while holding \(top) (rank \(top.rawValue)); see LockRank"
    }

    /// The thread is about to take a lock of this rank (debug builds: checked and recorded).
    @inline(__always)
    public func entering() {
        #if DEBUG
        let held = LockRank.held
        if let why = violation(holding: held) { fatalError(why) }
        LockRank.held = held + [self]
        #endif
    }

    /// The thread released the lock of this rank it took last.
    @inline(__always)
    public func leaving() {
        #if DEBUG
        var held = LockRank.held
        if let i = held.lastIndex(of: self) { held.remove(at: i) }
        LockRank.held = held
        #endif
    }

    /// The ranks the calling thread holds (debug builds; empty otherwise).
    public static var holding: [LockRank] {
        #if DEBUG
        held
        #else
        []
        #endif
    }

    #if DEBUG
    private final class Box { var ranks: [LockRank] = [] }
    private static let key: pthread_key_t = {
        var k = pthread_key_t()
        pthread_key_create(&k) { p in if let p { Unmanaged<AnyObject>.fromOpaque(p).release() } }
        return k
    }()

    private static var held: [LockRank] {
        get {
            guard let p = pthread_getspecific(key) else { return [] }
            return (Unmanaged<AnyObject>.fromOpaque(p).takeUnretainedValue() as! Box).ranks
        }
        set {
            let box: Box
            if let p = pthread_getspecific(key) {
                box = Unmanaged<AnyObject>.fromOpaque(p).takeUnretainedValue() as! Box
            } else {
                box = Box()
                pthread_setspecific(key, Unmanaged.passRetained(box as AnyObject).toOpaque())
            }
            box.ranks = newValue
        }
    }
    #endif
}

/// A `Mutex` with a place in `LockRank`'s order.
public struct RankedMutex<Value: ~Copyable>: ~Copyable, @unchecked Sendable {
    public let rank: LockRank
    private let mutex: Mutex<Value>

    public init(_ rank: LockRank, _ value: consuming sending Value) {
        self.rank = rank
        mutex = Mutex(value)
    }

    public borrowing func withLock<Result: ~Copyable, E: Error>(_ body: (inout sending Value) throws(E) -> sending Result) throws(E) -> sending Result {
        rank.entering()
        defer { rank.leaving() }
        return try mutex.withLock(body)
    }
}
