import ArgumentParser
import Foundation
import NimbusProtocol
import NimbusRemote

/// What `nimbus login` keeps in a state directory: the server, how to trust it, and (in
/// `STATE/token`, mode 600) the device's token. `nimbus mount --state DIR` and `nimbus device`
/// use it when no `--server` is given.
struct DeviceLogin: Codable {
    var server: String
    var caFile: String?
    var insecure: Bool
    var account: String
    var device: String

    static func path(_ state: String) -> String { state + "/login.json" }
    static func tokenPath(_ state: String) -> String { state + "/token" }

    static func load(state: String) throws -> (DeviceLogin, token: String)? {
        guard FileManager.default.fileExists(atPath: path(state)) else { return nil }
        guard let data = FileManager.default.contents(atPath: path(state)),
              let login = try? JSONDecoder().decode(DeviceLogin.self, from: data) else {
            throw CLIFailure(.usage, "\(path(state)) is damaged; run `nimbus login` again")
        }
        guard let text = try? String(contentsOfFile: tokenPath(state), encoding: .utf8) else {
            throw CLIFailure(.usage, "cannot read \(tokenPath(state)); run `nimbus login` again")
        }
        return (login, try DeviceToken.parse(text, from: tokenPath(state)))
    }

    /// Makes the state directory (0700) and checks that a file can be written and synced in it,
    /// so a pairing code is never spent on a token that cannot be stored.
    static func prepare(state: String) throws {
        func refuse(_ why: String) -> CLIFailure {
            CLIFailure(.storage, "cannot use \(state) as the state directory: \(why); choose a --state directory you can write (nothing was sent to the server; the pairing code is still good)")
        }
        var st = stat()
        if stat(state, &st) == 0, st.st_mode & S_IFMT != S_IFDIR { throw refuse("it is not a directory") }
        // Each missing directory on the way, with what the system said if one cannot be made.
        var path = ""
        for part in state.split(separator: "/", omittingEmptySubsequences: true) {
            path += "/" + part
            if mkdir(path, 0o700) != 0, errno != EEXIST { throw refuse("cannot create \(path): \(String(cString: strerror(errno)))") }
        }
        chmod(state, 0o700)
        let probe = state + "/.login-probe"
        unlink(probe)
        let fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw refuse(String(cString: strerror(errno))) }
        let ok = write(fd, "x", 1) == 1 && fsync(fd) == 0
        let err = errno
        close(fd)
        unlink(probe)
        guard ok else { throw refuse(String(cString: strerror(err))) }
    }

    /// Writes the token (0600, never readable by others) and then the login.
    func save(state: String, token: String) throws {
        try Self.prepare(state: state)
        for (p, data) in [(Self.tokenPath(state), Data((token + "\n").utf8)), (Self.path(state), try JSONEncoder().encode(self))] {
            let tmp = p + ".tmp"
            let fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw CLIFailure(.storage, "cannot write \(tmp): \(String(cString: strerror(errno)))") }
            let ok = data.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) == $0.count } && fsync(fd) == 0
            close(fd)
            guard ok, rename(tmp, p) == 0 else { throw CLIFailure(.storage, "cannot write \(p): \(String(cString: strerror(errno)))") }
        }
    }
}

/// How a command reaches the server as this device: `--state DIR` (after `nimbus login`),
/// `--server URL --token-file FILE` (a token from `nimbus admin add-device`), or as the device of
/// a mount: `--mount PATH`, or none of these when run inside a mount.
struct DeviceOptions: ParsableArguments {
    @Option(help: "The device's state directory (after `nimbus login`).")
    var state: String?

    @Option(help: "Act as the device of the Nimbus mount this path is in (the default inside a mount).")
    var mount: String?

    @Option(help: "The server (https://host[:port]); with --token-file, instead of --state.")
    var server: String?

    @Option(help: "A file holding this device's token (else $NIMBUS_TOKEN); with --server.")
    var tokenFile: String?

    @Option(name: .customLong("ca-file"), help: ArgumentHelp("Also trust the CA certificates in this PEM file.", valueName: "FILE"))
    var caFile: String?

