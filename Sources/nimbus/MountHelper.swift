/// `mount -t fuse.nimbus CONTAINER MOUNTPOINT -o OPTIONS` and fstab lines (docs/install.md).
///
/// mount(8) hands a `fuse.nimbus` (or `fuse` with source `/usr/local/bin/nimbus#CONTAINER`) mount
/// to mount.fuse3, which runs `nimbus CONTAINER MOUNTPOINT -o OPTIONS` (as the `setuid=USER` user
/// if given). This turns that call into `nimbus mount`: the mount's own options are named as on
/// its command line (`state=DIR,server=URL,token-file=FILE,ca-file=FILE,cache-size=SIZE,
/// read-timeout=S,quiet-period=S,presenter-timeout=S,cache-timeout=S,insecure`), the generic ones
/// mount(8) passes along are accepted and left to FUSE's defaults, and anything else is refused
/// with its name. Without `server=` the mount is local-only (CONTAINER is then only a label).
enum MountHelper {
    /// Generic mount options that mean nothing more to a nimbus mount (FUSE mounts are nodev and
    /// nosuid for users anyway; `_netdev`, `nofail`, `noauto` and `x-…` are mount(8)'s and
    /// systemd's, usually removed before the helper runs).
    static let generic: Set<String> = ["rw", "dev", "nodev", "suid", "nosuid", "exec", "noexec", "atime", "noatime",
                                       "relatime", "norelatime", "strictatime", "nodiratime", "diratime", "async",
                                       "auto", "noauto", "user", "nouser", "users", "owner", "group", "defaults",
                                       "_netdev", "nofail", "silent", "loud"]
    static let valued: Set<String> = ["state", "server", "token-file", "ca-file", "cache-size", "read-timeout",
                                      "quiet-period", "presenter-timeout", "cache-timeout"]

    struct Refused: Error, CustomStringConvertible { let description: String }

    /// The `nimbus mount` arguments for a helper call, nil when `args` (without the program
    /// name) is not one: `SOURCE /MOUNTPOINT` followed by `-o OPTIONS` (and flags such as -n).
    static func arguments(_ args: [String], commands: Set<String>) throws -> [String]? {
        guard args.count >= 3, !args[0].hasPrefix("-"), !commands.contains(args[0]), args[1].hasPrefix("/"),
              args.dropFirst(2).contains("-o") else { return nil }
        let source = args[0], mountpoint = args[1]
        var options: [String] = []
        var i = 2
        while i < args.count {
            if args[i] == "-o", i + 1 < args.count {
                options += args[i + 1].split(separator: ",").map(String.init)
                i += 2
            } else if ["-n", "-s", "-v", "-f"].contains(args[i]) {
                i += 1  // mount(8)'s no-mtab, sloppy, verbose and fake flags
            } else {
                throw Refused(description: "unexpected \(args[i]) in a mount helper call (nimbus CONTAINER MOUNTPOINT -o OPTIONS)")
            }
        }
        var out = ["mount", mountpoint]
        var server = false, state = false
        for o in options where !o.isEmpty {
            let parts = o.split(separator: "=", maxSplits: 1).map(String.init)
            let name = parts[0]
            if parts.count == 2, valued.contains(name) {
                out += ["--\(name)", parts[1]]
                if name == "server" { server = true }
                if name == "state" { state = true }
            } else if parts.count == 1, name == "insecure" {
                out.append("--insecure")
            } else if parts.count == 1, generic.contains(name) || name.hasPrefix("x-") {
                continue
            } else if name == "ro" {
                throw Refused(description: "option ro: a nimbus mount is read-write (files sync both ways)")
            } else if name.hasPrefix("x-") || name == "comment" {
                continue
            } else {
                throw Refused(description: "unknown mount option \(o.debugDescription) (known: \(valued.sorted().map { $0 + "=" }.joined(separator: ", ")), insecure, and the generic ones)")
            }
        }
        guard state else { throw Refused(description: "the mount needs state=DIR (the device's state directory) in its options") }
        if server { out += ["--container", source] }
        return out
    }
}
