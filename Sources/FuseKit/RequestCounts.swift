import CFuse3

/// How many requests of each kind the kernel sent a session: counted (one relaxed atomic add per
/// request), never timed. `.nimbus/requests` shows them, and tests hold workloads to a budget of
/// requests.
public final class FuseRequestCounts: @unchecked Sendable {
    // @unchecked: the slots are only touched through atomic operations (CFuse3 shim).
    public enum Op: Int, CaseIterable, Sendable {
        case lookup, forget, forgetMulti, getattr, setattr, readlink, mknod, mkdir, unlink, rmdir, symlink, rename, link
        case open, create, read, write, flush, release, getlk, setlk, flock, fsync, fallocate
        case opendir, readdir, readdirplus, releasedir, fsyncdir, statfs, setxattr, getxattr, listxattr, removexattr

        /// The name the kernel's protocol gives the request (FUSE_LOOKUP → "lookup").
        public var name: String {
            switch self {
            case .forgetMulti: "batch_forget"
            default: "\(self)"
            }
        }
    }

    private let slots: UnsafeMutablePointer<UInt64>

    public init() {
        slots = .allocate(capacity: Op.allCases.count)
        slots.initialize(repeating: 0, count: Op.allCases.count)
    }

    deinit { slots.deallocate() }

    @inline(__always) func add(_ op: Op) { cfuse_count_add(slots + op.rawValue) }

    /// Every kind with its count so far, in the order of `Op`.
    public func snapshot() -> [(op: Op, count: UInt64)] {
        Op.allCases.map { ($0, cfuse_count_load(slots + $0.rawValue)) }
    }
}
