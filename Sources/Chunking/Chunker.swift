import Crypto
import Glibc
import NimbusCore
import NimbusProtocol

/// Content-defined chunking (a Gear rolling hash with FastCDC's normalized cut masks).
///
/// Why content-defined: an edit in the middle of a big file must change only the chunks around
/// the edit, so the upload after an edit is about one chunk and the server deduplicates the rest.
/// Cut points depend only on the bytes of the last 64 positions, so after an insertion the cuts
/// re-align with the old ones within a chunk or two.
///
/// Every device must cut identically (otherwise equal files would not share chunks), so the gear
/// table is generated from a fixed seed and the parameters are constants of the format.
public struct Chunker: Sendable {
    public let minSize: Int
    public let avgSize: Int
    public let maxSize: Int
    /// Stricter mask (more bits) before `avgSize`, looser after: chunk sizes cluster near avg.
    let maskSmall: UInt64
    let maskLarge: UInt64

    /// min 256 KiB / avg 1 MiB / max 4 MiB (docs/sync.md).
    public static let standard = Chunker(minSize: 256 << 10, avgSize: 1 << 20, maxSize: 4 << 20)

    /// `avgSize` must be a power of two; `minSize < avgSize < maxSize`.
    public init(minSize: Int, avgSize: Int, maxSize: Int) {
        precondition(minSize > 0 && minSize < avgSize && avgSize < maxSize && avgSize & (avgSize - 1) == 0)
        self.minSize = minSize
        self.avgSize = avgSize
        self.maxSize = maxSize
        let bits = avgSize.trailingZeroBitCount
        // Masks on the top bits: those mix in all of the last 64 bytes.
        maskSmall = ~UInt64(0) << UInt64(64 - (bits + 2))
        maskLarge = ~UInt64(0) << UInt64(64 - (bits - 2))
    }

    /// 256 pseudo-random words from splitmix64 with a fixed seed (part of the chunk format).
    static let gear: [UInt64] = {
        var s: UInt64 = 0x6e696d6275732d31  // "nimbus-1"
        return (0..<256).map { _ in
            s &+= 0x9e3779b97f4a7c15
            var z = s
            z = (z ^ (z >> 30)) &* 0xbf58476d1ce4e5b9
            z = (z ^ (z >> 27)) &* 0x94d049bb133111eb
            return z ^ (z >> 31)
        }
    }()

    /// Length of the chunk that starts at `bytes[0]`. `bytes` holds at least `maxSize` bytes unless
    /// it is the end of the data; the result is in 1...min(bytes.count, maxSize).
    public func cut(_ bytes: UnsafeRawBufferPointer) -> Int {
        let n = bytes.count
        if n <= minSize { return n }
        let end = min(n, maxSize)
        let normal = min(end, avgSize)
        var h: UInt64 = 0
        var i = minSize
        Self.gear.withUnsafeBufferPointer { g in
            while i < normal {
                h = (h << 1) &+ g[Int(bytes[i])]
                if h & maskSmall == 0 { return }
                i += 1
            }
            while i < end {
                h = (h << 1) &+ g[Int(bytes[i])]
                if h & maskLarge == 0 { return }
                i += 1
            }
        }
        return i < end ? i + 1 : end
    }

    /// The chunks of `bytes` (whole data in memory; tests and small files).
    public func chunks(of bytes: [UInt8]) -> [ChunkSpan] {
        var out: [ChunkSpan] = []
        bytes.withUnsafeBytes { all in
            var off = 0
            while off < all.count {
                let rest = UnsafeRawBufferPointer(rebasing: all[off...])
                let len = cut(rest)
                let digest = SHA256.hash(data: UnsafeRawBufferPointer(rebasing: rest[..<len]))
                out.append(ChunkSpan(offset: Int64(off), ref: ChunkRef(hash: ContentHash(digest: digest), size: Int64(len))))
                off += len
            }
        }
        return out
    }

    /// The chunk a run of zeros at least `maxSize` long starts with, when it is a whole `maxSize`
    /// chunk (the rolling hash of zeros never cuts): then every such run is cut into these, and
    /// their hash is computed once. Nil for parameters under which zeros do cut.
    public var zeroChunk: ChunkRef? {
        let zeros = UnsafeMutableRawBufferPointer.allocate(byteCount: maxSize, alignment: 16)
        defer { zeros.deallocate() }
        zeros.initializeMemory(as: UInt8.self, repeating: 0)
        guard cut(UnsafeRawBufferPointer(zeros)) == maxSize else { return nil }
        return ChunkRef(hash: ContentHash(digest: SHA256.hash(data: UnsafeRawBufferPointer(zeros))), size: Int64(maxSize))
    }

    /// `standard.zeroChunk`, computed once.
    static let standardZero = Chunker.standard.zeroChunk

    /// Whether every byte is zero (stops at the first that is not: ordinary data costs nothing).
    static func allZero(_ b: UnsafeRawBufferPointer) -> Bool {
        var i = 0
        let n = b.count
        while i + 8 <= n {
            if b.loadUnaligned(fromByteOffset: i, as: UInt64.self) != 0 { return false }
            i += 8
        }
        while i < n {
            if b[i] != 0 { return false }
            i += 1
        }
        return true
    }

