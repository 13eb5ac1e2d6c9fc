import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Testing

/// The built binary's server-side commands: clear errors and documented exit codes.
@Suite struct CLITests {
    static func tempDir() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-cli-\(UUID().uuidString)").path
    }

    @Test func addDevicePrintsOneTokenAndRejectsBadNames() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let a = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "laptop"])
        let b = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "desktop"])
        #expect(a.status == 0 && b.status == 0)
        #expect(a.stdout.hasPrefix("nim_") && a.stdout.split(separator: "\n").count == 1)
        #expect(a.stdout != b.stdout, "every device gets its own token")
        // The token is stored hashed: it appears nowhere in the data directory.
        let token = a.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        for name in try FileManager.default.contentsOfDirectory(atPath: dir) where !name.hasPrefix("chunks") {
            let bytes = try Data(contentsOf: URL(fileURLWithPath: dir + "/" + name))
            #expect(bytes.range(of: Data(token.utf8)) == nil, "token found in \(name)")
        }
        let bad = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "", "--device", "x"])
        #expect(bad.status == 2 && bad.stderr.hasPrefix("nimbus: "), "\(bad)")
        let check = try await NimbusBinary.run(["admin", "check", "--data", dir])
        #expect(check.status == 0 && check.stdout == "consistent\n")
    }

    /// `nimbus admin set-quota` and `quota`: sizes with suffixes, `none`, a clear refusal of a bad
    /// size (64) and of an unknown account (2) (docs/deploy.md "Quotas").
    @Test func setQuotaAndQuota() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        #expect(try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "laptop"]).status == 0)
        #expect(try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "bob", "--device", "phone"]).status == 0)
        let set = try await NimbusBinary.run(["admin", "set-quota", "--data", dir, "--account", "alice", "2G"])
        #expect(set.status == 0 && set.stdout == "alice\tused 0 (0 B)\tquota 2147483648 (2.0 GiB)\tfree 2147483648\tchunks 0\tmetadata 0\ttrash 0 (0 B)\n", "\(set)")
        let all = try await NimbusBinary.run(["admin", "quota", "--data", dir])
        #expect(all.status == 0 && all.stdout.split(separator: "\n").count == 2 && all.stdout.contains("bob\tused 0 (0 B)\tquota none\tfree unlimited"),
                "\(all)")
        let none = try await NimbusBinary.run(["admin", "set-quota", "--data", dir, "--account", "alice", "none"])
        #expect(none.status == 0 && none.stdout.contains("\tquota none\t"), "\(none)")
        for bad in ["0x10", "12X", "1.5G", "", "99999999999T"] {
            let r = try await NimbusBinary.run(["admin", "set-quota", "--data", dir, "--account", "alice", bad])
            #expect(r.status == 64 && r.stderr.contains("number of bytes"), "\(bad): \(r)")
        }
        let unknown = try await NimbusBinary.run(["admin", "set-quota", "--data", dir, "--account", "carol", "1M"])
        #expect(unknown.status == 2 && unknown.stderr.hasPrefix("nimbus: ") && unknown.stderr.contains("carol"), "\(unknown)")
        let unknownQuota = try await NimbusBinary.run(["admin", "quota", "--data", dir, "--account", "carol"])
        #expect(unknownQuota.status == 2, "\(unknownQuota)")
    }

    @Test func aDeviceRevokedWhileTheServerRunsIsRefusedWithinASecond() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let server = ServerProcess(dataDir: dir)
        defer { server.stop() }
        try await server.start()
        var tokens: [String] = []
        for device in ["laptop", "phone"] {
            let r = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", device])
            #expect(r.status == 0)
            tokens.append(r.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        let laptop = NimbusClient(baseURL: server.url, token: tokens[0]), phone = NimbusClient(baseURL: server.url, token: tokens[1])
        #expect(try await laptop.whoami().deviceName == "laptop")  // known and remembered by the server
        let list = try await NimbusBinary.run(["admin", "list-devices", "--data", dir])
        #expect(list.status == 0 && list.stdout.split(separator: "\n").count == 2, "\(list)")
        #expect(list.stdout.contains("alice\tlaptop\t") && list.stdout.contains("active"))
        #expect(!list.stdout.contains(tokens[0]) && !list.stdout.contains(tokens[1]), "tokens are never shown")
        let revoke = try await NimbusBinary.run(["admin", "revoke-device", "--data", dir, "--account", "alice", "--device", "laptop"])
        #expect(revoke.status == 0 && revoke.stdout.hasPrefix("revoked alice/laptop"), "\(revoke)")
        try await Task.sleep(for: .milliseconds(1_100))
        let refused = try await laptop.send(.GET, "/v1/whoami")
        #expect(refused.status == 401 && refused.text.contains("revoked"), "\(refused.status) \(refused.text)")
        #expect(try await phone.whoami().deviceName == "phone", "the other device still works")
        let listed = try await NimbusBinary.run(["admin", "list-devices", "--data", dir, "--account", "alice"])
        #expect(listed.stdout.split(separator: "\n").first { $0.contains("laptop") }?.contains("revoked 20") == true, "\(listed.stdout)")
        let unknown = try await NimbusBinary.run(["admin", "revoke-device", "--data", dir, "--account", "alice", "--device", "tablet"])
        #expect(unknown.status == 2 && unknown.stderr.contains("no device"), "\(unknown)")
    }

    @Test func serveRejectsABadListenAddress() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let r = try await NimbusBinary.run(["serve", "--data", dir, "--listen", "nowhere"])
        #expect(r.status != 0)
        #expect(r.stderr.contains("HOST:PORT"), "\(r.stderr)")
    }

    @Test func serveReportsAPortInUse() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let first = ServerProcess(dataDir: dir)
        defer { first.stop() }
        try await first.start()
        let port = first.url.split(separator: ":").last.map(String.init) ?? "0"
        let r = try await NimbusBinary.run(["serve", "--data", dir + "-2", "--listen", "127.0.0.1:\(port)"], timeout: .seconds(30))
        defer { try? FileManager.default.removeItem(atPath: dir + "-2") }
        #expect(r.status == 3, "exit 3 (network), got \(r.status): \(r.stderr)")
        #expect(r.stderr.contains("--listen"), "\(r.stderr)")
    }

    @Test func serveRejectsBadHistorySettings() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        for (args, says) in [(["--keep-versions", "-1"], "--keep-versions"), (["--keep-days", "-3"], "--keep-days"),
                             (["--keep-days", "40000"], "0…36500"), (["--keep-versions", "many"], "many")] {
            let r = try await NimbusBinary.run(["serve", "--data", dir, "--listen", "127.0.0.1:0"] + args, timeout: .seconds(30))
            #expect(r.status == 64, "\(args): exit 64 (a bad option value), got \(r.status): \(r.stderr)")
            #expect(r.stderr.contains(says), "\(args): \(r.stderr)")
        }
    }

    /// `nimbus serve --keep-versions 1 --keep-days 0`: each item keeps its current version and one
    /// earlier one, and `nimbus admin check` passes on the pruned history.
    @Test func serveKeepsTheConfiguredHistory() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let add = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "laptop"])
        #expect(add.status == 0, "\(add.stderr)")
        let server = ServerProcess(dataDir: dir, extraArgs: ["--keep-versions", "1", "--keep-days", "0"])
        defer { server.stop() }
        try await server.start()
        let client = NimbusClient(baseURL: server.url, token: add.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        _ = try await client.createContainer("com.example.cli")
        let file = ItemID(UUID())
        var base: Int64? = nil
        for i in 0..<4 {
            let chunk = try await client.upload(Array(repeating: UInt8(i + 1), count: 10))
            let draft = ItemDraft(kind: .file, parent: .root, name: ItemName(trusted: "h.txt"), chunks: [chunk], mode: 0o644, modified: Int64(i + 1))
            base = try await client.commit("com.example.cli", CommitRequest(item: file, baseVersion: base, state: draft)).item.version
        }
        let versions = try await client.versions("com.example.cli", file)
        #expect(versions.map(\.role) == [.current, .previous], "\(versions.map(\.version))")
        let check = try await NimbusBinary.run(["admin", "check", "--data", dir])
        #expect(check.status == 0 && check.stdout == "consistent\n", "\(check.stdout) \(check.stderr)")
    }

    /// `nimbus serve --gc-interval 1 --gc-grace 0` frees the chunk only a pruned version referred
    /// to (counted in /metrics), keeps the current one and stops cleanly on SIGTERM; then
    /// `nimbus admin gc` finds nothing left, `nimbus admin check` passes, bad values exit 64.
    @Test func serveAndAdminCollectChunks() async throws {
        let dir = Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        for args in [["serve", "--data", dir, "--gc-interval", "-1"], ["serve", "--data", dir, "--gc-grace", "x"],
                     ["admin", "gc", "--data", dir, "--grace", "-1"]] {
            let r = try await NimbusBinary.run(args, timeout: .seconds(30))
            #expect(r.status == 64, "\(args): exit 64, got \(r.status): \(r.stderr)")
        }
        let add = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "laptop"])
        #expect(add.status == 0, "\(add.stderr)")
        let server = ServerProcess(dataDir: dir, extraArgs: ["--keep-versions", "0", "--keep-days", "0", "--gc-interval", "1", "--gc-grace", "0"])
        defer { server.stop() }
        try await server.start()
        let client = NimbusClient(baseURL: server.url, token: add.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        _ = try await client.createContainer("com.example.cli")
        let file = ItemID(UUID())
        var base: Int64? = nil
        var chunks: [ChunkRef] = []
        for i in 0..<2 {
            let bytes = Array(repeating: UInt8(i + 1), count: 1_000)
            let draft = { (c: ChunkRef) in ItemDraft(kind: .file, parent: .root, name: ItemName(trusted: "g.bin"), chunks: [c], mode: 0o644, modified: Int64(i + 1)) }
            // With a grace of 0 a collection may free the chunk between upload and commit: the
            // commit then says missing_chunks and the device uploads again, as the engine does
            // (on a loaded machine, each try can take longer than the collector's interval).
            for attempt in 1...50 {
                let chunk = try await client.upload(bytes)
                do {
                    base = try await client.commit("com.example.cli", CommitRequest(item: file, baseVersion: base, state: draft(chunk))).item.version
                    chunks.append(chunk)
                    break
                } catch let e as RemoteError where e.code == .missingChunks && attempt < 50 {}
            }
        }
        let anon = NimbusClient(baseURL: server.url, token: "")
        func counter(_ name: String) async throws -> Int? {
            let text = try await anon.send(.GET, "/metrics", authorized: false).text
            return text.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Int($0.split(separator: " ").last ?? "") }
        }
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline, try await client.missingChunks([chunks[0].hash]).isEmpty {
            try await Task.sleep(for: .milliseconds(200))
        }
        #expect(try await client.missingChunks(chunks.map(\.hash)) == [chunks[0].hash], "the pruned version's chunk is gone")
        // At least that one; more if a collection caught a chunk between its upload and commit.
        let freed = try #require(try await counter("nimbus_gc_chunks_freed_total"))
        let bytesFreed = try await counter("nimbus_gc_bytes_freed_total")
        #expect(freed >= 1 && bytesFreed == freed * 1_000, "freed \(freed), \(String(describing: bytesFreed)) bytes")
        #expect(try await client.getChunk(chunks[1].hash).count == 1_000, "the current version's chunk reads")
        await server.kill(SIGTERM)
        #expect(server.exitStatus == 0, "a clean stop with the collector running")
        let dry = try await NimbusBinary.run(["admin", "gc", "--data", dir, "--dry-run"])
        #expect(dry.status == 0 && dry.stdout.hasPrefix("would free 0 chunk(s), 0 bytes"), "\(dry.stdout) \(dry.stderr)")
        let gc = try await NimbusBinary.run(["admin", "gc", "--data", dir, "--grace", "0"])
        #expect(gc.status == 0 && gc.stdout == "freed 0 chunk(s), 0 bytes (0 ownership(s) released)\n", "\(gc.stdout) \(gc.stderr)")
        let check = try await NimbusBinary.run(["admin", "check", "--data", dir])
        #expect(check.status == 0 && check.stdout == "consistent\n", "\(check.stdout) \(check.stderr)")
    }
}
