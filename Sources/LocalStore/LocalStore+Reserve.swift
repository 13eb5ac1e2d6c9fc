import Foundation
import Glibc
import NimbusLog

// The space reserve (LocalStore's header): a preallocated file deleted when the disk is full so
// the pending commit can go through, made again when there is room. Called with writeOrder held
// (or from init, before the writer thread starts).
extension LocalStore {
    var reservePath: String { directory.path + "/space-reserve" }

    /// Deletes the reserve; true when there was one (space was freed).
    func releaseReserve() -> Bool {
        guard reserveHeld else { return false }
        reserveHeld = false
        unlink(reservePath)
        LogLine.write("nimbus store", "the disk of the local state is full; its space reserve is released", level: .warning)
        return true
    }

    /// Makes the reserve when it is missing and twice its size is free.
    func remakeReserveIfRoom() {
        guard !reserveHeld, spaceReserve > 0 else { return }
        var sv = statvfs()
        guard statvfs(directory.path, &sv) == 0,
              Int64(sv.f_bavail).multipliedReportingOverflow(by: Int64(sv.f_frsize)).partialValue >= 2 * spaceReserve else { return }
        makeReserve()
    }

    /// Bytes free on the state disk for unprivileged writes.
    public var freeBytes: Int64 {
        var sv = statvfs()
        guard statvfs(directory.path, &sv) == 0 else { return Int64.max }
        return Int64(sv.f_bavail).multipliedReportingOverflow(by: Int64(sv.f_frsize)).partialValue
    }

    /// What downloads leave free on the state disk: the space reserve twice (so it can be made
    /// again), for the local state's own writes. Downloaded content never takes it.
    public var keptForState: Int64 { 2 * spaceReserve }

    /// Whether `bytes` more of downloaded content fit on the state disk, leaving `keptForState`
    /// free. A download that does not fit is refused before a byte of it is written, and says
    /// so as `store-error` until one fits again.
    /// Downloads run side by side: the bytes of those under way count as taken until
    /// `downloadEnded(_:)` gives them back.
    public func roomForDownload(_ bytes: Int64, of what: String) -> Bool {
        let free = freeBytes
        return queueLock.withLock {
            let left = free - downloadsUnderWay - keptForState
            let fits = left >= 0 && left >= bytes
            downloadSpace = fits ? nil : Self.noRoomMessage(what, bytes: bytes, free: free - downloadsUnderWay, kept: keptForState)
            if fits { downloadsUnderWay += bytes }
            return fits
        }
    }

    /// A download `roomForDownload` let through ended (written, or failed).
    public func downloadEnded(_ bytes: Int64) {
        queueLock.withLock { downloadsUnderWay -= bytes }
    }

    /// The refusal of a download that does not fit: what happened and what to do.
    public static func noRoomMessage(_ what: String, bytes: Int64, free: Int64, kept: Int64) -> String {
        "no room on the disk of the local state to download \(what): \(bytes) bytes needed, \(max(0, free)) free of which \(kept) are kept for the local state; free space on that disk, or evict downloaded files (nimbus evict PATH)"
    }

    /// A download failed for lack of space while writing (the disk filled meanwhile): says so
    /// like `roomForDownload`, and makes the space reserve again when the failed bytes freed room.
    public func downloadFoundNoRoom(_ message: String) {
        queueLock.withLock { downloadSpace = message }
        writeOrder.lock()
        remakeReserveIfRoom()
        writeOrder.unlock()
    }

    func makeReserve() {
        let fd = Glibc.open(reservePath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        defer { Glibc.close(fd) }
        var st = stat()
        if fstat(fd, &st) == 0, Int64(st.st_blocks) * 512 >= spaceReserve { reserveHeld = true; return }
        if posix_fallocate(fd, 0, off_t(spaceReserve)) == 0 { reserveHeld = true } else { unlink(reservePath) }
    }
}
