import Foundation
import Glibc
import NimbusServer
import NimbusTesting
import Testing

// Two (or more) real mounts of one container on one `nimbus serve`, every process the built
// binary (FUSE-NOTES: never read a mount served from this process's task pool). `cleanup()`
// unmounts everything — lazily if busy — and stops the server, also when a test fails.

typealias SyncEnv = FuseEnvironment

struct ShellFailed: Error, CustomStringConvertible { let description: String }

/// Runs `/bin/sh -c script`; returns (status, stdout+stderr).
func shStatus(_ script: String) -> (Int32, String) {
    shellStatus(script)
}

@discardableResult
func sh(_ script: String) throws -> String {
    let (status, out) = shStatus(script)
    if status != 0 { throw ShellFailed(description: "exit \(status): \(script)\n\(out)") }
    return out
}

func q(_ s: String) -> String { "'" + s.replacingOccurrences(of: "'", with: "'\\''") + "'" }

/// Where the server of a SyncWorld keeps its data.
enum SyncBackend: String, Sendable, CustomTestStringConvertible {
    /// One `nimbus serve` with its embedded SQLite database and chunk directory (the default).
    case embedded
    /// Two `nimbus serve` instances on one fresh PostgreSQL database and one S3 bucket (moto);
    /// device A talks to instance 1, device B to instance 2 (docs/deploy.md "scaled").
    case postgresS3
    /// One embedded `nimbus serve` on HTTPS (`--tls-cert/--tls-key`, a CA made for the world
    /// with openssl); every device mounts with `--ca-file` (docs/deploy.md "HTTPS").
    case tls
    /// One embedded `nimbus serve` on 127.0.0.1 behind nginx terminating TLS, configured by
    /// dist/nginx/nimbus.conf as docs/deploy.md recommends; devices talk to nginx only.
    case nginx

    var testDescription: String { rawValue }

    /// The backends this run can test: PostgreSQL + S3 only when scripts/test started them
    /// (otherwise a loud SKIPPING line, from `available`).
    static var all: [SyncBackend] {
        PostgresScratch.available && S3Scratch.available ? [.embedded, .postgresS3] : [.embedded]
    }
}

final class SyncWorld: @unchecked Sendable {
    // @unchecked: used by one test at a time.
    let base: String
    let backend: SyncBackend
    /// The instances; device number i talks to `servers[i % count]`.
    private(set) var servers: [ServerProcess] = []
    /// The first instance (the only one on the embedded backend).
    var server: ServerProcess { servers[0] }
    private var mountpoints: [String] = []
    /// device name → index of its instance.
    private var instanceOf: [String: Int] = [:]
    private var database: PostgresLocation?
    private var bucket: S3ChunkStore?
    private var storageArgs: [String] = []
    /// `--tls-cert/--tls-key` of the `.tls` backend.
    private var tlsArgs: [String] = []
    /// The CA devices trust on the `.tls` backend.
    private var caFile: String?
    /// Extra `nimbus mount` options per device.
    private var mountOptions: [String: [String]] = [:]

    /// Starts the server(s). On `.postgresS3` a fresh database and bucket, removed by `dropStorage()`
    /// (`SyncWorld.run` calls it).
    /// `serve`: extra `nimbus serve` options (embedded backend).
    init(_ label: String, backend: SyncBackend = .embedded, serve: [String] = []) async throws {
        self.backend = backend
        base = try sh("mktemp -d /tmp/nimbus-sync-\(label)-XXXXXX").trimmingCharacters(in: .whitespacesAndNewlines)
        do {
            switch backend {
            case .embedded:
                servers = [ServerProcess(dataDir: base + "/server", extraArgs: serve)]
            case .tls, .nginx:
                let tls = base + "/tls"
                try sh("""
                    mkdir -p \(q(tls)) && cd \(q(tls)) && \
                    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem -days 2 -subj '/CN=Nimbus Test CA' 2>&1 && \
                    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout server.key -out server.csr -subj '/CN=127.0.0.1' 2>&1 && \
                    printf 'subjectAltName=IP:127.0.0.1\\n' > server.ext && \
                    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -set_serial 2 -days 2 -extfile server.ext -out server.pem 2>&1
                    """)
                caFile = tls + "/ca.pem"
                if backend == .tls { tlsArgs = ["--tls-cert", tls + "/server.pem", "--tls-key", tls + "/server.key"] }
                servers = [ServerProcess(dataDir: base + "/server", extraArgs: tlsArgs)]
            case .postgresS3:
                S3Scratch.exportEnvironment()
                let db = try await PostgresScratch.create()
                database = db
                let (store, url) = try await S3Scratch.makeBucket()
                bucket = store
                storageArgs = ["--database", PostgresScratch.url(of: db), "--chunks", url]
                servers = (0..<2).map { ServerProcess(dataDir: base + "/server-\($0)", extraArgs: storageArgs) }
            }
            for s in servers { try await s.start() }
            if backend == .nginx { try await startNginx() }
        } catch {
            cleanup()
            await dropStorage()
            throw error
        }
    }

