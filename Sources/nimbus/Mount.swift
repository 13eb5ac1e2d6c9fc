import ArgumentParser
import Foundation
import NimbusProtocol
import NimbusRemote

/// `nimbus mount MOUNTPOINT --state DIR [--server URL --container NAME [--token-file FILE]]
/// [--foreground]` (docs/mount.md, docs/sync.md).
///
/// Without `--foreground` it starts itself again as a background daemon (new session, output
/// to `STATE/mount.log`) and returns once the mount answers, or fails with the daemon's error.
/// A mount left dead by a crashed daemon ("Transport endpoint is not connected") is cleared first.
struct Mount: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount a container folder (FUSE) and keep serving it in the background.")

    @Argument(help: "An empty directory to mount the container on.")
    var mountpoint: String

    @Option(help: "The client state directory (local database and content cache).")
    var state: String

    @Option(help: "Sync with this server (https://host[:port], or http://127.0.0.1:port on this machine). Without it the mount is local-only.")
    var server: String?

    @Option(name: .customLong("ca-file"), help: ArgumentHelp("Also trust the CA certificates in this PEM file for the server's certificate (besides the system's).", valueName: "FILE"))
    var caFile: String?

    @Flag(help: "Allow http:// to a server on another machine: the token and file contents cross the network in clear text.")
    var insecure = false

    @Option(help: "The server container to sync (created if new); needed with --server.")
    var container: String?

    @Option(help: "A file holding the device token (else $NIMBUS_TOKEN). Never put the token on the command line.")
    var tokenFile: String?

    @Option(help: "Keep at most this much file content on this device (e.g. 500M, 20G); least recently read, unpinned content is evicted. Default: no limit.")
    var cacheSize: String?

    @Option(help: "Seconds a read of content that is not here may wait for the server before failing with EIO.")
    var readTimeout: Double = 5

    @Option(help: "Upload a file kept open for writing after this many seconds without a write (0: only at close/fsync).")
    var quietPeriod: Double = 10

    @Option(help: "Seconds a presenter may take to answer before the sync engine goes on without it (docs/presenters.md).")
    var presenterTimeout: Double = 2

    @Flag(help: "Serve in this process until unmounted or interrupted (logs to stderr).")
    var foreground = false

    @Flag(help: .hidden)
    var daemonizeChild = false

    @Option(help: "Seconds to wait for the mount to become ready.")
    var timeout: Double = 30

    @Option(help: "How long the kernel caches names and attributes, in seconds (changes from other devices are invalidated at once).")
    var cacheTimeout: Double = 60

    func validate() throws {
        if server != nil && container == nil { throw ValidationError("--server needs --container NAME (the container to sync)") }
        let enrolled = FileManager.default.fileExists(atPath: DeviceLogin.path(URL(fileURLWithPath: state).standardizedFileURL.path))
        if server == nil && tokenFile != nil { throw ValidationError("--token-file needs --server URL") }
        if server == nil && container != nil && !enrolled {
            throw ValidationError("--container needs --server URL, or a state directory enrolled with `nimbus login`")
        }
        if server == nil && enrolled && container == nil {
            throw ValidationError("\(state) is enrolled with a server: give --container NAME (the container to sync)")
        }
        if let c = container, let problem = ContainerName.problem(c) { throw ValidationError("--container: \(problem)") }
        if server == nil && insecure { throw ValidationError("--insecure needs --server URL") }
        if let server {
            do { _ = try ServerAddress.check(server, insecure: insecure) } catch { throw ValidationError("--server: \(error)") }
        }
        if let caFile {
            do { _ = try ServerAddress.httpClient(caFile: caFile) } catch { throw ValidationError("--ca-file: \(error)") }
        }
        if let c = cacheSize, ByteSize.parse(c) == nil { throw ValidationError("--cache-size: '\(c)' is not a size (examples: 800M, 20G, 1T, 1048576)") }
        if !(1...600).contains(readTimeout) { throw ValidationError("--read-timeout: give 1 to 600 seconds") }
        if !(0...86400).contains(quietPeriod) { throw ValidationError("--quiet-period: give 0 to 86400 seconds") }
        if !(0.1...60).contains(presenterTimeout) { throw ValidationError("--presenter-timeout: give 0.1 to 60 seconds") }
    }

    /// The sync settings, with the token read now (so a bad token file fails before daemonizing).
    func remote() throws -> RemoteConfig? {
        if server == nil, let container, let (login, token) = try DeviceLogin.load(state: URL(fileURLWithPath: state).standardizedFileURL.path) {
            // Enrolled with `nimbus login`: the server, its trust and the token come from the state.
            return RemoteConfig(server: login.server, caFile: caFile ?? login.caFile, insecure: login.insecure,
                                container: container, token: token, tokenFile: DeviceLogin.tokenPath(URL(fileURLWithPath: state).standardizedFileURL.path),
                                cacheSize: cacheSize.flatMap(ByteSize.parse), readTimeout: readTimeout, quietPeriod: quietPeriod,
                                presenterTimeout: presenterTimeout)
        }
        guard let server, let container else { return nil }
        let token = try DeviceToken.read(tokenFile: tokenFile)
        return RemoteConfig(server: try ServerAddress.check(server, insecure: insecure),
                            caFile: caFile.map { URL(fileURLWithPath: $0).standardizedFileURL.path }, insecure: insecure,
                            container: container, token: token, tokenFile: tokenFile,
                            cacheSize: cacheSize.flatMap(ByteSize.parse), readTimeout: readTimeout, quietPeriod: quietPeriod,
                            presenterTimeout: presenterTimeout)
    }

    func run() throws {
        let mp = URL(fileURLWithPath: mountpoint).standardizedFileURL.path
        let stateDir = URL(fileURLWithPath: state).standardizedFileURL.path
        #if canImport(ContainerFS)
        try MountSupport.clearDeadMount(mp)
        if foreground {
            do {
                try MountDaemon(mountpoint: mp, state: stateDir, cacheTimeout: cacheTimeout, newSession: daemonizeChild,
                                remote: try remote()).serve()
            } catch let failure as CLIFailure where daemonizeChild {
                FileHandle.standardError.write(Data("nimbus: \(failure.message)\n".utf8))
                _exit(failure.status.rawValue)
            }
            // The daemon's end, with everything saved and closed (its log lines are written
            // unbuffered): `_exit`, not `exit`. libfuse's workers can end while printing to stderr
            // and leave stdio's lock held; exit's flush of stderr would then wait for ever.
            if daemonizeChild { _exit(0) }
        } else {
            try MountSupport.startDaemon(mountpoint: mp, state: stateDir, cacheTimeout: cacheTimeout, timeout: timeout,
                                         remote: try remote())
        }
        #else
        throw CLIFailure(.usage, "this nimbus was built without FUSE support")
        #endif
    }
}

