import Foundation

/// How `nimbus device …` run inside a mount (or with `--mount PATH`) reaches the server as that
/// mount's device: the daemon records in `STATE/mount.json` (mode 600) which server it syncs with,
/// how it trusts it and where its token file is — never the token itself. A state directory made
/// by `nimbus login` has `login.json` and `token` already.
struct MountIdentity: Codable {
    var server: String
    var caFile: String?
    var insecure: Bool
    /// The token file the mount was given (nil: the token came in NIMBUS_TOKEN, kept nowhere).
    var tokenFile: String?

    static func path(_ state: String) -> String { state + "/mount.json" }

    /// Written by the daemon when it starts syncing (replacing the last one).
    func save(state: String) throws {
        let p = Self.path(state), tmp = p + ".tmp"
        let data = try JSONEncoder().encode(self)
        let fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw CLIFailure(.storage, "cannot write \(tmp): \(String(cString: strerror(errno)))") }
        let ok = data.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) == $0.count }
        close(fd)
        guard ok, rename(tmp, p) == 0 else { throw CLIFailure(.storage, "cannot write \(p): \(String(cString: strerror(errno)))") }
    }

    /// The server, its trust and the token of the mount that `path` is in. Only a Nimbus mount
    /// this user made is believed (the kernel's mount table says who mounted it): a folder that
    /// merely holds a `.nimbus/status` could otherwise send this user's token to a server of
    /// another user's choosing.
    static func device(mountedAt inside: String) throws -> (server: String, caFile: String?, insecure: Bool, token: String) {
        let root = try MountSurface.root(of: inside)
        guard let real = MountSurface.realPath(root), let owner = MountTable.nimbusMountOwner(at: real) else {
            throw CLIFailure(.usage, "\(root) is not a Nimbus mount (the mount table has no Nimbus file system there); give --state DIR or --server URL --token-file FILE")
        }
        guard owner == getuid() || getuid() == 0 else {
            throw CLIFailure(.usage, "the Nimbus mount at \(root) is another user's (uid \(owner)); only its owner acts as its device")
        }
        let status = Dictionary(try MountSurface.statusFile(root), uniquingKeysWith: { a, _ in a })
        guard let state = status["state-dir"], !state.isEmpty else {
            throw CLIFailure(.storage, "\(root)/.nimbus/status does not say its state directory (is the mount alive?)")
        }
        if let (login, token) = try DeviceLogin.load(state: state) {
            return (login.server, login.caFile, login.insecure, token)
        }
        guard let data = FileManager.default.contents(atPath: path(state)),
              let id = try? JSONDecoder().decode(MountIdentity.self, from: data) else {
            throw CLIFailure(.usage, "the mount at \(root) keeps no device of a server (a local-only mount, or one started before this version: mount it again); give --state DIR or --server URL --token-file FILE")
        }
        guard let tokenFile = id.tokenFile else {
            throw CLIFailure(.usage, "the mount at \(root) got its token from NIMBUS_TOKEN, which is kept nowhere; give --server \(id.server) --token-file FILE")
        }
        return (id.server, id.caFile, id.insecure, try DeviceToken.read(tokenFile: tokenFile))
    }
}

/// The kernel's mount table (`/proc/self/mountinfo`).
enum MountTable {
    /// The uid that mounted the Nimbus file system whose mount point is `real` (FUSE's `user_id`),
    /// or nil when no Nimbus file system is mounted there.
    static func nimbusMountOwner(at real: String) -> uid_t? {
        guard let text = ProcFile.text("/proc/self/mountinfo") else { return nil }
        var owner: uid_t?
        for line in text.split(separator: "\n") {
            // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL…] - FSTYPE SOURCE SUPER-OPTIONS
            let fields = line.split(separator: " ", omittingEmptySubsequences: false)
            guard fields.count >= 10, let dash = fields.firstIndex(of: "-"), dash + 3 < fields.count else { continue }
            guard unescape(fields[4]) == real, fields[dash + 1] == "fuse.nimbus" else { continue }
            let uid = fields[dash + 3].split(separator: ",").first { $0.hasPrefix("user_id=") }.flatMap { uid_t($0.dropFirst(8)) }
            owner = uid  // the last mount at a point is the one seen there
        }
        return owner
    }

    /// A mountinfo path: spaces, tabs, newlines and backslashes come as `\ooo`.
    static func unescape(_ s: Substring) -> String {
        var bytes: [UInt8] = []
        var u = Array(s.utf8)[...]
        while let b = u.first {
            if b == UInt8(ascii: "\\"), u.count >= 4, let v = UInt8(String(decoding: u.dropFirst().prefix(3), as: UTF8.self), radix: 8) {
                bytes.append(v)
                u = u.dropFirst(4)
            } else {
                bytes.append(b)
                u = u.dropFirst()
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
