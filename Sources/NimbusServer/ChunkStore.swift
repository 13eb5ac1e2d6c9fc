import Crypto
import Foundation
import NIOCore
import NIOPosix
import NimbusCore
import NimbusProtocol

#if canImport(Glibc)
import Glibc
#endif

/// Where chunk bytes live. Chunks are immutable and addressed by their SHA-256, so a chunk that
/// exists is always complete and correct. Bodies stream both ways in pieces (`ChunkPiece.size`):
/// no store holds a whole chunk in memory. The directory store is the default; `S3ChunkStore`
/// serves scaled deployments.
public protocol ChunkStore: Sendable {
    /// Stores chunk `hash` from `body`, which must deliver exactly `size` bytes hashing to `hash`
    /// (checked as they pass, `CheckedUpload`); otherwise nothing is stored and the error says
    /// why (`hash_mismatch`, `body_too_large` for more bytes, `bad_request` for fewer). Errors
    /// `body` throws (a client gone mid-body) come back as they are. A crash or a failure at any
    /// point leaves the chunk whole or absent. Idempotent.
    /// `ifStored` says what to do when the chunk is already there: `.skip` reads and checks the
    /// body without storing it; `.store` does the whole durable write again, so that the answer's
    /// timing does not tell the caller whether the chunk existed (an upload by an account that
    /// does not own the chunk).
    func put<Body: AsyncSequence & Sendable>(_ hash: ContentHash, size: Int64, body: Body, ifStored: IfStored) async throws
        where Body.Element == ByteBuffer
    /// The chunk's size, or nil if it is not stored.
    func size(of hash: ContentHash) async throws -> Int64?
    /// A reader of bytes `range` of the chunk (all of it when nil: then checked against its name
    /// as it streams), or nil if it is not stored. A range past the end is cut at the end.
    func open(_ hash: ContentHash, range: Range<Int64>?) async throws -> ChunkReader?
    /// Removes the chunk's bytes; a chunk that is not stored is not an error. Only the garbage
    /// collector calls it, and only for a chunk no account owns and no upload claims
    /// (`ChunkCollector`): chunks are shared by content between accounts.
    func delete(_ hash: ContentHash) async throws
    /// Stores each of `chunks` (all in memory: the small files of a commit batch) as `put` would,
    /// each answered on its own (nil: stored).
    func putAll(_ chunks: [(hash: ContentHash, bytes: ByteBuffer, ifStored: IfStored)]) async -> [(any Error)?]
}

extension ChunkStore {
    /// One `put` after the other.
    public func putAll(_ chunks: [(hash: ContentHash, bytes: ByteBuffer, ifStored: IfStored)]) async -> [(any Error)?] {
        var out: [(any Error)?] = []
        for c in chunks {
            do { try await put(c.hash, bytes: c.bytes, ifStored: c.ifStored); out.append(nil) } catch { out.append(error) }
        }
        return out
    }
}

/// What `ChunkStore.put` does with a chunk that is already stored.
public enum IfStored: Sendable {
    case skip, store
}

public enum ChunkHashing {
    public static func sha256(_ bytes: ByteBuffer) -> ContentHash {
        var hasher = SHA256()
        bytes.withUnsafeReadableBytes { hasher.update(bufferPointer: $0) }
        return ContentHash(digest: hasher.finalize())
    }
}

/// Chunks as files `ROOT/ab/cdef…` (first two hex digits as a fan-out folder). A put streams the
/// body into a temp file in `ROOT/tmp` (checking size and hash as it goes), fsyncs it, renames it
/// into place and fsyncs the folder, so a crash leaves either no chunk or a whole one (plus, at
/// worst, a temp file that the next start removes). Reads stream `ChunkPiece.size` pieces with
/// pread on the thread pool.
public struct DirectoryChunkStore: ChunkStore {
    public let root: String
    let pool: NIOThreadPool

    public init(root: String, threadPool: NIOThreadPool = .singleton) throws {
        self.root = root
        self.pool = threadPool
        let fm = FileManager.default
        try PrivateFiles.directory(root)
        try PrivateFiles.directory(root + "/tmp")
        // Leftovers of puts interrupted by a crash.
        for name in (try? fm.contentsOfDirectory(atPath: root + "/tmp")) ?? [] {
            try? fm.removeItem(atPath: root + "/tmp/" + name)
        }
    }

    public func path(_ hash: ContentHash) -> String {
        let hex = hash.hex
        return "\(root)/\(hex.prefix(2))/\(hex.dropFirst(2))"
    }

