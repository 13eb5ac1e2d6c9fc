import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
@testable import NimbusServer
import NimbusTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Enrolling a machine without the server's shell (docs/install.md, docs/protocol.md "Devices"):
/// `nimbus device add` on an enrolled device, `nimbus login` on the new one, list and revoke from
/// any device; codes work once, wrong ones are counted and limited.
@Suite(.serialized) struct PairingTests {
    func world(serverArgs: [String] = []) async throws -> (dir: String, server: ServerProcess, tokenFile: String) {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-pair-\(UUID().uuidString)").path
        let add = try await NimbusBinary.run(["admin", "add-device", "--data", dir + "/server", "--account", "alice", "--device", "desktop"])
        #expect(add.status == 0, "\(add.stderr)")
        try add.stdout.write(toFile: dir + "/desktop.token", atomically: true, encoding: .utf8)
        let server = ServerProcess(dataDir: dir + "/server", extraArgs: serverArgs)
        try await server.start()
        return (dir, server, dir + "/desktop.token")
    }

    @Test func aCodeEnrollsANewMachineOnceAndItsDevicesCanBeListedAndRevokedFromAnyDevice() async throws {
        let (dir, server, desktop) = try await world()
        defer { server.stop(); try? FileManager.default.removeItem(atPath: dir) }
        let asDesktop = ["--server", server.url, "--token-file", desktop]

        let add = try await NimbusBinary.run(["device", "add", "laptop"] + asDesktop)
        #expect(add.status == 0, "\(add.stderr)")
        let code = add.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(code.wholeMatch(of: /[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}/) != nil, "\(code)")
        #expect(add.stderr.contains("nimbus login \(server.url) --code \(code)"), "the next command is printed: \(add.stderr)")

        // Typed back in lower case without dashes: still the code.
        let typed = code.lowercased().replacingOccurrences(of: "-", with: "")
        let login = try await NimbusBinary.run(["login", server.url, "--code", typed, "--state", dir + "/laptop"])
        #expect(login.status == 0 && login.stdout.contains("enrolled as device laptop of account alice"), "\(login)")
        var st = stat()
        #expect(stat(dir + "/laptop/token", &st) == 0 && st.st_mode & 0o777 == 0o600, "the token file is mode 600")
        #expect(stat(dir + "/laptop", &st) == 0 && st.st_mode & 0o777 == 0o700)
        let token = try String(contentsOfFile: dir + "/laptop/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try await NimbusClient(baseURL: server.url, token: token).whoami().deviceName == "laptop")

        // The code is spent.
        let again = try await NimbusBinary.run(["login", server.url, "--code", code, "--state", dir + "/other"])
        #expect(again.status == 2 && again.stderr.contains("unknown, already used or expired"), "\(again)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/other/token"), "nothing stored for a refused code")

        // Listed from the new device (its state), revoked from it: the desktop is cut off.
        let list = try await NimbusBinary.run(["device", "list", "--state", dir + "/laptop"])
        #expect(list.status == 0 && list.stdout.contains("\"desktop\"") && list.stdout.contains("\"laptop\"") && !list.stdout.contains("revoked"), "\(list)")
        let revoke = try await NimbusBinary.run(["device", "revoke", "desktop", "--state", dir + "/laptop"])
        #expect(revoke.status == 0 && revoke.stdout.contains("revoked desktop"), "\(revoke)")
        try await Task.sleep(for: .milliseconds(1100))  // the server rechecks a known token each second
        let cut = try await NimbusBinary.run(["device", "list"] + asDesktop)
        #expect(cut.status == 2 && cut.stderr.contains("revoked"), "\(cut)")
        let listed = try await NimbusBinary.run(["device", "list", "--state", dir + "/laptop"])
        #expect(listed.stdout.split(separator: "\n").contains { $0.contains("\"desktop\"") && $0.contains("revoked") }, "\(listed.stdout)")

        // Another account's device cannot be named.
        _ = try await NimbusBinary.run(["admin", "add-device", "--data", dir + "/server", "--account", "mallory", "--device", "evil"])
        let other = try await NimbusBinary.run(["device", "revoke", "evil", "--state", dir + "/laptop"])
        #expect(other.status == 2 && other.stderr.contains("device_not_found"), "\(other)")
    }

    /// A revoked device enrolls again in place with a new code (its state, and so its queued
    /// changes, kept); a device whose token still works is told so and nothing is spent.
    @Test func aRevokedDeviceEnrollsAgainInItsOwnStateDirectory() async throws {
        let (dir, server, desktop) = try await world()
        defer { server.stop(); try? FileManager.default.removeItem(atPath: dir) }
        let asDesktop = ["--server", server.url, "--token-file", desktop]
        func code(_ name: String) async throws -> String {
            try await NimbusBinary.run(["device", "add", name] + asDesktop).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        let first = try await NimbusBinary.run(["login", server.url, "--code", try await code("laptop"), "--state", dir + "/laptop"])
        #expect(first.status == 0, "\(first)")
        try "queued work".write(toFile: dir + "/laptop/keep-me", atomically: true, encoding: .utf8)

        let taken = try await NimbusBinary.run(["device", "add", "laptop"] + asDesktop)
        #expect(taken.status != 0 && taken.stderr.contains("device_name_taken"), "a second device of one name is refused: \(taken)")
        let unused = try await code("laptop 2")
        let named = try await NimbusBinary.run(["login", server.url, "--code", unused, "--device", "desktop", "--state", dir + "/other"])
        #expect(named.status != 0 && named.stderr.contains("device_name_taken"), "nor may a login take a name in use: \(named)")
        let working = try await NimbusBinary.run(["login", server.url, "--code", unused, "--state", dir + "/laptop"])
        #expect(working.status != 0 && working.stderr.contains("its token works"), "\(working)")

        _ = try await NimbusBinary.run(["device", "revoke", "laptop"] + asDesktop)
        try await Task.sleep(for: .milliseconds(1100))  // the server rechecks a known token each second
        let old = try String(contentsOfFile: dir + "/laptop/token", encoding: .utf8)
        let refused = try await NimbusClient(baseURL: server.url, token: old.trimmingCharacters(in: .whitespacesAndNewlines)).send(.GET, "/v1/whoami")
        #expect(refused.status == 401 && refused.text.contains("nimbus login") && !refused.text.contains("admin add-device"),
                "the refusal names a command the device's user can run: \(refused.text)")
        let again = try await NimbusBinary.run(["login", server.url, "--code", unused, "--state", dir + "/laptop"])
        #expect(again.status == 0 && again.stdout.contains("enrolled again as device laptop 2"), "the unspent code enrolls it again: \(again)")
        let token = try String(contentsOfFile: dir + "/laptop/token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(token != old.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(try await NimbusClient(baseURL: server.url, token: token).whoami().deviceName == "laptop 2")
        #expect(FileManager.default.fileExists(atPath: dir + "/laptop/keep-me"), "the state directory is kept")
    }

    /// A state directory that cannot hold the token is refused before the code is redeemed: the
    /// code stays good (no device exists whose token was never stored), the error says why and
    /// what to do, and the same code then enrolls a writable directory.
    @Test func aStateThatCannotHoldTheTokenLeavesTheCodeUnspent() async throws {
        let (dir, server, desktop) = try await world()
        defer { server.stop(); try? FileManager.default.removeItem(atPath: dir) }
        let add = try await NimbusBinary.run(["device", "add", "laptop", "--server", server.url, "--token-file", desktop])
        let code = add.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        // A file where the directory should be, and a directory that is read-only (for root too:
        // a path below a regular file cannot be created).
        try "x".write(toFile: dir + "/blocker", atomically: true, encoding: .utf8)
        for state in [dir + "/blocker", dir + "/blocker/state"] {
            let login = try await NimbusBinary.run(["login", server.url, "--code", code, "--state", state])
            #expect(login.status != 0, "\(login)")
            #expect(login.stderr.contains(state) && login.stderr.contains("--state"), "says which directory and what to change: \(login.stderr)")
            #expect(!login.stderr.contains("NSCocoaErrorDomain") && !login.stderr.contains("Error Domain"), "no raw Foundation error: \(login.stderr)")
        }
        let list = try await NimbusBinary.run(["device", "list", "--server", server.url, "--token-file", desktop])
        #expect(!list.stdout.contains("\"laptop\""), "no device was made for a token never stored: \(list.stdout)")
        let login = try await NimbusBinary.run(["login", server.url, "--code", code, "--state", dir + "/laptop"])
        #expect(login.status == 0 && login.stdout.contains("enrolled as device laptop"), "the code is still good: \(login)")
    }

    /// Wrong codes are refused, counted per address and in all, and past the limit even the right
    /// code waits out the minute (a guesser gets a few tries per minute, not thousands).
    @Test func wrongCodesAreRefusedAndRateLimited() async throws {
        let (dir, server, desktop) = try await world()
        defer { server.stop(); try? FileManager.default.removeItem(atPath: dir) }
        let anonymous = NimbusClient(baseURL: server.url, token: "")
        let real = try await NimbusClient(baseURL: server.url, token: try String(contentsOfFile: desktop, encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines)).pairingCode(device: "tablet")
        for guess in ["AAAA-AAAA-AAAA", "not a code", String(repeating: "Z", count: 5000), "0000-0000-0000", "1234-5678-9ABC"] {
            await #expect { _ = try await anonymous.pair(code: guess, device: nil) } throws: { ($0 as? RemoteError)?.code == .pairingInvalid || ($0 as? RemoteError)?.code == .bodyTooLarge }
        }
        await #expect { _ = try await anonymous.pair(code: real.code, device: nil) } throws: { ($0 as? RemoteError)?.code == .rateLimited }
        #expect(try await NimbusClient(baseURL: server.url, token: "x").send(.GET, "/healthz", authorized: false).status == 200, "the server is fine")

        // A client cannot pass itself off as another address: X-Forwarded-For from a peer that is
        // not a trusted proxy is ignored (still rate limited, whatever it claims).
        let spoofed = try await anonymous.send(.POST, "/v1/pair", body: .init(string: #"{"code":"\#(real.code)"}"#),
                                               contentType: "application/json", headers: [("X-Forwarded-For", "198.51.100.99")], authorized: false)
        #expect(spoofed.status == 429, "\(spoofed.status) \(spoofed.text)")

        // The window, at unit level: five wrong in a minute close this address, others stay open
        // until the total is reached, and a minute later it opens again.
        let g = PairingGuard(perAddress: 5, total: 8)
        let t0 = ContinuousClock.now
        for _ in 0..<5 { g.wrong("10.0.0.1", now: t0) }
        #expect(throws: APIError.self) { try g.check("10.0.0.1", now: t0) }
        #expect(throws: Never.self) { try g.check("10.0.0.2", now: t0) }
        for _ in 0..<3 { g.wrong("10.0.0.3", now: t0) }
        #expect(throws: APIError.self) { try g.check("10.0.0.2", now: t0) }
        #expect(throws: Never.self) { try g.check("10.0.0.1", now: t0 + .seconds(61)) }
    }

    /// Behind a proxy (`--trusted-proxy`), the limit counts the client the proxy names last in
    /// X-Forwarded-For: one guesser does not lock everyone else out of enrolling.
    @Test func behindATrustedProxyTheLimitCountsEachClient() async throws {
        let (dir, server, desktop) = try await world(serverArgs: ["--trusted-proxy", "127.0.0.1"])
        defer { server.stop(); try? FileManager.default.removeItem(atPath: dir) }
        let anonymous = NimbusClient(baseURL: server.url, token: "")
        let token = try String(contentsOfFile: desktop, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        let real = try await NimbusClient(baseURL: server.url, token: token).pairingCode(device: "tablet")
        func pair(_ code: String, from chain: String) async throws -> Int {
            try await anonymous.send(.POST, "/v1/pair", body: .init(string: #"{"code":"\#(code)"}"#), contentType: "application/json",
                                     headers: [("X-Forwarded-For", chain)], authorized: false).status
        }
        for _ in 0..<5 { #expect(try await pair("AAAA-AAAA-AAAA", from: "203.0.113.5") == 403) }
        #expect(try await pair("AAAA-AAAA-AAAA", from: "203.0.113.5") == 429, "the guesser is limited")
        // What a client puts in front of the proxy's entry is not believed.
        #expect(try await pair("AAAA-AAAA-AAAA", from: "198.51.100.7, 203.0.113.5") == 429)
        #expect(try await pair(real.code, from: "198.51.100.7") == 200, "another client enrolls meanwhile")
    }
}
