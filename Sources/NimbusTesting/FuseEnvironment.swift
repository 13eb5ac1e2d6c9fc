import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Whether real mounts can work here; tests that mount skip with `problem` as the reason.
public enum FuseEnvironment {
    /// Why mounting cannot work here, or nil.
    public static let problem: String? = {
        if access("/dev/fuse", R_OK | W_OK) != 0 { return "/dev/fuse is not usable here (\(String(cString: strerror(errno))))" }
        if !FileManager.default.isExecutableFile(atPath: "/usr/bin/fusermount3") && !FileManager.default.isExecutableFile(atPath: "/bin/fusermount3") {
            return "fusermount3 is not installed (apt-get install fuse3)"
        }
        return nil
    }()
    public static var usable: Bool { problem == nil }
}
