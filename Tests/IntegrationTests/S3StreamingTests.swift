import Crypto
import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusRemote
@testable import NimbusServer
import NimbusTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `nimbus serve` (the built binary) with its chunks in S3 (moto): bodies stream through the
/// server both ways, so its memory stays bounded whatever the chunk sizes; a killed server leaves
/// no partial chunk; a damaged chunk is cut off before its last byte.
@Suite(.serialized, .enabled(if: S3Scratch.available, "NIMBUS_TEST_S3 is unset; scripts/test starts moto's S3 server and sets it"))
struct S3StreamingTests {
    /// A server on a fresh bucket (SQLite metadata in a temp folder), with a device's client.
    static func withServer(_ body: @Sendable (ServerProcess, NimbusClient, S3ChunkStore, _ token: String) async throws -> Void) async throws {
        S3Scratch.exportEnvironment()
        try await S3Scratch.withBucket { store, chunks in
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-s3stream-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let r = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "laptop"])
            guard r.status == 0 else { throw FixtureError("add-device failed: \(r.stderr)") }
            let server = ServerProcess(dataDir: dir, extraArgs: ["--chunks", chunks])
            defer { server.stop() }
            try await server.start()
            let token = r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            try await body(server, NimbusClient(baseURL: server.url, token: token), store, token)
        }
    }

    /// A /proc/PID/status figure in KiB (VmHWM: the resident high-water mark; VmRSS: resident now).
    static func memory(_ pid: Int32, _ field: String) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") }),
              let kb = Int(line.split(separator: " ", omittingEmptySubsequences: true)[1]) else {
            throw FixtureError("no \(field) in /proc/\(pid)/status")
        }
        return kb
    }

    /// `count` bytes that do not repeat (so no layer can compress or deduplicate them).
    static func content(_ count: Int, seed: UInt64) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var x = seed
        out.withUnsafeMutableBytes { raw in
            let words = raw.bindMemory(to: UInt64.self)
            for i in words.indices {
                x &+= 0x9E37_79B9_7F4A_7C15
                var z = x
                z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
                z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
                words[i] = z ^ (z >> 31)
            }
        }
        return out
    }

    /// 64 MiB as 8 chunks of 8 MiB, all 8 uploaded at once (a device's limit of bodies in flight),
    /// then all 8 downloaded at once, plus ranges. Holding whole bodies, the server would need
    /// at least 8 × 8 MiB = 64 MiB on top of its baseline for the uploads alone (each body read
    /// whole before its PUT), and as much again for the downloads. Streaming, each transfer holds
    /// a few pieces (128 KiB from the disk, the socket's reads from S3 and the device). Measured
    /// rise: 7–11 MiB on an idle machine; up to 31 MiB while a build ran beside it (slower readers
    /// leave more pieces queued, and the allocator's arenas keep what they once held). The bound,
    /// 48 MiB, is three quarters of what the uploads alone cost holding whole bodies (they raised
    /// it by 93 MiB for both phases), so a return to whole bodies fails it on any machine.
    @Test func sixtyFourMiBThroughTheServerInBoundedMemory() async throws {
        try await Self.withServer { server, client, store, token in
            // Warm up: the connection pools, the thread pool and the allocator's arenas exist after
            // the first transfers whatever their size; the baseline is taken after them.
            for i in 0..<4 {
                let small = Self.content(256 << 10, seed: 100 + UInt64(i))
                let ref = try await client.upload(small)
                #expect(try await client.getChunk(ref.hash) == small)
            }
            let baseline = try Self.memory(server.pid, "VmHWM")
            let chunkSize = 8 << 20, count = 8
            let data = Self.content(count * chunkSize, seed: 7)
            let chunks = (0..<count).map { Array(data[$0 * chunkSize..<($0 + 1) * chunkSize]) }
            let refs = chunks.map { ChunkRef(hash: ContentHash(digest: SHA256.hash(data: $0)), size: Int64($0.count)) }

            let upStart = ContinuousClock.now
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (chunk, ref) in zip(chunks, refs) { group.addTask { try await client.putChunk(ref.hash, chunk) } }
                try await group.waitForAll()
            }
            let upTime = ContinuousClock.now - upStart
            let afterUpload = try Self.memory(server.pid, "VmHWM")
            for ref in refs { #expect(try await store.size(of: ref.hash) == ref.size) }

            let downStart = ContinuousClock.now
            let back = try await withThrowingTaskGroup(of: (Int, [UInt8]).self) { group in
                for (i, ref) in refs.enumerated() {
                    group.addTask {
                        var bytes: [UInt8] = []
                        bytes.reserveCapacity(chunkSize)
                        _ = try await client.streamChunk(ref.hash) { bytes.append(contentsOf: $0) }
                        return (i, bytes)
                    }
                }
                var all = [[UInt8]](repeating: [], count: count)
                for try await (i, bytes) in group { all[i] = bytes }
                return all
            }
            let downTime = ContinuousClock.now - downStart
            #expect(back.joined().elementsEqual(data), "the 64 MiB came back different")
            for (i, ref) in refs.enumerated() {
                let lo = Int64(i * 1_000_003 % (chunkSize - 4096))
                #expect(try await client.getChunk(ref.hash, range: lo..<(lo + 4096)) == Array(chunks[i][Int(lo)..<Int(lo) + 4096]))
            }
            let afterDownload = try Self.memory(server.pid, "VmHWM")
            let rss = try Self.memory(server.pid, "VmRSS")
            print("s3 memory figures: nimbus serve VmHWM \(baseline / 1024) MiB after warm-up, \(afterUpload / 1024) MiB after 8×8 MiB uploads at once (\(upTime)), \(afterDownload / 1024) MiB after 8×8 MiB downloads at once (\(downTime)); VmRSS now \(rss / 1024) MiB; rise \((afterDownload - baseline) / 1024) MiB")
            #expect(afterDownload - baseline < 48 << 10, "the server's high-water mark rose by \((afterDownload - baseline) / 1024) MiB moving 64 MiB")
        }
    }

    /// SIGKILL while a chunk's body is streaming to S3: no object appears, not even a partial one.
    @Test func killedServerLeavesNoPartialChunk() async throws {
        try await Self.withServer { server, client, store, token in
            _ = try await client.upload(Array("warm".utf8))
            let body = Self.content(8 << 20, seed: 11)
            let hash = ContentHash(digest: SHA256.hash(data: body))
            let conn = try RawConnection(server.url)
            defer { conn.close() }
            #expect(conn.send("PUT /v1/chunks/\(hash) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\nContent-Length: \(body.count)\r\n\r\n"))
            #expect(conn.send(Array(body[0..<(6 << 20)])))
            try await Task.sleep(for: .milliseconds(500))
            await server.kill(SIGKILL)
            try await Task.sleep(for: .milliseconds(500))
            #expect(try await store.size(of: hash) == nil)
            #expect(try await store.open(hash, range: nil) == nil)
        }
    }

    /// A chunk damaged in the bucket: the server sends the status and Content-Length, streams,
    /// and cuts the connection before the last byte; the device never gets a complete wrong body.
    @Test func damagedChunkIsCutBeforeItsLastByte() async throws {
        try await Self.withServer { server, client, store, token in
            let bytes = Self.content(3 << 20, seed: 12)
            let ref = try await client.upload(bytes)
            var damaged = bytes
            damaged[2 << 20] ^= 0x01
            let put = try await store.send(.PUT, key: store.objectKey(ref.hash), body: ByteBuffer(bytes: damaged))
            #expect(put.status == .ok)
            let conn = try RawConnection(server.url)
            defer { conn.close() }
            #expect(conn.send("GET /v1/chunks/\(ref.hash) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\n\r\n"))
            let r = try #require(conn.readResponse(timeout: .seconds(30)))
            #expect(r.status == 200)
            #expect(r.headers["content-length"] == String(bytes.count))
            #expect(!r.complete && r.body.count < bytes.count, "got \(r.body.count) of \(bytes.count) bytes")
            await #expect(throws: (any Error).self) { _ = try await client.getChunk(ref.hash) }
            // A range is served as stored (it cannot be checked against the name).
            #expect(try await client.getChunk(ref.hash, range: 0..<100) == Array(bytes[0..<100]))
        }
    }
}
