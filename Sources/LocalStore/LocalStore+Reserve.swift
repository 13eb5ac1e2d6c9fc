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

    func makeReserve() {
        let fd = Glibc.open(reservePath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        defer { Glibc.close(fd) }
        var st = stat()
        if fstat(fd, &st) == 0, Int64(st.st_blocks) * 512 >= spaceReserve { reserveHeld = true; return }
        if posix_fallocate(fd, 0, off_t(spaceReserve)) == 0 { reserveHeld = true } else { unlink(reservePath) }
    }
}