    @Flag(help: "Allow http:// to a server on another machine.")
    var insecure = false

    func client() throws -> NimbusClient {
        if let server {
            let url: String
            // The same refusal, and exit code, as `nimbus mount` (a validation failure, 64).
            do { url = try ServerAddress.check(server, insecure: insecure) } catch { throw ValidationError("--server: \(error)") }
            let token = try DeviceToken.read(tokenFile: tokenFile)
            return NimbusClient(baseURL: url, token: token, http: try http(caFile))
        }
        if state == nil, mount != nil || (try? MountSurface.root(of: FileManager.default.currentDirectoryPath)) != nil {
            let d = try MountIdentity.device(mountedAt: mount ?? FileManager.default.currentDirectoryPath)
            return NimbusClient(baseURL: d.server, token: d.token, http: try http(caFile ?? d.caFile))
        }
        guard let state else { throw CLIFailure(.usage, "say which device: run it inside a Nimbus mount, or give --mount PATH, --state DIR (after `nimbus login`) or --server URL --token-file FILE") }
        guard let (login, token) = try DeviceLogin.load(state: state) else {
            throw CLIFailure(.usage, "\(state) has no login; run `nimbus login URL --code CODE --state \(state)` first, or give --server and --token-file")
        }
        return NimbusClient(baseURL: login.server, token: token, http: try http(caFile ?? login.caFile))
    }

    func http(_ caFile: String?) throws -> ServerAddress.HTTPClientType {
        do { return try ServerAddress.httpClient(caFile: caFile, retryConnects: false) } catch { throw ValidationError("--ca-file: \(error)") }
    }
}

/// Runs `body` and maps the server's answers to the CLI's exit codes and messages.
func talk<T>(_ body: () async throws -> T) async throws -> T {
    do { return try await body() } catch let e as RemoteError {
        switch e {
        case .transport: throw CLIFailure(.network, "\(e)")
        // A certificate this device does not trust is a setting to fix, as for `nimbus mount`.
        case .certificate, .server, .unexpected: throw CLIFailure(.usage, "\(e)")
        }
    }
}

