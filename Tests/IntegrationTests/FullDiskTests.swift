import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The server's disk fills up: uploads fail with `storage_full` and a message that says what to
/// do, nothing half-written is left, and the server keeps serving what it has.
@Suite struct FullDiskTests {
    @Test func fullDiskAnswersStorageFullAndLosesNothing() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-full-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // A small tmpfs as the data directory (needs root; skipped loudly otherwise).
        guard getuid() == 0, Glibc.mount("tmpfs", dir, "tmpfs", 0, "size=6m") == 0 else {
            print("FullDiskTests: SKIPPED — cannot mount a small tmpfs here (needs root)")
            return
        }
        defer { umount2(dir, Int32(MNT_DETACH)) }
        let add = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "laptop"])
        try #require(add.status == 0, "\(add.stderr)")
        let token = add.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let server = ServerProcess(dataDir: dir)
        defer { server.stop() }
        try await server.start()
        let c = NimbusClient(baseURL: server.url, token: token)
        _ = try await c.createContainer("com.example.full")

        var stored: [ChunkRef] = []
        var full: RemoteError?
        for i in 0..<20 {
            var bytes = [UInt8](repeating: UInt8(i), count: 1024 * 1024)
            bytes[0] = UInt8(truncatingIfNeeded: i &* 31)
            do {
                stored.append(try await c.upload(bytes))
            } catch let e as RemoteError {
                full = e
                break
            }
        }
        let error = try #require(full, "6 MiB of disk must fill before 20 MiB are stored")
        #expect(error.code == .storageFull, "\(error)")
        #expect("\(error)".contains("free"), "the message says what to do: \(error)")
        #expect(!stored.isEmpty)
        // No temp file is left behind, and what was stored is still served and committable.
        let tmp = try FileManager.default.contentsOfDirectory(atPath: dir + "/chunks/tmp")
        #expect(tmp.isEmpty, "leftover temp files: \(tmp)")
        for ref in stored { #expect(try await c.getChunk(ref.hash).count == Int(ref.size)) }
        let r = try? await c.commit("com.example.full", CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: ItemDraft(
            kind: .file, parent: .root, name: ItemName(trusted: "kept.bin"), chunks: [stored[0]], mode: 0o644, modified: 1)))
        if r == nil { print("FullDiskTests: the commit itself also hit the full disk (answered an error, as it should)") }
        let check = try await NimbusBinary.run(["admin", "check", "--data", dir])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
    }
}
