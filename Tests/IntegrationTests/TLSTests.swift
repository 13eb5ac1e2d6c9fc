import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// HTTPS end to end with a CA made for the test (openssl): `nimbus serve --tls-cert/--tls-key`,
/// devices that trust the CA through `--ca-file`, certificates refused with a message that says
/// what is wrong (untrusted CA, expired, another host), SIGHUP reloading the certificate, and
/// plain http to another machine refused before anything is sent.
@Suite(.serialized) struct TLSTests {
    /// A CA and certificates signed by it, in a temporary directory.
    final class PKI {
        let dir: String
        init() throws {
            dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-tls-\(UUID().uuidString)").path
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try run("""
                openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem -days 30 -subj '/CN=Nimbus Test CA'
                openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout other-ca.key -out other-ca.pem -days 30 -subj '/CN=Some Other CA'
                """)
        }
        deinit { try? FileManager.default.removeItem(atPath: dir) }

        func run(_ script: String) throws {
            let (status, out) = shellStatus("set -e\n" + script, cwd: dir)
            guard status == 0 else { throw FixtureError("openssl failed (\(status)): \(out)") }
        }

        /// `NAME.pem` and `NAME.key`: a server certificate for `names` (DNS:… or IP:…) signed by
        /// `ca`, valid for `days` (negative: already expired).
        @discardableResult
        func issue(_ name: String, cn: String = "127.0.0.1", names: String = "IP:127.0.0.1,DNS:localhost", ca: String = "ca", days: Int = 30) throws -> (cert: String, key: String) {
            try run("""
                openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout \(name).key -out \(name).csr -subj '/CN=\(cn)'
                printf 'subjectAltName=\(names)\\n' > \(name).ext
                openssl x509 -req -in \(name).csr -CA \(ca).pem -CAkey \(ca).key -set_serial \(UInt32.random(in: 2...UInt32.max)) -days \(days) -extfile \(name).ext -out \(name).pem
                """)
            return (dir + "/\(name).pem", dir + "/\(name).key")
        }

        var ca: String { dir + "/ca.pem" }
    }

    /// A server on HTTPS with a fresh account and device; returns the server and a device token.
    func httpsServer(_ pki: PKI, cert: (cert: String, key: String)) async throws -> (ServerProcess, String, String) {
        let data = pki.dir + "/data-\(UUID().uuidString.prefix(8))"
        let add = try await NimbusBinary.run(["admin", "add-device", "--data", data, "--account", "alice", "--device", "laptop"])
        #expect(add.status == 0, "add-device: \(add.stderr)")
        let server = ServerProcess(dataDir: data, extraArgs: ["--tls-cert", cert.cert, "--tls-key", cert.key])
        try await server.start()
        #expect(server.url.hasPrefix("https://127.0.0.1:"), "\(server.url)")
        return (server, add.stdout.trimmingCharacters(in: .whitespacesAndNewlines), data)
    }

    func transportError(_ body: () async throws -> Void) async -> String {
        do {
            try await body()
            return "no error"
        } catch let e as RemoteError {
            if case .certificate(let why) = e { return why }
            return "not a certificate error: \(e)"
        } catch {
            return "\(error)"
        }
    }

    @Test func aDeviceTrustingTheCAUsesTheServerAndOthersAreToldWhy() async throws {
        let pki = try PKI()
        let (server, token, _) = try await httpsServer(pki, cert: try pki.issue("server"))
        defer { server.stop() }

        let trusted = NimbusClient(baseURL: server.url, token: token, http: try ServerAddress.httpClient(caFile: pki.ca, retryConnects: false))
        let me = try await trusted.whoami()
        #expect(me.deviceName == "laptop")
        _ = try await trusted.createContainer("docs")
        let chunk = try await trusted.upload(Array("over TLS".utf8))
        #expect(try await trusted.getChunk(chunk.hash) == Array("over TLS".utf8))

        // The system's CAs only: refused, and the message names the CA and the way out.
        let why = await transportError { _ = try await NimbusClient(baseURL: server.url, token: token, http: try ServerAddress.httpClient(caFile: nil, retryConnects: false)).whoami() }
        #expect(why.contains("signed by \"Nimbus Test CA\"") && why.contains("--ca-file"), "\(why)")
        #expect(!why.contains(token), "the token never appears in a message")

        // Another CA's certificate given as --ca-file does not help.
        let other = NimbusClient(baseURL: server.url, token: token, http: try ServerAddress.httpClient(caFile: pki.dir + "/other-ca.pem", retryConnects: false))
        let why2 = await transportError { _ = try await other.whoami() }
        #expect(why2.contains("does not trust"), "\(why2)")

        // The web view over TLS: its session cookie is Secure (and HttpOnly, SameSite=Strict).
        let code = try await trusted.pairingCode(device: "web")
        let (status, out) = shellStatus("curl -sS -D - -o /dev/null --cacert \(pki.ca) -H 'Sec-Fetch-Site: same-origin' --data-urlencode 'code=\(code.code)' \(server.url)/web/sign-in")
        #expect(status == 0 && out.contains("303") && out.contains("Set-Cookie: nimbus_web=nim_")
                && out.contains("; Path=/; HttpOnly; SameSite=Strict; Secure"), "\(out)")

