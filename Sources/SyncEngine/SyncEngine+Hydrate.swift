import ContainerFS
import Crypto
import Foundation
import FuseKit
import Glibc
import NimbusCore
import NimbusProtocol
import NimbusRemote
import Synchronization

// Hydration: the ContentProvider port. Called on libfuse threads: takes `state` briefly, starts
// downloads as tasks and returns; the read is answered by `done` when its chunks are in.

extension SyncEngine: ContentProvider {
    public func isPresent(_ item: ItemID, range: Range<Int64>) -> Bool {
        state.withLock { s in s.bases[item].map { $0.missing(in: range).isEmpty } ?? true }
    }

    public func hydrate(_ item: ItemID, range: Range<Int64>, done: @escaping @Sendable (Errno?) -> Void) {
        // Register a waiter on every missing chunk; start the downloads nobody started yet.
        let waiter = Waiter(done)
        let (starts, count): ([(ChunkKey, Int64)], Int) = state.withLock { s in
            guard let b = s.bases[item] else { return ([], 0) }
            if let until = s.offlineUntil, ContinuousClock.now < until, !b.missing(in: range).isEmpty { return ([], -1) }
            let missing = b.missing(in: range)
            waiter.expect(missing.count)
            var starts: [(ChunkKey, Int64)] = []
            for i in missing {
                let key = ChunkKey(item: item, index: i, hash: b.record.chunks[i].hash)
                if s.downloads[key] == nil {
                    s.downloads[key] = []
                    starts.append((key, b.offsets[i]))
                }
                s.downloads[key]!.append { waiter.finished($0) }
            }
            return (starts, missing.count)
        }
        if count == 0 { return done(nil) }
        if count < 0 { return done(.EIO) }  // the server just proved unreachable
        // Each download ends by its own deadline (hydrationSeconds), so these tasks are not
        // tracked for stop(): a stopping daemon waits at most that long for them.
        for (key, offset) in starts {
            Task { await self.download(key, at: offset) }
        }
    }

    /// Fetches one chunk, checks it, writes it into the cache file, records it present and wakes
    /// its waiters. Failing (unreachable server, deadline, bad bytes) answers EIO to them.
    func download(_ key: ChunkKey, at offset: Int64) async {
        var failure: Errno?
        do {
            let bytes = try await fetchClient.getChunk(key.hash)
            guard ContentHash(digest: SHA256.hash(data: bytes)) == key.hash else {
                throw SyncError("chunk \(key.hash) arrived with other bytes")
            }
            try write(bytes, to: key.item, at: offset)
            let updated: Base? = state.withLock { s in
                // Still the same content? (a remote change may have replaced it meanwhile)
                guard var b = s.bases[key.item], key.index < b.record.chunks.count,
                      b.record.chunks[key.index].hash == key.hash, b.offsets[key.index] == offset,
                      var p = b.present else { return nil }
                p[key.index] = true
                b = Base(record: b.record, present: p)
                s.bases[key.item] = b
                return b
            }
            if let updated {
                try saveBase(key.item, updated)
            }
        } catch {
            failure = .EIO
            log("download of chunk \(key.index) of \(key.item) failed: \(error)")
            let unreachable: Bool
            if case RemoteError.transport? = error as? RemoteError { unreachable = true } else { unreachable = false }
            state.withLock { s in
                s.lastError = "download: \(error)"
                if unreachable { s.offlineUntil = ContinuousClock.now + .seconds(2) }
            }
        }
        let waiters = state.withLock { s in s.downloads.removeValue(forKey: key) ?? [] }
        for w in waiters { w(failure) }
    }

    private func write(_ bytes: [UInt8], to item: ItemID, at offset: Int64) throws {
        let fd = store.cache.open(item, create: false)
        guard fd >= 0 else { throw SyncError("cannot open the cache file of \(item): \(String(cString: strerror(-fd)))") }
        defer { close(fd) }
        var done = 0
        try bytes.withUnsafeBytes { b in
            while done < b.count {
                let n = pwrite(fd, b.baseAddress! + done, b.count - done, off_t(offset) + off_t(done))
                if n < 0 { if errno == EINTR { continue }; throw SyncError("cannot write the cache file: \(String(cString: strerror(errno)))") }
                done += n
            }
        }
    }
}

/// Counts a read's outstanding chunks; answers once: the first error, or success after the last.
final class Waiter: Sendable {
    private struct S { var left = 0; var done: (@Sendable (Errno?) -> Void)? }
    private let s: Mutex<S>
    init(_ done: @escaping @Sendable (Errno?) -> Void) { s = Mutex(S(done: done)) }

    /// Sets how many chunks to wait for (called before any can finish).
    func expect(_ n: Int) { s.withLock { $0.left = n } }

    func finished(_ e: Errno?) {
        let d: (@Sendable (Errno?) -> Void)? = s.withLock { s in
            s.left -= 1
            guard e != nil || s.left == 0 else { return nil }
            defer { s.done = nil }
            return s.done
        }
        d?(e)
    }
}