/// `nimbus unmount MOUNTPOINT`: unmounts and waits for the daemon to finish writing its state.
struct Unmount: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Unmount a container folder.")

    @Argument(help: "The mountpoint.")
    var mountpoint: String

    @Flag(help: "Detach now even if the mount is busy (lazy unmount); it goes away when no longer used.")
    var lazy = false

    func run() throws {
        let mp = URL(fileURLWithPath: mountpoint).standardizedFileURL.path
        #if canImport(ContainerFS)
        try MountSupport.unmount(mp, lazy: lazy)
        #else
        throw CLIFailure(.usage, "this nimbus was built without FUSE support")
        #endif
    }
}

/// What `--server/--container/--token-file` (or NIMBUS_TOKEN) asked for.
struct RemoteConfig {
    var server: String
    var caFile: String?
    var insecure: Bool
    var container: String
    var token: String
    var tokenFile: String?
    var cacheSize: Int64?
    var readTimeout: Double
    var quietPeriod: Double
    var presenterTimeout: Double

    /// Arguments for the daemon child; the token itself travels in the environment, never argv.
    var arguments: [String] {
        ["--server", server, "--container", container] + (tokenFile.map { ["--token-file", $0] } ?? [])
            + (caFile.map { ["--ca-file", $0] } ?? []) + (insecure ? ["--insecure"] : [])
            + (cacheSize.map { ["--cache-size", "\($0)"] } ?? [])
            + ["--read-timeout", "\(readTimeout)", "--quiet-period", "\(quietPeriod)", "--presenter-timeout", "\(presenterTimeout)"]
    }
}

/// Sizes on the command line: a number of bytes with an optional K/M/G/T suffix (powers of
/// 1024, an optional trailing B or iB).
enum ByteSize {
    static func parse(_ text: String) -> Int64? {
        var t = text.trimmingCharacters(in: .whitespaces).uppercased()
        for suffix in ["IB", "B"] where t.hasSuffix(suffix) && t.count > suffix.count { t.removeLast(suffix.count); break }
        var shift: Int64 = 0
        if let last = t.last, let i = "KMGT".firstIndex(of: last) {
            shift = Int64("KMGT".distance(from: "KMGT".startIndex, to: i) + 1) * 10
            t.removeLast()
        }
        guard let v = Double(t), v >= 0, v.isFinite else { return nil }
        let bytes = v * Double(Int64(1) << shift)
        guard bytes < 9e18 else { return nil }
        return Int64(bytes)
    }
}

/// A device token as read from a file or the environment: its first line, trimmed. What is not a
/// token is refused before mounting, with a message that never shows the text itself.
enum DeviceToken {
    /// The token from `--token-file`, else from `NIMBUS_TOKEN`; a clear error when neither has one.
    static func read(tokenFile: String?) throws -> String {
        if let tokenFile {
            guard let text = try? String(contentsOfFile: tokenFile, encoding: .utf8) else {
                throw CLIFailure(.usage, "cannot read the token file \(tokenFile)")
            }
            return try parse(text, from: "the token file \(tokenFile)")
        }
        if let env = ProcessInfo.processInfo.environment["NIMBUS_TOKEN"] { return try parse(env, from: "NIMBUS_TOKEN") }
        throw CLIFailure(.usage, "--server needs a device token: --token-file FILE or NIMBUS_TOKEN (nimbus admin add-device prints one)")
    }

    static func parse(_ text: String, from source: String) throws -> String {
        let first = text.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        let token = first.trimmingCharacters(in: .whitespacesAndNewlines)
        if token.isEmpty { throw CLIFailure(.usage, "the first line of \(source) is empty; it must hold the device token (nimbus admin add-device prints one)") }
        guard token.utf8.count <= 4096, token.utf8.allSatisfy({ (0x21...0x7e).contains($0) }) else {
            throw CLIFailure(.usage, "the first line of \(source) is not a device token (tokens are one word of printable ASCII, like nim_…); put only the token there")
        }
        return token
    }
}
