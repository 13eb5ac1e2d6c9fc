import Chunking
import Foundation
import Glibc
import NimbusCore
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

    /// A file that holds more than its size said when it was chunked (one still growing; here a
    /// /proc file, which says it is empty) chunks as its bytes do; so do small files, and the
    /// first `length` bytes of one.
    @Test func aFileLongerThanItsSizeSaidChunksAsItsBytes() throws {
        let small = Chunker(minSize: 16, avgSize: 64, maxSize: 256)
        let fd = open("/proc/self/environ", O_RDONLY)
        try #require(fd >= 0)
        defer { close(fd) }
        var st = stat()
        #expect(fstat(fd, &st) == 0 && st.st_size == 0)
        let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: "/proc/self/environ")))
        #expect(bytes.count > 0)
        #expect(try small.chunks(fd: fd) == small.chunks(of: bytes))
        #expect(try c.chunks(fd: fd) == c.chunks(of: bytes))
        for size in [0, 1, 4095, 4096, 300_000] {
            let data = noise(size, seed: UInt64(size) + 7)
            let path = NSTemporaryDirectory() + "/nimbus-chunk-\(UUID().uuidString)"
            FileManager.default.createFile(atPath: path, contents: Data(data))
            defer { unlink(path) }
            let f = open(path, O_RDONLY)
            try #require(f >= 0)
            defer { close(f) }
            #expect(try c.chunks(fd: f) == c.chunks(of: data), "\(size) bytes")
            #expect(try small.chunks(fd: f) == small.chunks(of: data), "\(size) bytes, small chunks")
            #expect(try c.chunks(fd: f, length: Int64(size / 2)) == c.chunks(of: Array(data.prefix(size / 2))), "\(size) bytes, half")
        }
    }

    /// A sparse file chunks as its bytes do (holes are zeros), without reading its holes: data,
    /// a hole of several chunks, data that is zeros, data again, and a hole up to the end. A file
    /// of 64 GiB that is one hole gives 16,384 chunks of one zero chunk's hash.
    @Test func aSparseFileChunksAsItsBytesWithoutReadingItsHoles() throws {
        let std = Chunker.standard
        let zero = try #require(std.zeroChunk, "zeros never cut under the standard parameters")
        #expect(zero.size == Int64(std.maxSize))
        let path = NSTemporaryDirectory() + "/nimbus-sparse-\(UUID().uuidString)"
        defer { unlink(path) }
        let fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        try #require(fd >= 0)
        defer { close(fd) }
        var whole = [UInt8]()
        func put(_ bytes: [UInt8], at offset: Int) {
            _ = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, off_t(offset)) }
            if whole.count < offset { whole += [UInt8](repeating: 0, count: offset - whole.count) }
            whole.replaceSubrange(offset..<min(whole.count, offset + bytes.count), with: bytes)
        }
        put(noise(3 << 20 + 777, seed: 5), at: 0)
        put([UInt8](repeating: 0, count: 9 << 20), at: 23 << 20)          // written zeros
        put(noise(5 << 20 + 3, seed: 6), at: 40 << 20)                    // after a hole
        let size = 70 << 20 + 11                                          // a hole up to the end
        ftruncate(fd, off_t(size))
        whole += [UInt8](repeating: 0, count: size - whole.count)
        let spans = try std.chunks(fd: fd)
        #expect(spans == std.chunks(of: whole), "the same chunks as reading every byte")
        #expect(spans.filter { $0.ref == zero }.count >= 8, "holes and zeros come as the zero chunk")

        ftruncate(fd, 0)
        ftruncate(fd, off_t(64) << 30)
        let huge = try std.chunks(fd: fd)
        #expect(huge.count == 16_384 && huge.allSatisfy { $0.ref == zero })
        #expect(huge.last.map { $0.offset + $0.ref.size } == Int64(64) << 30)
    }
}
