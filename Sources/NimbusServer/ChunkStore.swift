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
/// exists is always complete and correct. The directory store is the default; an S3-compatible
/// store comes with the scale-out issue.
public protocol ChunkStore: Sendable {
    /// Stores `bytes` as chunk `hash` after checking that they hash to it. Idempotent.
    /// `ifStored` says what to do when the chunk is already there: `.skip` answers at once;
    /// `.store` does the whole durable write again, so that the answer's timing does not tell the
    /// caller whether the chunk existed (an upload by an account that does not own the chunk).
    func put(_ hash: ContentHash, bytes: ByteBuffer, ifStored: IfStored) async throws
    /// The chunk's size, or nil if it is not stored.
    func size(of hash: ContentHash) async throws -> Int64?
    /// Bytes `range` of the chunk (all of it when nil), or nil if it is not stored.
    func read(_ hash: ContentHash, range: Range<Int64>?) async throws -> ByteBuffer?
    /// Removes the chunk's bytes; a chunk that is not stored is not an error. Only the garbage
    /// collector calls it, and only for a chunk no account owns and no upload claims
    /// (`ChunkCollector`): chunks are shared by content between accounts.
    func delete(_ hash: ContentHash) async throws
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

/// Chunks as files `ROOT/ab/cdef…` (first two hex digits as a fan-out folder). A put writes a temp
/// file in `ROOT/tmp`, fsyncs it, renames it into place and fsyncs the folder, so a crash leaves
/// either no chunk or a whole one (plus, at worst, a temp file that the next start removes).
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

    public func put(_ hash: ContentHash, bytes: ByteBuffer, ifStored: IfStored) async throws {
        guard ChunkHashing.sha256(bytes) == hash else {
            throw APIError(.hashMismatch, "the uploaded bytes do not hash to \(hash); nothing was stored — re-read the chunk and upload it again")
        }
        let final = path(hash)
        let root = self.root
        try await pool.runIfActive {
            // Rewriting replaces the file with identical bytes by rename: readers keep theirs.
            if ifStored == .skip, access(final, F_OK) == 0 { return }
            let dir = String(final.dropLast(62))
            if mkdir(dir, 0o700) != 0 && errno != EEXIST { throw Self.ioError("create folder", dir) }
            let tmp = "\(root)/tmp/\(UUID().uuidString)"
            let fd = Glibc.open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            guard fd >= 0 else { throw Self.ioError("create", tmp) }
            var ok = false
            defer {
                if !ok { unlink(tmp) }
            }
            do {
                defer { close(fd) }
                try bytes.withUnsafeReadableBytes { raw in
                    var offset = 0
                    while offset < raw.count {
                        let n = Glibc.write(fd, raw.baseAddress! + offset, raw.count - offset)
                        if n < 0 {
                            if errno == EINTR { continue }
                            throw Self.ioError("write", tmp)
                        }
                        offset += n
                    }
                }
                guard fsync(fd) == 0 else { throw Self.ioError("fsync", tmp) }
            }
            guard rename(tmp, final) == 0 else { throw Self.ioError("rename", final) }
            ok = true
            let dfd = Glibc.open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if dfd >= 0 {
                fsync(dfd)
                close(dfd)
            }
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

    public func read(_ hash: ContentHash, range: Range<Int64>?) async throws -> ByteBuffer? {
        let p = path(hash)
        return try await pool.runIfActive { () throws -> ByteBuffer? in
            let fd = Glibc.open(p, O_RDONLY | O_CLOEXEC)
            guard fd >= 0 else {
                if errno == ENOENT { return nil }
                throw Self.ioError("open", p)
            }
            defer { close(fd) }
            var st = stat()
            guard fstat(fd, &st) == 0 else { throw Self.ioError("stat", p) }
            let size = Int64(st.st_size)
            let r = range ?? 0..<size
            let lo = max(0, min(r.lowerBound, size)), hi = max(lo, min(r.upperBound, size))
            var buffer = ByteBufferAllocator().buffer(capacity: Int(hi - lo))
            try buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: Int(hi - lo)) { raw in
                var done = 0
                while done < Int(hi - lo) {
                    let n = pread(fd, raw.baseAddress! + done, Int(hi - lo) - done, off_t(lo) + off_t(done))
                    if n < 0 {
                        if errno == EINTR { continue }
                        throw Self.ioError("read", p)
                    }
                    if n == 0 { break }
                    done += n
                }
                return done
            }
            return buffer
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
