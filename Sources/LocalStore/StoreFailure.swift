import Foundation
import GRDB

/// Why the local state could not be saved: what `LocalStore.sync()` (and so `fsync` on the
/// mount) answers while commits fail, and what `close` returns when some changes could not be
/// saved before the store stopped.
public struct StoreFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    /// The disk of the state directory is full.
    public var noSpace: Bool
    /// Worth retrying: the disk, I/O, a lock or memory, not a change the database refuses.
    var retryable = true

    public init(message: String, noSpace: Bool) {
        self.message = message
        self.noSpace = noSpace
    }

    /// Classifies a database error. SQLite answers a full disk with SQLITE_FULL for the
    /// database and the WAL, but with an I/O error when growing the shared-memory file: an I/O
    /// error while less than 64 KiB is free on the state disk counts as a full disk too.
    init(_ error: any Error, directory: String) {
        guard let e = error as? DatabaseError else {
            self.init(message: "\(error)", noSpace: false)
            return
        }
        let full = e.resultCode == .SQLITE_FULL || (e.resultCode == .SQLITE_IOERR && Self.nearlyFull(directory))
        self.init(message: full ? "the disk of the local state is full (\(e.message ?? "SQLITE_FULL"))" : "\(e)",
                  noSpace: full)
        retryable = [.SQLITE_FULL, .SQLITE_IOERR, .SQLITE_BUSY, .SQLITE_LOCKED, .SQLITE_CANTOPEN, .SQLITE_NOMEM,
                     .SQLITE_READONLY, .SQLITE_PROTOCOL, .SQLITE_INTERRUPT].contains(e.resultCode)
    }

    /// The errno a program is answered: ENOSPC for a full disk, EIO for anything else.
    public var errno: Int32 { noSpace ? ENOSPC : EIO }

    public var description: String { message }

    static func nearlyFull(_ directory: String) -> Bool {
        var sv = statvfs()
        guard statvfs(directory, &sv) == 0 else { return false }
        return UInt64(sv.f_bavail) &* UInt64(sv.f_frsize) < 64 << 10
    }
}
