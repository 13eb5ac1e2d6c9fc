import Glibc

/// Reads a file of /proc whole. Its size in `stat` is 0 and the kernel hands it out a page at a
/// time, so a reader that trusts the size or reads once gets at most the first 4 KiB: with a few
/// dozen mounts, `/proc/self/mountinfo` is longer than that, and a mount listed past it would not
/// be found.
enum ProcFile {
    /// The bytes, or nil when the file cannot be opened or read.
    static func bytes(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buf.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return nil
            }
            if n == 0 { return out }
            out.append(contentsOf: buf[0..<n])
        }
    }

    /// The text (UTF-8; invalid bytes replaced), or nil.
    static func text(_ path: String) -> String? {
        bytes(path).map { String(decoding: $0, as: UTF8.self) }
    }
}
