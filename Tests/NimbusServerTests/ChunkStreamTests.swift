import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
@testable import NimbusServer
import NimbusTesting
import Testing

/// An upload body arriving in the given pieces, as a request body does.
struct Pieces: AsyncSequence, Sendable {
    typealias Element = ByteBuffer
    let pieces: [ByteBuffer]
    /// Thrown after the pieces instead of ending (a device gone mid-body).
    var failure: (any Error & Sendable)? = nil

    struct AsyncIterator: AsyncIteratorProtocol {
        var rest: ArraySlice<ByteBuffer>
        var failure: (any Error & Sendable)?
        mutating func next() async throws -> ByteBuffer? {
            if let piece = rest.popFirst() { return piece }
            if let failure { throw failure }
            return nil
        }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(rest: pieces[...], failure: failure) }

    /// `bytes` cut into pieces of `size`.
    static func of(_ bytes: ByteBuffer, size: Int) -> Pieces {
        Pieces(pieces: stride(from: 0, to: bytes.readableBytes, by: size).map {
            bytes.getSlice(at: $0, length: Swift.min(size, bytes.readableBytes - $0))!
        })
    }
}

struct DeviceGone: Error {}

/// What every chunk store must do while streaming, as one function run on each store (the
/// directory here, S3 on moto in `S3ChunkStoreTests`): bytes that do not hash to the name, fewer
/// or more bytes than declared, and a body that fails midway all store nothing — also when the
/// chunk was already there (the old copy stays) — and a damaged chunk is cut before its last piece.
enum ChunkStreamConformance {
    static func bytes(_ count: Int, seed: UInt8) -> ByteBuffer {
        ByteBuffer(bytes: (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(seed) &* 7 &+ ($0 >> 9)) })
    }

    static func failure(_ body: () async throws -> Void) async -> (any Error)? {
        do { try await body() } catch { return error }
        return nil
    }

    static func code(_ error: (any Error)?) -> APIErrorCode? { (error as? APIError)?.code }

    /// `corrupt(hash, bytes)` replaces the stored bytes of `hash` behind the store's back.
    static func run(_ store: any ChunkStore, corrupt: @Sendable (ContentHash, ByteBuffer) async throws -> Void) async throws {
        let data = bytes(700_000, seed: 1)
        let hash = ChunkHashing.sha256(data)
        let size = Int64(data.readableBytes)

        // Streamed in pieces, read back whole, in pieces and by range.
        try await store.put(hash, size: size, body: Pieces.of(data, size: 65_536), ifStored: .store)
        #expect(try await store.size(of: hash) == size)
        let reader = try #require(try await store.open(hash, range: nil))
        #expect(reader.length == size)
        var pieces = 0, largest = 0
        var whole = ByteBuffer()
        for try await piece in reader {
            pieces += 1
            largest = max(largest, piece.readableBytes)
            whole.writeImmutableBuffer(piece)
        }
        #expect(whole == data)
        #expect(pieces > 1 && largest <= 1 << 20, "a read comes in bounded pieces: \(pieces) pieces, largest \(largest)")
        #expect(try await store.read(hash, range: 100_000..<100_013) == data.getSlice(at: 100_000, length: 13))
        #expect(try await store.open(hash, range: 699_990..<800_000)?.collect() == data.getSlice(at: 699_990, length: 10))

        // Wrong bytes (only the last piece differs), fewer, more, a body gone midway: nothing stored.
        let other = bytes(300_000, seed: 2)
        let otherHash = ChunkHashing.sha256(other)
        var tampered = other
        tampered.setInteger(UInt8(0xFF) ^ other.getInteger(at: 299_999, as: UInt8.self)!, at: 299_999)
        let half = other.getSlice(at: 0, length: 150_000)!
        let cases: [(String, Pieces, Int64, APIErrorCode?)] = [
            ("wrong last byte", Pieces.of(tampered, size: 50_000), 300_000, .hashMismatch),
            ("fewer bytes than declared", Pieces.of(half, size: 50_000), 300_000, .badRequest),
            ("more bytes than declared", Pieces.of(other, size: 50_000), 299_000, .bodyTooLarge),
            ("device gone midway", Pieces(pieces: Pieces.of(half, size: 50_000).pieces, failure: DeviceGone()), 300_000, nil),
        ]
        for (what, body, declared, expected) in cases {
            for ifStored in [IfStored.store, .skip] {
                let error = await failure { try await store.put(otherHash, size: declared, body: body, ifStored: ifStored) }
                #expect(error != nil, "\(what): accepted")
                if let expected { #expect(code(error) == expected, "\(what): \(String(describing: error))") }
                else { #expect(error is DeviceGone, "\(what): the body's own error comes back: \(String(describing: error))") }
                #expect(try await store.size(of: otherHash) == nil, "\(what) (\(ifStored)): something was stored")
            }
        }
        // The same against a chunk that is stored: it stays as it was.
        let again = await failure {
            try await store.put(hash, size: size, body: Pieces(pieces: Pieces.of(data, size: 65_536).pieces.dropLast() + [bytes(data.readableBytes % 65_536, seed: 9)]),
                                ifStored: .store)
        }
        #expect(code(again) == .hashMismatch)
        #expect(try await store.read(hash, range: nil) == data)
        // Skipped because stored, yet still checked: the answer does not depend on what is stored.
        var wrongData = data
        wrongData.setInteger(UInt8(0xFF) ^ data.getInteger(at: 5, as: UInt8.self)!, at: 5)
        let skipped = await failure { try await store.put(hash, size: size, body: Pieces.of(wrongData, size: 65_536), ifStored: .skip) }
        #expect(code(skipped) == .hashMismatch, "\(String(describing: skipped))")

        // A damaged chunk: a whole read stops before its last piece; a range is served as stored.
        var damaged = data
        damaged.setInteger(UInt8(0x5A) ^ data.getInteger(at: 1234, as: UInt8.self)!, at: 1234)
        try await corrupt(hash, damaged)
        let bad = try #require(try await store.open(hash, range: nil))
        var delivered = 0
        let cut = await failure { for try await piece in bad { delivered += piece.readableBytes } }
        #expect(code(cut) == .unavailable, "\(String(describing: cut))")
        #expect((cut as? APIError)?.message.contains("damaged") == true)
        #expect(delivered < data.readableBytes, "the last byte of a damaged chunk was delivered")
        #expect(try await store.read(hash, range: 1230..<1240) == damaged.getSlice(at: 1230, length: 10))

        // Absent chunks.
        #expect(try await store.open(otherHash, range: nil) == nil)
        #expect(try await store.open(otherHash, range: 0..<10) == nil)

        // Several at once (the small files of a commit batch): each answered on its own, in
        // order; wrong bytes store nothing and leave the others; one already stored, and one
        // twice in the batch, are fine.
        let smalls = (0..<5).map { bytes(1_000 + $0 * 4_097, seed: UInt8(10 + $0)) }
        let smallHashes = smalls.map(ChunkHashing.sha256)
        var wrongSmall = smalls[2]
        wrongSmall.setInteger(UInt8(0xFF) ^ smalls[2].getInteger(at: 0, as: UInt8.self)!, at: 0)
        let batch: [(hash: ContentHash, bytes: ByteBuffer, ifStored: IfStored)] = [
            (smallHashes[0], smalls[0], .store), (smallHashes[1], smalls[1], .skip), (smallHashes[2], wrongSmall, .store),
            (hash, data, .skip), (smallHashes[3], smalls[3], .store), (smallHashes[3], smalls[3], .store), (smallHashes[4], smalls[4], .skip),
        ]
        let answers = await store.putAll(batch)
        #expect(answers.count == batch.count)
        for (i, answer) in answers.enumerated() where i != 2 { #expect(answer == nil, "batch entry \(i): \(String(describing: answer))") }
        #expect(code(answers[2]) == .hashMismatch, "\(String(describing: answers[2]))")
        #expect(try await store.size(of: smallHashes[2]) == nil)
        for i in [0, 1, 3, 4] { #expect(try await store.read(smallHashes[i], range: nil) == smalls[i], "batch chunk \(i)") }
        #expect(try await store.read(hash, range: 1230..<1240) == damaged.getSlice(at: 1230, length: 10), "a stored chunk skipped is left as it is")
    }
}

@Suite struct ChunkStreamTests {
    @Test func directoryStoreStreamsAndChecks() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-chunks-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try DirectoryChunkStore(root: dir)
        try await ChunkStreamConformance.run(store) { hash, bytes in
            try Data(bytes.readableBytesView).write(to: URL(fileURLWithPath: store.path(hash)))
        }
        // Failed puts leave no temp file behind.
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir + "/tmp").isEmpty)
    }

    @Test func tallyChecksAtTheLastByte() throws {
        let data = ChunkStreamConformance.bytes(1000, seed: 3)
        var tally = ChunkTally(hash: ChunkHashing.sha256(data), expected: 1000)
        try tally.take(data.getSlice(at: 0, length: 999)!)
        var wrong = tally
        #expect(throws: ChunkTally.Failure.self) { try wrong.take(ByteBuffer(bytes: [data.getInteger(at: 999, as: UInt8.self)! ^ 1])) }
        try tally.take(data.getSlice(at: 999, length: 1)!)
        try tally.end()
        var short = ChunkTally(hash: nil, expected: 10)
        try short.take(ByteBuffer(bytes: [1, 2, 3]))
        #expect(throws: ChunkTally.Failure.tooShort(seen: 3)) { try short.end() }
        #expect(throws: ChunkTally.Failure.tooLong(seen: 11)) { try short.take(ByteBuffer(repeating: 0, count: 8)) }
        var empty = ChunkTally(hash: ChunkHashing.sha256(ByteBuffer()), expected: 0)
        try empty.end()
    }
}

/// The chunk routes' edge: a body streams to the store, so its length must be known up front.
@Suite struct ChunkRouteStreamTests {
    @Test func chunkedUploadIsRefusedWithAReason() async throws {
        try await LiveServer.with { s in
            let token = try await s.token()
            let hash = ChunkHashing.sha256(ByteBuffer(string: "hello"))
            let conn = try RawConnection(s.url)
            defer { conn.close() }
            #expect(conn.send("PUT /v1/chunks/\(hash) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(token)\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"))
            let r = try #require(conn.readResponse(timeout: .seconds(10)))
            #expect(r.status == 400)
            #expect(r.text.contains("\"bad_request\"") && r.text.contains("needs its Content-Length"), "\(r.text)")
            #expect(try await s.app.chunks.size(of: hash) == nil)
        }
    }
}