struct Login: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Enroll this machine with a pairing code from an enrolled device (`nimbus device add NAME` there).",
        discussion: "Stores the new device's token in STATE/token (mode 600) and the server in STATE/login.json; then `nimbus mount MOUNTPOINT --state STATE --container NAME` syncs without --server.")

    @Argument(help: "The server, https://host[:port] (http:// only to this machine, or with --insecure).")
    var server: String

    @Option(help: "The pairing code (XXXX-XXXX-XXXX; works once, for 10 minutes).")
    var code: String

    @Option(help: "The state directory of this device (created if missing).")
    var state: String

    @Option(help: "Name this device (default: the name given to `nimbus device add`).")
    var device: String?

    @Option(name: .customLong("ca-file"), help: ArgumentHelp("Also trust the CA certificates in this PEM file.", valueName: "FILE"))
    var caFile: String?

    @Flag(help: "Allow http:// to a server on another machine: the token and file contents cross the network in clear text.")
    var insecure = false

    func validate() throws {
        do { _ = try ServerAddress.check(server, insecure: insecure) } catch { throw ValidationError("\(error)") }
        if PairingLimits.normalize(code) == nil { throw ValidationError("--code: \(code.debugDescription) is not a pairing code (12 letters and digits, XXXX-XXXX-XXXX)") }
        if let device, let p = DeviceNames.problem(device) { throw ValidationError("--device: \(p)") }
    }

    func run() async throws {
        let state = URL(fileURLWithPath: self.state).standardizedFileURL.path
        let url = try ServerAddress.check(server, insecure: insecure)
        let ca = caFile.map { URL(fileURLWithPath: $0).standardizedFileURL.path }
        let http: ServerAddress.HTTPClientType
        do { http = try ServerAddress.httpClient(caFile: ca, retryConnects: false) } catch { throw ValidationError("--ca-file: \(error)") }
        var again = false
        if let (enrolled, token) = try DeviceLogin.load(state: state) {
            // Enrolled already: only a device whose token the server refuses (revoked) enrolls
            // again in place, keeping its state (the queued changes upload with the new token).
            guard enrolled.server == url else {
                throw CLIFailure(.usage, "\(state) is enrolled with \(enrolled.server), not \(url); a state directory syncs one server: use another --state directory")
            }
            do {
                let me = try await NimbusClient(baseURL: url, token: token, http: http).whoami()
                throw CLIFailure(.usage, "\(state) is enrolled as device \(me.deviceName) of account \(me.account) and its token works; nothing to do (use another --state directory for another device)")
            } catch let e as RemoteError where e.code == .unauthorized {
                again = true
            } catch let e as RemoteError {
                throw CLIFailure(.network, "cannot check whether the device enrolled in \(state) still works: \(e); try again when \(url) answers")
            }
        }
        try DeviceLogin.prepare(state: state)
        let anonymous = NimbusClient(baseURL: url, token: "", http: http)
        let r = try await talk { try await anonymous.pair(code: code, device: device) }
        do {
            try DeviceLogin(server: url, caFile: ca, insecure: insecure, account: r.account, device: r.device).save(state: state, token: r.token)
        } catch {
            // Enrolled, but the token could not be kept (the disk filled since the check): it is
            // shown once so the device is not lost; it works like one from `nimbus admin add-device`.
            print(r.token)
            throw CLIFailure(.storage, "enrolled as device \(r.device) of account \(r.account), but its token could not be stored: \(error). The token is printed above: save it in a file (mode 600) and mount with --server \(url) --token-file FILE, or revoke the device (`nimbus device revoke \(r.device)` from another device) and log in again with a new code")
        }
        print("enrolled\(again ? " again" : "") as device \(r.device) of account \(r.account) on \(url)")
        if again {
            print("its queued changes upload once it is mounted again: nimbus mount MOUNTPOINT --state \(state) --container NAME")
        } else {
            print("mount with: nimbus mount MOUNTPOINT --state \(state) --container NAME")
        }
    }
}

struct Device: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Enroll, list and revoke the devices of this account from any of its devices.",
        subcommands: [Add.self, List.self, Revoke.self])

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print a one-time pairing code for a new device (valid 10 minutes, works once).")
        @Argument(help: "The new device's name.") var name: String
        @OptionGroup var options: DeviceOptions

        func validate() throws {
            if let p = DeviceNames.problem(name) { throw ValidationError("device name: \(p)") }
        }

        func run() async throws {
            let client = try options.client()
            let c = try await talk { try await client.pairingCode(device: name) }
            let until = ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: TimeInterval(c.expires)))
            print(c.code)
            FileHandle.standardError.write(Data("""
                nimbus: pairing code for device \(c.device), valid until \(until) and once. On the new machine:
                  nimbus login \(client.baseURL) --code \(c.code) --state ~/.nimbus/device
                  nimbus mount ~/Nimbus --state ~/.nimbus/device --container NAME

                """.utf8))
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "The devices of this account, when added, whether revoked.")
        @OptionGroup var options: DeviceOptions

        func run() async throws {
            let client = try options.client()
            let all = try await talk { try await client.devices() }
            let f = ISO8601DateFormatter()
            for d in all {
                let when = f.string(from: Date(timeIntervalSince1970: TimeInterval(d.created)))
                let revoked = d.revoked.map { " revoked " + f.string(from: Date(timeIntervalSince1970: TimeInterval($0))) } ?? ""
                print("\(d.id) \(d.name.debugDescription) added \(when)\(revoked)")
            }
        }
    }

    struct Revoke: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Cut a device off: its token stops working within a second on every server instance.")
        @Argument(help: "The device's name or id (`nimbus device list`).") var device: String
        @OptionGroup var options: DeviceOptions

        func run() async throws {
            let client = try options.client()
            let d = try await talk { try await client.revokeDevice(device) }
            print("revoked \(d.name) (\(d.id))")
        }
    }
}
