import Foundation
import Glibc
import NimbusCore
import SyncEngine
import Testing

/// Deterministic pseudo-random bytes (xorshift), so failures replay.
func noise(_ count: Int, seed: UInt64) -> [UInt8] {
    var s = seed | 1
    var out = [UInt8](repeating: 0, count: count)
    for i in 0..<count {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17
        out[i] = UInt8(truncatingIfNeeded: s >> 24)
    }
    return out
}

@Suite struct ChunkerTests {
    let c = Chunker.standard

    @Test func sizesStayWithinBoundsAndCoverTheData() {
        let data = noise(24 << 20, seed: 7)
        let spans = c.chunks(of: data)
        #expect(spans.reduce(0) { $0 + $1.ref.size } == Int64(data.count))
        for (i, s) in spans.enumerated() {
            #expect(s.ref.size <= Int64(c.maxSize))
            if i < spans.count - 1 { #expect(s.ref.size >= Int64(c.minSize)) }
            if i > 0 { #expect(s.offset == spans[i - 1].offset + spans[i - 1].ref.size) }
        }
        // Average near 1 MiB (normalized chunking): between 0.5 and 2 MiB on 24 MiB of noise.
        let avg = data.count / spans.count
        #expect(avg > 512 << 10 && avg < 2 << 20, "average chunk \(avg)")
    }

    @Test func anEditInTheMiddleRechunksLittle() {
        var data = noise(32 << 20, seed: 11)
        let before = c.chunks(of: data)
        // Insert 100 bytes in the middle: only the chunks around the insertion change.
        data.insert(contentsOf: [UInt8](repeating: 0xab, count: 100), at: 16 << 20)
        let after = c.chunks(of: data)
        let old = Set(before.map(\.ref.hash))
        let changed = after.filter { !old.contains($0.ref.hash) }
        #expect(changed.count <= 2, "\(changed.count) of \(after.count) chunks changed")
        let changedBytes = changed.reduce(0) { $0 + $1.ref.size }
        #expect(changedBytes <= Int64(2 * c.maxSize))
    }

    @Test func smallAndEmptyData() {
        #expect(c.chunks(of: []).isEmpty)
        let one = c.chunks(of: [1, 2, 3])
        #expect(one.count == 1 && one[0].ref.size == 3)
        // Same bytes, same chunks (on every device).
        #expect(c.chunks(of: noise(3 << 20, seed: 5)) == c.chunks(of: noise(3 << 20, seed: 5)))
    }

    @Test func fileChunkingMatchesInMemoryChunking() throws {
        let data = noise(9 << 20 + 12345, seed: 3)
        let path = NSTemporaryDirectory() + "/nimbus-chunk-\(UUID().uuidString)"
        FileManager.default.createFile(atPath: path, contents: Data(data))
        defer { unlink(path) }
        let fd = open(path, O_RDONLY)
        #expect(fd >= 0)
        defer { close(fd) }
        #expect(try c.chunks(fd: fd) == c.chunks(of: data))
    }
}
