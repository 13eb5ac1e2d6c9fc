import Crypto
import NIOCore
import NimbusCore
import NimbusProtocol
import Synchronization

/// Counts and hashes a chunk's bytes as they pass, piece by piece, so that neither an upload nor
/// a download ever needs the whole chunk in memory.
///
/// The check happens at the **last** byte: `take` of the piece that completes `expected` bytes
/// hashes it in and compares with `hash` before returning, so a caller that forwards a piece
/// only after `take` accepted it never forwards the final byte of wrong content. On an upload
/// that means the store never receives a complete object (an S3 PUT whose body stops short of
/// its Content-Length creates nothing; a temp file is never renamed); on a download the
/// connection is cut one piece short, which the client sees as a truncated body.
struct ChunkTally {
    enum Failure: Error, Equatable {
        /// More bytes than `expected` arrived (`seen` counts them, up to the piece that overran).
        case tooLong(seen: Int64)
        /// The bytes ended after `seen` of `expected`.
        case tooShort(seen: Int64)
        /// All `expected` bytes arrived and they hash to `actual`, not to the chunk's name.
        case mismatch(actual: ContentHash)
    }

    /// The chunk the bytes must hash to; nil counts only (a range of a chunk cannot be hashed).
    let hash: ContentHash?
    let expected: Int64
    private(set) var seen: Int64 = 0
    private var hasher = SHA256()
    private var verified = false

    init(hash: ContentHash?, expected: Int64) {
        self.hash = hash
        self.expected = expected
    }

    /// Accepts `piece` if it keeps within `expected` bytes and, when it completes them, the
    /// whole hashes to `hash`.
    mutating func take(_ piece: ByteBuffer) throws(Failure) {
        let n = Int64(piece.readableBytes)
        guard n <= expected - seen else { throw .tooLong(seen: seen + n) }
        seen += n
        guard hash != nil else { return }
        piece.withUnsafeReadableBytes { hasher.update(bufferPointer: $0) }
        if seen == expected { try verify() }
    }

    /// The bytes ended: they must be all `expected` of them (and, for an empty chunk, hash right).
    mutating func end() throws(Failure) {
        guard seen == expected else { throw .tooShort(seen: seen) }
        if hash != nil && !verified { try verify() }
    }

    private mutating func verify() throws(Failure) {
        verified = true
        let actual = ContentHash(digest: hasher.finalize())
        if let hash, actual != hash { throw .mismatch(actual: actual) }
    }

    /// What an upload's failure tells the device.
    static func uploadError(_ failure: Failure, hash: ContentHash, expected: Int64) -> APIError {
        switch failure {
        case .tooLong:
            return APIError(.bodyTooLarge, "the body of chunk \(hash) is longer than its Content-Length of \(expected) bytes; nothing was stored — send the chunk's exact size")
        case .tooShort(let seen):
            return APIError(.badRequest, "the body of chunk \(hash) ended after \(seen) of its \(expected) bytes; nothing was stored — upload it again")
        case .mismatch:
            return APIError(.hashMismatch, "the uploaded bytes do not hash to \(hash); nothing was stored — re-read the chunk and upload it again")
        }
    }

    /// What a read's failure tells the device (the stored bytes are not what their name says).
    static func readError(_ failure: Failure, hash: ContentHash, store: String) -> APIError {
        let what: String
        switch failure {
        case .tooLong(let seen): what = "gave more than the \(seen) bytes it announced"
        case .tooShort(let seen): what = "ended after \(seen) bytes"
        case .mismatch(let actual): what = "holds bytes that hash to \(actual)"
        }
        return APIError(.unavailable, "chunk \(hash) is damaged in the \(store) (it \(what)); re-upload it from a device that has it")
    }
}

/// A chunk's bytes (or a range of them) being read from a `ChunkStore`: exactly `length` bytes in
/// pieces of bounded size, pulled one at a time, so a slow reader holds the store back rather
/// than the server's memory filling up. Iterate once.
///
/// A whole-chunk reader checks the bytes as they pass (`ChunkTally`): a damaged chunk throws
/// before its last piece is delivered, so a response streaming it is cut short rather than
/// completed with wrong bytes.
public struct ChunkReader: AsyncSequence, Sendable {
    public typealias Element = ByteBuffer
    /// How many bytes the reader delivers: the range asked for, or the whole chunk.
    public let length: Int64
    private let produce: @Sendable () -> Pieces

    /// The next piece, or nil after the last one.
    typealias Pieces = () async throws -> ByteBuffer?

