import Glibc

/// An errno for file operations: the one error vocabulary of the filesystem's boundary, used by
/// the FUSE binding, the filesystem and the sync engine's ports alike (no libfuse needed).
public struct Errno: Error, Equatable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: Int32
    public init(_ rawValue: Int32) { self.rawValue = rawValue }
    public var description: String { String(cString: strerror(rawValue)) + " (\(rawValue))" }

    public static let EPERM = Errno(Glibc.EPERM), ENOENT = Errno(Glibc.ENOENT), EIO = Errno(Glibc.EIO)
    public static let EBADF = Errno(Glibc.EBADF), EACCES = Errno(Glibc.EACCES), EEXIST = Errno(Glibc.EEXIST)
    public static let EXDEV = Errno(Glibc.EXDEV), ENOTDIR = Errno(Glibc.ENOTDIR), EISDIR = Errno(Glibc.EISDIR)
    public static let EINVAL = Errno(Glibc.EINVAL), ENOSPC = Errno(Glibc.ENOSPC), EROFS = Errno(Glibc.EROFS)
    public static let ENAMETOOLONG = Errno(Glibc.ENAMETOOLONG), ENOSYS = Errno(Glibc.ENOSYS)
    public static let ENOTEMPTY = Errno(Glibc.ENOTEMPTY), ENODATA = Errno(Glibc.ENODATA)
    public static let ERANGE = Errno(Glibc.ERANGE), E2BIG = Errno(Glibc.E2BIG), EILSEQ = Errno(Glibc.EILSEQ)
    public static let EOPNOTSUPP = Errno(Glibc.EOPNOTSUPP), EFBIG = Errno(Glibc.EFBIG), EMLINK = Errno(Glibc.EMLINK)
    public static let ENOTSUP = Errno(Glibc.ENOTSUP), EAGAIN = Errno(Glibc.EAGAIN), ELOOP = Errno(Glibc.ELOOP)
    public static let ENOTCONN = Errno(Glibc.ENOTCONN)
    public static let EDEADLK = Errno(Glibc.EDEADLK), EINTR = Errno(Glibc.EINTR)
    public static let EBUSY = Errno(Glibc.EBUSY), ESTALE = Errno(Glibc.ESTALE)

    /// The current thread's errno (after a failed libc call).
    public static var current: Errno { Errno(Glibc.errno) }
}