        // Plain http to the HTTPS port gets no answer that counts.
        let plain = NimbusClient(baseURL: server.url.replacingOccurrences(of: "https://", with: "http://"), token: token,
                                 http: try ServerAddress.httpClient(caFile: nil, retryConnects: false))
        await #expect(throws: RemoteError.self) { _ = try await plain.whoami() }
    }

    /// `nimbus mount` against a server it does not trust fails at once (like a bad token), with
    /// the reason and the way out, and leaves no mount behind.
    @Test func aMountThatDoesNotTrustTheServerFailsAtOnceAndSaysWhy() async throws {
        let pki = try PKI()
        let (server, token, _) = try await httpsServer(pki, cert: try pki.issue("server"))
        defer { server.stop() }
        try token.write(toFile: pki.dir + "/token", atomically: true, encoding: .utf8)
        chmod(pki.dir + "/token", 0o600)
        try FileManager.default.createDirectory(atPath: pki.dir + "/m", withIntermediateDirectories: true)
        let t0 = ContinuousClock.now
        let r = try await NimbusBinary.run(["mount", pki.dir + "/m", "--state", pki.dir + "/s", "--server", server.url,
                                            "--container", "docs", "--token-file", pki.dir + "/token"])
        #expect(r.status == 2 && r.stderr.contains("cannot trust \(server.url)") && r.stderr.contains("--ca-file"), "\(r)")
        #expect(ContinuousClock.now - t0 < .seconds(12), "bounded by one request, not the first sync's 20 s")
        #expect(shellStatus("grep -qF \(pki.dir)/m /proc/mounts").0 != 0, "no mount left")
        // The device commands refuse it with the same exit code.
        let d = try await NimbusBinary.run(["device", "list", "--server", server.url, "--token-file", pki.dir + "/token"])
        #expect(d.status == 2 && d.stderr.contains("Nimbus Test CA"), "\(d)")
    }

    @Test func aCertificateForAnotherHostIsRefusedByName() async throws {
        let pki = try PKI()
        let (server, token, _) = try await httpsServer(pki, cert: try pki.issue("elsewhere", cn: "files.example.org", names: "DNS:files.example.org"))
        defer { server.stop() }
        let client = NimbusClient(baseURL: server.url, token: token, http: try ServerAddress.httpClient(caFile: pki.ca, retryConnects: false))
        let why = await transportError { _ = try await client.whoami() }
        #expect(why.contains("not for 127.0.0.1") && why.contains("files.example.org"), "\(why)")
    }

    /// An expired certificate: `nimbus serve` refuses to start with one, and a device facing a
    /// server that shows one (here openssl's own test server) is told it expired and when.
    @Test func anExpiredCertificateIsRefusedOnBothSides() async throws {
        let pki = try PKI()
        let old = try pki.issue("old", days: -1)
        let start = try await NimbusBinary.run(["serve", "--data", pki.dir + "/d", "--listen", "127.0.0.1:0", "--tls-cert", old.cert, "--tls-key", old.key])
        #expect(start.status == 2 && start.stderr.contains("expired") && start.stderr.contains("renew"), "\(start)")

        // openssl's test server on a random port; a port someone else holds makes it exit, and
        // then another port is tried. What it printed is in the failure message.
        var why = "", said = ""
        attempts: for _ in 0..<5 {
            let port = Int.random(in: 20000...60000)
            let s = try Background("exec openssl s_server -accept 127.0.0.1:\(port) -cert \(old.cert) -key \(old.key) -www -quiet")
            defer { s.stop() }
            let client = NimbusClient(baseURL: "https://127.0.0.1:\(port)", token: "nim_x", http: try ServerAddress.httpClient(caFile: pki.ca, retryConnects: false))
            for _ in 0..<400 {  // until s_server listens (20 s at most)
                why = await transportError { _ = try await client.whoami() }
                if !why.contains("refused") { break attempts }
                if !s.isRunning { break }
                try await Task.sleep(for: .milliseconds(50))
            }
            said = s.output
        }
        #expect(why.contains("expired on"), "\(why); openssl s_server said: \(said)")
    }

    /// A certificate that ends soon is reported when the server starts (and every hour), with
    /// what to do; one that ended while serving is reported as an error.
    @Test func aCertificateThatEndsSoonIsReported() async throws {
        let pki = try PKI()
        let soon = try pki.issue("soon", days: 3)
        let log = pki.dir + "/serve.log"
        let s = try Background("exec \(NimbusBinary.path) serve --data \(pki.dir)/d --listen 127.0.0.1:0 --tls-cert \(soon.cert) --tls-key \(soon.key) 2> \(log)")
        defer { s.stop() }
        var text = ""
        for _ in 0..<200 where !text.contains("expires on") {
            text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(text.contains("expires on") && (text.contains("in 2 days") || text.contains("in 3 days")), "\(text)")
        #expect(text.contains("renew it and send SIGHUP"), "\(text)")
        let tls = try ServerTLS(certFile: soon.cert, keyFile: soon.key)
        #expect(tls.expiryWarning(now: time(nil))?.expired == false)
        #expect(tls.expiryWarning(now: time(nil) + 5 * 86_400)?.expired == true, "ended while serving: an error")
        #expect(tls.expiryWarning(now: time(nil) - 30 * 86_400) == nil, "a month before its end: nothing to say")
    }

    @Test func sighupReloadsTheCertificateAndABadOneKeepsTheOld() async throws {
        let pki = try PKI()
        let first = try pki.issue("first", cn: "first")
        let (server, token, _) = try await httpsServer(pki, cert: first)
        defer { server.stop() }
        let port = server.url.split(separator: ":").last.map(String.init) ?? ""
        func shownCN() -> String {
            shellStatus("openssl s_client -connect 127.0.0.1:\(port) </dev/null 2>/dev/null | openssl x509 -noout -subject").1
        }
        #expect(shownCN().contains("CN = first"))
        // Renewed in place (as certbot or an operator does), then SIGHUP.
        try pki.run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout n.key -out n.csr -subj '/CN=second' && printf 'subjectAltName=IP:127.0.0.1\\n' > n.ext && openssl x509 -req -in n.csr -CA ca.pem -CAkey ca.key -set_serial 77 -days 30 -extfile n.ext -out n.pem && cp n.pem first.pem && cp n.key first.key")
        kill(server.pid, SIGHUP)
        var cn = ""
        for _ in 0..<100 where !cn.contains("CN = second") {
            cn = shownCN()
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(cn.contains("CN = second"), "\(cn)")
        // A broken key: the reload is refused and the server goes on with the certificate it has.
        try pki.run("echo garbage > first.key")
        kill(server.pid, SIGHUP)
        try await Task.sleep(for: .milliseconds(300))
        #expect(server.exitStatus == nil, "still serving")
        #expect(shownCN().contains("CN = second"))
        let client = NimbusClient(baseURL: server.url, token: token, http: try ServerAddress.httpClient(caFile: pki.ca, retryConnects: false))
        #expect(try await client.whoami().deviceName == "laptop")
    }

    @Test func plainHTTPToAnotherMachineIsRefusedBeforeAnythingIsSent() async throws {
        for ok in ["https://files.example.org", "https://10.0.0.5:7443", "http://127.0.0.1:7070", "http://localhost:7070", "http://[::1]:7070", "http://127.8.9.10"] {
            #expect(throws: Never.self) { try ServerAddress.check(ok, insecure: false) }
        }
        for bad in ["http://10.0.0.5:7070", "http://files.example.org", "http://127.0.0.1.example.org", "http://[::2]:1", "http://0.0.0.0:7070"] {
            #expect { try ServerAddress.check(bad, insecure: false) } throws: { "\($0)".contains("clear text") }
            #expect(throws: Never.self) { try ServerAddress.check(bad, insecure: true) }
        }
        for nonsense in ["files.example.org", "ftp://files.example.org", "https://", "https://alice:pw@files.example.org", ""] {
            #expect(throws: ConnectionSetupError.self) { try ServerAddress.check(nonsense, insecure: true) }
        }
        // The command line says so and mounts nothing.
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-insecure-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try FileManager.default.createDirectory(atPath: dir + "/m", withIntermediateDirectories: true)
        let r = try await NimbusBinary.run(["mount", dir + "/m", "--state", dir + "/s", "--server", "http://192.0.2.7:7070", "--container", "docs"])
        #expect(r.status == 64 && r.stderr.contains("clear text") && r.stderr.contains("--insecure"), "\(r)")
        let ca = try await NimbusBinary.run(["mount", dir + "/m", "--state", dir + "/s", "--server", "https://192.0.2.7", "--container", "docs", "--ca-file", dir + "/none.pem"])
        #expect(ca.status == 64 && ca.stderr.contains("cannot read the CA file"), "\(ca)")
        // The device commands and login refuse both the same way.
        try "nim_x".write(toFile: dir + "/token", atomically: true, encoding: .utf8)
        for args in [["device", "list", "--server", "http://192.0.2.7:7070", "--token-file", dir + "/token"],
                     ["login", "http://192.0.2.7:7070", "--code", "AAAA-BBBB-CCCC", "--state", dir + "/l"]] {
            let r = try await NimbusBinary.run(args)
            #expect(r.status == 64 && r.stderr.contains("clear text"), "\(args[0]): \(r)")
        }
        for args in [["device", "list", "--server", "https://192.0.2.7", "--token-file", dir + "/token", "--ca-file", dir + "/none.pem"],
                     ["login", "https://192.0.2.7", "--code", "AAAA-BBBB-CCCC", "--state", dir + "/l", "--ca-file", dir + "/none.pem"]] {
            let r = try await NimbusBinary.run(args)
            #expect(r.status == 64 && r.stderr.contains("cannot read the CA file"), "\(args[0]): \(r)")
        }
    }
}