    /// The chunks of the file open at `fd`, read front to back through a window of 2 × maxSize
    /// (each byte is read once). Holes (`SEEK_DATA`) of at least a whole chunk are not read: they
    /// cut as zeros do, into `zeroChunk`s, so a sparse file of gigabytes chunks at once; a chunk
    /// of data that is all zeros takes that hash without hashing. With `length`, only the file's
    /// first `length` bytes are chunked (bytes past a file's size are not its content). Throws the
    /// errno of a failed read.
    public func chunks(fd: Int32, length: Int64? = nil) throws(ChunkReadError) -> [ChunkSpan] {
        var out: [ChunkSpan] = []
        // Not zeroed: only the pages a read fills are touched (a small file costs a small file).
        let buf = UnsafeMutableRawBufferPointer.allocate(byteCount: 2 * maxSize, alignment: 16)
        defer { buf.deallocate() }
        var filled = 0, start = 0
        var fileOffset: Int64 = 0, consumed: Int64 = 0
        var eof = false
        let standard = Self.standard
        let zero = (minSize, avgSize, maxSize) == (standard.minSize, standard.avgSize, standard.maxSize) ? Self.standardZero : zeroChunk
        var st = stat()
        let size: Int64 = min(fstat(fd, &st) == 0 ? Int64(st.st_size) : Int64.max, length ?? Int64.max)
        // Where the data after `consumed` starts, as last asked (a hole runs up to it).
        var nextData: Int64 = -1
        while true {
            // At a chunk's start with nothing of it read yet, inside a hole that holds a whole
            // chunk or more: those chunks are zeros, known without reading.
            if let zero, start == filled, consumed < size {
                if nextData < consumed {
                    let d = lseek(fd, off_t(consumed), 3 /* SEEK_DATA */)
                    nextData = d >= 0 ? Int64(d) : (errno == ENXIO ? size : consumed)
                }
                let holeEnd = min(nextData, size)
                if holeEnd - consumed >= zero.size {
                    let whole = (holeEnd - consumed) / zero.size
                    for _ in 0..<whole {
                        out.append(ChunkSpan(offset: consumed, ref: zero))
                        consumed += zero.size
                    }
                    fileOffset = consumed
                    (start, filled) = (0, 0)
                    continue
                }
            }
            // Refill: keep at least maxSize bytes ahead of `start` unless at the end of the file.
            if !eof && filled - start < maxSize {
                if start > 0 {
                    _ = memmove(buf.baseAddress!, buf.baseAddress! + start, filled - start)
                    filled -= start
                    start = 0
                }
                while filled < buf.count {
                    let want = Int(min(Int64(buf.count - filled), max(0, (length ?? Int64.max) - fileOffset)))
                    if want == 0 { eof = true; break }
                    let r = pread(fd, buf.baseAddress! + filled, want, off_t(fileOffset))
                    if r < 0 { if errno == EINTR { continue }; throw ChunkReadError(errno: errno) }
                    if r == 0 { eof = true; break }
                    filled += r
                    fileOffset += Int64(r)
                }
            }
            if start == filled { break }
            let rest = UnsafeRawBufferPointer(rebasing: buf[start..<filled])
            let len = cut(rest)
            let bytes = UnsafeRawBufferPointer(rebasing: rest[..<len])
            let ref: ChunkRef
            if let zero, Int64(len) == zero.size, Self.allZero(bytes) {
                ref = zero
            } else {
                ref = ChunkRef(hash: ContentHash(digest: SHA256.hash(data: bytes)), size: Int64(len))
            }
            let span = ChunkSpan(offset: consumed, ref: ref)
            out.append(span)
            start += Int(span.ref.size)
            consumed += span.ref.size
            if ref == zero, !eof {
                // Zeros: a hole may follow. The next chunk starts from an empty window, so the
                // hole check above sees it (cut points depend only on a chunk's own bytes).
                fileOffset = consumed
                (start, filled) = (0, 0)
            }
        }
        return out
    }
}

/// One chunk of a file: where it starts and its reference (hash + size).
public struct ChunkSpan: Sendable, Hashable {
    public var offset: Int64
    public var ref: ChunkRef
    public var range: Range<Int64> { offset..<(offset + ref.size) }
}

/// A file the server cannot take: more chunks than a version may have
/// (`ProtocolLimits.maxChunksPerItem`). It stays on this device, and says so.
public struct TooLargeToSync: Error, CustomStringConvertible {
    public let size: Int64
    /// Its chunks when counted; nil when its size alone rules it out (not chunked at all).
    public let chunks: Int?
    public init(size: Int64, chunks: Int?) {
        self.size = size
        self.chunks = chunks
    }
    public var description: String {
        let limit = Int64(ProtocolLimits.maxChunksPerItem)
        let what = chunks.map { "\(size) bytes in \($0) chunks" } ?? "\(size) bytes"
        return "too large to sync: \(what); the server takes at most \(limit) chunks per file (about \(limit * Int64(Chunker.standard.avgSize) >> 30) GiB of typical content, never over \(limit * Int64(Chunker.standard.maxSize) >> 30) GiB). It stays on this device only; make it smaller or keep it outside the mount"
    }
}

public struct ChunkReadError: Error, CustomStringConvertible {
    public let errno: Int32
    public var description: String { "cannot read the file to chunk it: \(String(cString: strerror(errno)))" }
}