    public func put<Body: AsyncSequence & Sendable>(_ hash: ContentHash, size: Int64, body: Body, ifStored: IfStored) async throws
        where Body.Element == ByteBuffer {
        let upload = CheckedUpload(base: body, hash: hash, size: size)
        let final = path(hash)
        // Rewriting replaces the file with identical bytes by rename: readers keep theirs.
        if ifStored == .skip, try await pool.runIfActive({ access(final, F_OK) == 0 }) {
            try await upload.drain()
            return
        }
        let file = try await pool.runIfActive { try TempChunkFile(root: root) }
        do {
            var pending = ByteBuffer()
            for try await piece in upload {
                pending.writeImmutableBuffer(piece)
                if pending.readableBytes >= ChunkPiece.size {
                    let full = pending
                    try await pool.runIfActive { try file.write(full) }
                    pending.clear()
                }
            }
            let rest = pending
            try await pool.runIfActive {
                try file.write(rest)
                try file.commit(as: final)
            }
        } catch {
            file.discard()
            throw error
        }
    }

    /// In one hop to the thread pool: each chunk's bytes checked against its name and written to
    /// a temp file, its writeback started; then each file fsynced and renamed into place, and each
    /// fan-out folder fsynced once. A chunk
    /// is whole or absent after a crash at any point, as with `put`.
    public func putAll(_ chunks: [(hash: ContentHash, bytes: ByteBuffer, ifStored: IfStored)]) async -> [(any Error)?] {
        let out: [(any Error)?] = chunks.map { c in
            let actual = ChunkHashing.sha256(c.bytes)
            return actual == c.hash ? nil : ChunkTally.uploadError(.mismatch(actual: actual), hash: c.hash, expected: Int64(c.bytes.readableBytes))
        }
        let checked = out
        do {
            return try await pool.runIfActive { [root] in
                var out = checked
                var folders = Set<String>()
                // Every file written and its writeback started before the first fsync: the
                // filesystem writes them out together, and the fsyncs after the first find their
                // blocks on the way or already down (one journal commit for the lot, not one each).
                var written: [(index: Int, file: TempChunkFile, final: String)] = []
                for (i, c) in chunks.enumerated() where out[i] == nil {
                    let final = path(c.hash)
                    if c.ifStored == .skip, access(final, F_OK) == 0 { continue }
                    var file: TempChunkFile?
                    do {
                        let f = try TempChunkFile(root: root)
                        file = f
                        try f.write(c.bytes)
                        f.startWriteback()
                        written.append((i, f, final))
                    } catch {
                        file?.discard()
                        out[i] = error
                    }
                }
                for w in written {
                    do {
                        folders.insert(try w.file.commit(as: w.final, syncFolder: false))
                    } catch {
                        w.file.discard()
                        out[w.index] = error
                    }
                }
                for folder in folders { Self.syncFolder(folder) }
                return out
            }
        } catch {
            return chunks.map { _ in error }
        }
    }

    public func size(of hash: ContentHash) async throws -> Int64? {
        let p = path(hash)
        return try await pool.runIfActive {
            var st = stat()
            guard stat(p, &st) == 0 else {
                if errno == ENOENT { return nil }
                throw Self.ioError("stat", p)
            }
            return Int64(st.st_size)
        }
    }

    public func open(_ hash: ContentHash, range: Range<Int64>?) async throws -> ChunkReader? {
        let p = path(hash)
        guard let file = try await pool.runIfActive({ try OpenChunkFile(path: p) }) else { return nil }
        let r = range ?? 0..<file.size
        let lo = max(0, min(r.lowerBound, file.size)), hi = max(lo, min(r.upperBound, file.size))
        let pool = self.pool
        return ChunkReader(length: hi - lo, of: hash, whole: range == nil, store: "chunk directory") {
            var offset = lo
            return {
                guard offset < hi else { return nil }
                let count = Int(min(Int64(ChunkPiece.size), hi - offset))
                let at = offset
                let piece = try await pool.runIfActive { try file.read(at: at, count: count) }
                offset += Int64(piece.readableBytes)
                // A file shorter than it was at open ends the pieces; the reader reports it.
                return piece.readableBytes > 0 ? piece : nil
            }
        }
    }

    public func delete(_ hash: ContentHash) async throws {
        let p = path(hash)
        try await pool.runIfActive {
            guard unlink(p) == 0 || errno == ENOENT else { throw Self.ioError("delete", p) }
        }
    }

    static func ioError(_ what: String, _ path: String) -> APIError {
        let e = errno
        if e == ENOSPC || e == EDQUOT {
            return APIError(.storageFull, "the server's chunk storage is full; nothing was stored — free disk space on the server and retry")
        }
        return APIError(.unavailable, "the server could not \(what) a chunk file (errno \(e)); retry later")
    }

