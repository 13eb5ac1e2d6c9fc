import Foundation
import Logging
@testable import NimbusServer
import NimbusTesting
import Testing

/// `sslmode` and `sslrootcert` in the `--database` URL, parsed without a server.
@Suite struct PostgresTLSParseTests {
    static let base = "postgres://u:p@db.internal:5432/nimbus"

    @Test func modes() throws {
        #expect(try PostgresLocation.parse(Self.base).tls.mode == .disable)
        #expect(try PostgresLocation.parse(Self.base + "?sslmode=disable").tls.mode == .disable)
        for mode in ["prefer", "require", "verify-ca", "verify-full"] {
            let location = try PostgresLocation.parse(Self.base + "?sslmode=\(mode)")
            #expect(location.tls.mode.rawValue == mode)
            #expect(location.tls.rootCert == nil)
            #expect(location.description == "postgres://u@db.internal:5432/nimbus?sslmode=\(mode)")
        }
        #expect(try PostgresLocation.parse(Self.base + "?sslmode=verify-full&sslrootcert=system").tls.rootCert == nil)
    }

    @Test func refusals() throws {
        func message(_ url: String) -> String {
            do { _ = try PostgresLocation.parse(url) } catch let e as APIError { return e.message } catch { return "\(error)" }
            return "accepted"
        }
        #expect(message(Self.base + "?sslmode=bogus").contains("sslmode=bogus is not a TLS mode nimbus knows; use one of disable, prefer, require, verify-ca, verify-full"))
        #expect(message(Self.base + "?sslmode=allow").contains("is not offered"))
        #expect(message(Self.base + "?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem").contains("sslrootcert /nonexistent/ca.pem: cannot be read"))
        #expect(message(Self.base + "?sslrootcert=/etc/hostname").contains("add sslmode=verify-full"))
        #expect(message(Self.base + "?sslmode=require&sslcert=c.pem").contains("client certificate"))
        #expect(message(Self.base + "?sslmod=require").contains("unknown parameter \"sslmod\""))
        // A file that is not a certificate.
        let junk = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-junk-\(UUID().uuidString).pem").path
        try Data("not a certificate\n".utf8).write(to: URL(fileURLWithPath: junk))
        defer { try? FileManager.default.removeItem(atPath: junk) }
        #expect(message(Self.base + "?sslmode=verify-full&sslrootcert=\(junk)").contains("sslrootcert \(junk):"))
    }
}

/// TLS to the throwaway PostgreSQL of scripts/services, whose certificate is for the name
/// localhost only (not the address 127.0.0.1), signed by `NIMBUS_TEST_POSTGRES_TLS/ca.crt`; its
/// user nimbus_tls may connect with TLS only.
enum PostgresTLSScratch {
    static let dir = ProcessInfo.processInfo.environment["NIMBUS_TEST_POSTGRES_TLS"].flatMap { $0.isEmpty ? nil : $0 }
}

@Suite(.serialized, .enabled(if: PostgresScratch.available && PostgresTLSScratch.dir != nil,
                             "needs NIMBUS_TEST_POSTGRES and NIMBUS_TEST_POSTGRES_TLS; scripts/services starts PostgreSQL with TLS"))
struct PostgresTLSTests {
    static let dir = PostgresTLSScratch.dir

    /// `db` reached as nimbus_tls at `host`, with `query`.
    static func url(_ db: PostgresLocation, host: String = "localhost", _ query: String) -> String {
        "postgres://nimbus_tls:\(db.password ?? "")@\(host):\(db.port)/\(db.database)\(query)"
    }

    /// Opens the store at `url` and writes to it, or says why not; bounded, so a hang fails the test.
    static func attempt(_ url: String) async -> String {
        let quiet = {
            var l = Logger(label: "nimbus.test-postgres-tls")
            l.logLevel = .critical
            return l
        }()
        return await withTaskGroup(of: String.self) { group in
            group.addTask {
                do {
                    let store = try await PostgresStore.open(try PostgresLocation.parse(url), logger: quiet)
                    do {
                        _ = try await store.addDevice(account: "alice", deviceName: "laptop", tokenHash: TokenHash.of(TokenHash.newToken()))
                        await store.shutdown()
                        return "ok"
                    } catch {
                        await store.shutdown()
                        return "write failed: \(error)"
                    }
                } catch let e as APIError {
                    return e.message
                } catch {
                    return "\(error)"
                }
            }
            group.addTask {
                try? await Task.sleep(for: .seconds(60))
                return "no answer within 60 s"
            }
            let first = await group.next()!
            group.cancelAll()
            return first
        }
    }

    @Test func verifyFullConnectsOnlyWithTheRightCAAndName() async throws {
        let dir = try #require(Self.dir)
        try await PostgresScratch.withDatabase { db in
            let ok = await Self.attempt(Self.url(db, "?sslmode=verify-full&sslrootcert=\(dir)/ca.crt"))
            #expect(ok == "ok")

            let wrongCA = await Self.attempt(Self.url(db, "?sslmode=verify-full&sslrootcert=\(dir)/other-ca.crt"))
            #expect(wrongCA.contains("certificate failed verification (CERTIFICATE_VERIFY_FAILED): it is not signed by the CA certificates in sslrootcert \(dir)/other-ca.crt"), "\(wrongCA)")
            #expect(wrongCA.hasPrefix("cannot open the PostgreSQL metadata database postgres://nimbus_tls@localhost"))

            // The certificate names localhost, not 127.0.0.1: verify-full refuses the address,
            // verify-ca does not check names.
            let wrongName = await Self.attempt(Self.url(db, host: "127.0.0.1", "?sslmode=verify-full&sslrootcert=\(dir)/ca.crt"))
            #expect(wrongName.contains("certificate is not made for 127.0.0.1"), "\(wrongName)")
            #expect(await Self.attempt(Self.url(db, host: "127.0.0.1", "?sslmode=verify-ca&sslrootcert=\(dir)/ca.crt")) == "ok")
            // require encrypts without checking (as libpq), and checks the CA when given one.
            #expect(await Self.attempt(Self.url(db, "?sslmode=require")) == "ok")
            let requireWrongCA = await Self.attempt(Self.url(db, "?sslmode=require&sslrootcert=\(dir)/other-ca.crt"))
            #expect(requireWrongCA.contains("CERTIFICATE_VERIFY_FAILED"), "\(requireWrongCA)")
            // The system's CAs do not include the test CA.
            let system = await Self.attempt(Self.url(db, "?sslmode=verify-full"))
            #expect(system.contains("not signed by the system's CAs"), "\(system)")
        }
    }

    @Test func plainTextToAServerRequiringTLSFailsClearly() async throws {
        try await PostgresScratch.withDatabase { db in
            for query in ["", "?sslmode=disable"] {
                let plain = await Self.attempt(Self.url(db, query))
                #expect(plain.contains("refuses connections without TLS") && plain.contains("sslmode=verify-full"), "\(plain)")
            }
        }
    }
}