    /// Runs `body` in a new world and always cleans up: mounts, servers, database and bucket.
    static func run(_ label: String, _ backend: SyncBackend = .embedded, serve: [String] = [],
                    _ body: (SyncWorld) async throws -> Void) async throws {
        let w = try await SyncWorld(label, backend: backend, serve: serve)
        do { try await body(w) } catch {
            w.printLogs()
            w.cleanup()
            await w.dropStorage()
            throw error
        }
        w.cleanup()
        await w.dropStorage()
    }

    /// Deletes the PostgreSQL database and the S3 bucket (servers must be stopped first).
    func dropStorage() async {
        if let database { try? await PostgresScratch.drop(database) }
        if let bucket { try? await bucket.deleteBucket() }
        database = nil
        bucket = nil
    }

    /// Starts the server(s) again on the same data and ports (they were stopped).
    func restartServer() async throws {
        var again: [ServerProcess] = []
        for (i, old) in servers.enumerated() {
            old.stop()
            let port = String(old.url.split(separator: ":").last ?? "0")
            let dir = backend == .postgresS3 ? base + "/server-\(i)" : base + "/server"
            again.append(ServerProcess(dataDir: dir, extraArgs: storageArgs + tlsArgs + ["--listen", "127.0.0.1:\(port)"]))
        }
        servers = again
        for s in servers { try await s.start() }
    }

    /// Stops every instance (the server is gone for the devices).
    func stopServer() { servers.forEach { $0.stop() } }

    /// The `nimbus admin` options naming this world's storage.
    private var adminStorage: [String] {
        backend == .postgresS3 ? Array(storageArgs.prefix(2)) : ["--data", base + "/server"]
    }

    /// Where devices connect when it is not the server itself (nginx in front).
    private var frontURL: String?
    private var nginx: Background?

    /// nginx with dist/nginx/nimbus.conf as it is, only its addresses, certificate and paths
    /// filled in, on a free port (tried until one binds).
    private func startNginx() async throws {
        let dir = base + "/nginx"
        let upstream = String(server.url.dropFirst("http://".count))
        var conf = try String(contentsOfFile: StartAtBootTests.unitDir + "/../nginx/nimbus.conf", encoding: .utf8)
        conf = conf.replacingOccurrences(of: "server 127.0.0.1:7070;", with: "server \(upstream);")
            .replacingOccurrences(of: "/etc/nimbus/fullchain.pem", with: base + "/tls/server.pem")
            .replacingOccurrences(of: "/etc/nimbus/privkey.pem", with: base + "/tls/server.key")
        for _ in 0..<10 {
            let port = Int.random(in: 20000...60000)
            try sh("mkdir -p \(q(dir))/tmp")
            try conf.replacingOccurrences(of: "listen 443 ssl;", with: "listen 127.0.0.1:\(port) ssl;")
                .write(toFile: dir + "/nimbus.conf", atomically: true, encoding: .utf8)
            try """
                user root;
                daemon off;
                worker_processes 1;
                pid \(dir)/nginx.pid;
                error_log \(dir)/error.log;
                events { worker_connections 512; }
                http {
                    access_log off;
                    client_body_temp_path \(dir)/tmp/body;
                    proxy_temp_path \(dir)/tmp/proxy;
                    fastcgi_temp_path \(dir)/tmp/fastcgi;
                    uwsgi_temp_path \(dir)/tmp/uwsgi;
                    scgi_temp_path \(dir)/tmp/scgi;
                    include \(dir)/nimbus.conf;
                }
                """.write(toFile: dir + "/nginx.conf", atomically: true, encoding: .utf8)
            let n = try Background("exec nginx -p \(q(dir)) -c \(q(dir + "/nginx.conf")) 2>&1")
            let url = "https://127.0.0.1:\(port)"
            for _ in 0..<100 {
                if !n.isRunning { break }
                if shStatus("curl -fsS --max-time 2 --cacert \(q(base + "/tls/ca.pem")) \(url)/healthz").0 == 0 {
                    nginx = n
                    frontURL = url
                    return
                }
                try await Task.sleep(for: .milliseconds(50))
            }
            n.stop()
        }
        throw ShellFailed(description: "nginx did not start: \((try? String(contentsOfFile: dir + "/error.log", encoding: .utf8)) ?? "")")
    }

    private func mountCommand(_ device: String) -> String {
        let url = frontURL ?? servers[instanceOf[device] ?? 0].url
        return "\(q(NimbusBinary.path)) mount \(q(base + "/\(device)")) --state \(q(base + "/\(device)-state")) --server \(url) --container docs --token-file \(q(base + "/\(device).token"))"
            + (caFile.map { " --ca-file \(q($0))" } ?? "")
            + (mountOptions[device] ?? []).map { " " + q($0) }.joined()
    }