    /// fsync of a folder, so the names renamed into it last.
    static func syncFolder(_ dir: String) {
        let dfd = Glibc.open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dfd >= 0 {
            fsync(dfd)
            close(dfd)
        }
    }
}

/// A put's temp file in `ROOT/tmp`, written in order and then renamed into place or removed.
/// @unchecked Sendable: one put uses it, one step at a time (each on the thread pool).
final class TempChunkFile: @unchecked Sendable {
    let path: String
    private var fd: Int32

    init(root: String) throws {
        path = "\(root)/tmp/\(UUID().uuidString)"
        fd = Glibc.open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw DirectoryChunkStore.ioError("create", path) }
    }

    func write(_ bytes: ByteBuffer) throws {
        try bytes.withUnsafeReadableBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
                if n < 0 {
                    if errno == EINTR { continue }
                    throw DirectoryChunkStore.ioError("write", path)
                }
                offset += n
            }
        }
    }

    /// Starts writing the bytes out without waiting (`commit` still fsyncs): a batch of files
    /// whose writeback started together is flushed together.
    func startWriteback() {
        _ = Self.syncFileRange?(fd, 0, 0, 2 /* SYNC_FILE_RANGE_WRITE */)
    }

    /// glibc's `sync_file_range(2)` (Swift's Glibc module leaves out the GNU declarations); nil
    /// where it is missing: `commit`'s fsync alone then writes each file out.
    private static let syncFileRange: (@convention(c) (Int32, Int64, Int64, UInt32) -> Int32)? = {
        guard let handle = dlopen(nil, RTLD_NOW), let symbol = dlsym(handle, "sync_file_range") else { return nil }
        return unsafeBitCast(symbol, to: (@convention(c) (Int32, Int64, Int64, UInt32) -> Int32).self)
    }()

    /// fsync, rename to `final` (making its fan-out folder) and fsync the folder (unless
    /// `syncFolder` is false: the caller does, before it counts the chunk as stored). Returns the
    /// folder.
    @discardableResult
    func commit(as final: String, syncFolder: Bool = true) throws -> String {
        guard fsync(fd) == 0 else { throw DirectoryChunkStore.ioError("fsync", path) }
        close(fd)
        fd = -1
        let dir = String(final.dropLast(62))
        if mkdir(dir, 0o700) != 0 && errno != EEXIST { throw DirectoryChunkStore.ioError("create folder", dir) }
        guard rename(path, final) == 0 else { throw DirectoryChunkStore.ioError("rename", final) }
        if syncFolder { DirectoryChunkStore.syncFolder(dir) }
        return dir
    }

    /// Removes the file (after a failure). Harmless after `commit`: the name is gone by then.
    func discard() {
        if fd >= 0 {
            close(fd)
            fd = -1
        }
        unlink(path)
    }

    deinit {
        if fd >= 0 { close(fd) }
    }
}

/// A chunk file open for reading; closed when the last reader lets go of it.
/// @unchecked Sendable: the descriptor is only read with pread (no shared offset), and closed in deinit.
final class OpenChunkFile: @unchecked Sendable {
    let fd: Int32
    let size: Int64
    let path: String

    /// nil when the chunk is not there.
    init?(path: String) throws {
        self.path = path
        fd = Glibc.open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw DirectoryChunkStore.ioError("open", path)
        }
        var st = stat()
        guard fstat(fd, &st) == 0 else {
            let error = DirectoryChunkStore.ioError("stat", path)
            close(fd)
            throw error
        }
        size = Int64(st.st_size)
    }

    /// Up to `count` bytes at `offset` (fewer only at the end of the file).
    func read(at offset: Int64, count: Int) throws -> ByteBuffer {
        var buffer = ByteBufferAllocator().buffer(capacity: count)
        try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: count) { raw in
            var done = 0
            while done < count {
                let n = pread(fd, raw.baseAddress! + done, count - done, off_t(offset) + off_t(done))
                if n < 0 {
                    if errno == EINTR { continue }
                    throw DirectoryChunkStore.ioError("read", path)
                }
                if n == 0 { break }
                done += n
            }
            return done
        }
        return buffer
    }

    deinit { close(fd) }
}

/// Server data is the accounts' data: folders 0700, files 0600, whatever the umask.
public enum PrivateFiles {
    /// Creates `path` (and its parents) if missing and makes it 0700.
    public static func directory(_ path: String) throws {
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        restrict(path, mode: 0o700)
    }

    /// Makes an existing file `mode` (0600 by default); a missing file is left alone.
    public static func restrict(_ path: String, mode: mode_t = 0o600) {
        _ = chmod(path, mode)
    }
}