    /// A reader of `length` bytes of `chunk` that `pieces` delivers (made once per iteration).
    /// With `whole` they are the whole chunk and must hash to its name; `store` names the store
    /// in the error when they do not.
    init(length: Int64, of chunk: ContentHash, whole: Bool, store: String, pieces: @escaping @Sendable () -> Pieces) {
        self.length = length
        produce = {
            let next = pieces()
            var tally = ChunkTally(hash: whole ? chunk : nil, expected: length)
            return {
                do {
                    guard let piece = try await next() else {
                        try tally.end()
                        return nil
                    }
                    try tally.take(piece)
                    return piece
                } catch let failure as ChunkTally.Failure {
                    throw ChunkTally.readError(failure, hash: chunk, store: store)
                }
            }
        }
    }

    /// No bytes (an empty range of `chunk`).
    static func empty(_ chunk: ContentHash) -> ChunkReader {
        ChunkReader(length: 0, of: chunk, whole: false, store: "") { { nil } }
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        let pull: Pieces
        public mutating func next() async throws -> ByteBuffer? { try await pull() }
    }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(pull: produce()) }

    /// All the bytes in one buffer (tests and tools; the server streams).
    public func collect() async throws -> ByteBuffer {
        var all = ByteBuffer()
        for try await piece in self { all.writeImmutableBuffer(piece) }
        return all
    }
}

/// The bytes of an upload on their way to a store, checked as they pass (`ChunkTally`): the piece
/// that would complete wrong content, or overrun the declared size, is never handed on — the
/// sequence throws instead, which aborts whatever consumes it (the store then has an incomplete
/// body, which it never makes a chunk of). The first failure is also kept in `failure`, for a
/// consumer (an HTTP client) that reports its own error rather than the one the body threw.
struct CheckedUpload<Base: AsyncSequence & Sendable>: AsyncSequence, Sendable where Base.Element == ByteBuffer {
    typealias Element = ByteBuffer
    let base: Base
    let hash: ContentHash
    let size: Int64
    let failure = FailureBox()

    final class FailureBox: Sendable {
        private let first = Mutex<(any Error)?>(nil)
        func record(_ error: any Error) { first.withLock { if $0 == nil { $0 = error } } }
        var error: (any Error)? { first.withLock { $0 } }
    }

    struct AsyncIterator: AsyncIteratorProtocol {
        var base: Base.AsyncIterator
        var tally: ChunkTally
        let failure: FailureBox

        mutating func next() async throws -> ByteBuffer? {
            do {
                guard let piece = try await base.next() else {
                    try tally.end()
                    return nil
                }
                try tally.take(piece)
                return piece
            } catch let f as ChunkTally.Failure {
                let error = ChunkTally.uploadError(f, hash: tally.hash!, expected: tally.expected)
                failure.record(error)
                throw error
            } catch {
                failure.record(error)
                throw error
            }
        }
    }

    func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: base.makeAsyncIterator(), tally: ChunkTally(hash: hash, expected: size), failure: failure)
    }

    /// Reads and checks every byte without storing them (a chunk already stored: the answer is
    /// the same as for a first upload, `hash_mismatch` included).
    func drain() async throws {
        for try await _ in self {}
    }
}

/// One buffer as an upload body (tests, tools, `ChunkStore.put(_:bytes:ifStored:)`).
struct SingleBuffer: AsyncSequence, Sendable {
    typealias Element = ByteBuffer
    let buffer: ByteBuffer
    struct AsyncIterator: AsyncIteratorProtocol {
        var buffer: ByteBuffer?
        mutating func next() async -> ByteBuffer? {
            defer { buffer = nil }
            return buffer
        }
    }
    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(buffer: buffer.readableBytes > 0 ? buffer : nil) }
}

extension ChunkStore {
    /// Stores `bytes` (all in memory) as chunk `hash`; see `put(_:size:body:ifStored:)`.
    public func put(_ hash: ContentHash, bytes: ByteBuffer, ifStored: IfStored) async throws {
        try await put(hash, size: Int64(bytes.readableBytes), body: SingleBuffer(buffer: bytes), ifStored: ifStored)
    }

    /// Bytes `range` of the chunk (all of it when nil) in one buffer, or nil if it is not stored
    /// (tests and tools; the server streams with `open`).
    public func read(_ hash: ContentHash, range: Range<Int64>?) async throws -> ByteBuffer? {
        try await open(hash, range: range)?.collect()
    }
}

/// Pieces of a streamed transfer: big enough to keep system calls and hops to the thread pool
/// few, small enough that a transfer holds a few hundred KiB at most.
enum ChunkPiece {
    static let size = 128 << 10
}