    /// Mounts `device` again with its existing state and token.
    func remount(_ device: String) throws {
        try sh(mountCommand(device))
    }

    /// kill -9 of the daemon serving `mp`, then clears the dead mount.
    func crash(_ mp: String) throws {
        try sh("k=0; for p in $(pgrep -f -- --daemonize-child); do [ $p = $$ ] && continue; tr '\\0' ' ' < /proc/$p/cmdline | grep -qF -- \(q(mp + " ")) && kill -9 $p && k=1; done; [ $k = 1 ] || { echo no daemon for \(q(mp)); exit 1; }; sleep 0.3; fusermount3 -uz \(q(mp))")
    }

    /// Mounts the container `docs` as a new device named `device`; returns the mountpoint.
    func mount(_ device: String, options: [String] = []) async throws -> String {
        mountOptions[device] = options
        let r = try await NimbusBinary.run(["admin", "add-device"] + adminStorage + ["--account", "alice", "--device", device])
        guard r.status == 0 else { throw ShellFailed(description: "add-device failed: \(r.stderr)") }
        try r.stdout.write(toFile: base + "/\(device).token", atomically: true, encoding: .utf8)
        let mp = base + "/\(device)"
        try FileManager.default.createDirectory(atPath: mp, withIntermediateDirectories: true)
        instanceOf[device] = instanceOf.count % servers.count
        mountpoints.append(mp)
        try sh(mountCommand(device))
        return mp
    }

    /// Runs `nimbus admin ARGS` on this world's storage (`--data` or `--database` added).
    func admin(_ command: String, _ args: [String]) async throws -> String {
        let r = try await NimbusBinary.run(["admin", command] + adminStorage + args)
        guard r.status == 0 else { throw ShellFailed(description: "admin \(command) failed: \(r.stderr)") }
        return r.stdout
    }

    /// Gives `device` a new token (a new device of the account, same name) in its token file.
    func newToken(_ device: String) async throws {
        let token = try await admin("add-device", ["--account", "alice", "--device", device])
        try token.write(toFile: base + "/\(device).token", atomically: true, encoding: .utf8)
    }

    /// The servers' `nimbus_chunk_bytes_out_total` (downloads), summed over instances.
    func chunkBytesOut() throws -> Int64 { try metric("nimbus_chunk_bytes_out_total") }
    /// The servers' `nimbus_chunk_bytes_in_total` (uploads), summed over instances.
    func chunkBytesIn() throws -> Int64 { try metric("nimbus_chunk_bytes_in_total") }

    func metric(_ name: String) throws -> Int64 {
        var total: Int64 = 0
        for s in servers {
            let text = try sh("curl -s --max-time 5 \(caFile.map { "--cacert \(q($0)) " } ?? "")\(s.url)/metrics")
            for line in text.split(separator: "\n") where line.hasPrefix(name) {
                if let v = line.split(separator: " ").last.flatMap({ Double($0) }) { total += Int64(v) }
            }
        }
        return total
    }

    /// After a failure: the last lines of every device's daemon log, so a CI run that fails once
    /// says what the daemons did (the folder is removed by `cleanup`).
    func printLogs(lines: Int = 80) {
        for mp in mountpoints {
            let log = mp + "-state/mount.log"
            guard let text = try? String(contentsOfFile: log, encoding: .utf8) else { continue }
            let tail = text.split(separator: "\n", omittingEmptySubsequences: false).suffix(lines).joined(separator: "\n")
            print("--- last \(lines) lines of \(log) ---\n\(tail)\n--- end of \(log) ---")
        }
    }

    /// Unmounts every device (lazily if busy) and stops the servers; removes the temporary
    /// folder unless NIMBUS_KEEP_TEST_DIRS is set. Safe to call twice.
    func cleanup() {
        for mp in mountpoints {
            _ = shStatus("\(q(NimbusBinary.path)) unmount \(q(mp)) 2>/dev/null || fusermount3 -uz \(q(mp)) 2>/dev/null")
            if shStatus("grep -qF \(q(" " + mp + " ")) /proc/self/mountinfo").0 == 0 { _ = shStatus("fusermount3 -uz \(q(mp))") }
        }
        mountpoints = []
        nginx?.stop()
        nginx = nil
        stopServer()
        if ProcessInfo.processInfo.environment["NIMBUS_KEEP_TEST_DIRS"] == nil { _ = shStatus("rm -rf \(q(base))") }
    }
}

/// Polls `check` (a shell script) until it exits 0, at most `seconds`; fails with its output.
func eventually(_ what: String, seconds: Double = 15, _ check: String) async throws {
    let deadline = Date().addingTimeInterval(seconds)
    var last = ""
    while Date() < deadline {
        let (status, out) = shStatus(check)
        if status == 0 { return }
        last = out
        try await Task.sleep(for: .milliseconds(100))
    }
    Issue.record("\(what): not true within \(seconds) s (\(check)): \(last)")
    throw ShellFailed(description: what)
}
