import Foundation
import Synchronization

/// Random (version 4) UUIDs read from `/dev/urandom` a page at a time (one descriptor, kept open). Foundation's
/// `UUID()` opens, reads and closes `/dev/urandom` for each one: three system calls on every
/// file a program creates in the mount.
public enum FastUUID {
    private struct Pool: ~Copyable {
        var bytes = [UInt8](repeating: 0, count: 4096)
        var used = 4096
        var fd: Int32 = -1
    }
    private static let pool = Mutex(Pool())

    public static func make() -> UUID {
        let b: [UInt8] = pool.withLock { p in
            if p.used + 16 > p.bytes.count {
                if p.fd < 0 { p.fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC) }
                let fd = p.fd
                let filled = fd >= 0 && p.bytes.withUnsafeMutableBytes { buf -> Bool in
                    var off = 0
                    while off < buf.count {
                        let n = read(fd, buf.baseAddress! + off, buf.count - off)
                        if n < 0 && errno == EINTR { continue }
                        if n <= 0 { return false }
                        off += n
                    }
                    return true
                }
                // No /dev/urandom to read (a closed descriptor table): Foundation's own.
                guard filled else { return withUnsafeBytes(of: UUID().uuid) { Array($0) } }
                p.used = 0
            }
            defer { p.used += 16 }
            return Array(p.bytes[p.used..<p.used + 16])
        }
        return UUID(uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6] & 0x0F | 0x40, b[7],
                           b[8] & 0x3F | 0x80, b[9], b[10], b[11], b[12], b[13], b[14], b[15]))
    }
}
