import Crypto
import Foundation
import FuseIDs
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusRemote
import SyncCore
import Synchronization

// Hydration: the ContentProvider port. Called on libfuse threads: takes `state` briefly, starts
// downloads as tasks and returns; the read is answered by `done` when its chunks are in.

extension SyncEngine: ContentProvider {
    /// Called before every read of a synced mount (hot path): notes the use (LRU) and the
    /// sequential run, and keeps a prefetch window of chunks ahead of a sequential reader.
    public func isPresent(_ item: ItemID, range: Range<Int64>) -> Bool {
        let (present, pump) = state.withLock { s -> (Bool, Bool) in
            s.cache.useClock &+= 1
            let clock = s.cache.useClock
            s.items.withCache(item) { $0.lastUse = clock }
            // Sequential reading extends the run; a window of chunks ahead of it is fetched.
            let read = Base.beforeRead(s.base(item), range, refused: s.paused || isOffline(s)) {
                s.items.withCache(item) { $0.read(range) } ?? 0
            }
            var queued = false
            for c in read.ahead {
                queued = want(&s, ChunkKey(item: item, index: c.index, hash: c.hash), at: c.offset, priority: 2, waiter: nil) || queued
            }
            return (read.present, queued)
        }
        if pump { self.pump() }
        return present
    }

    public func willTruncate(_ item: ItemID) {
        // Counted only while downloads of the item are asked for or under way (the state lock
        // orders this with `want`, which reads the count): the table stays small.
        state.withLock { s in
            guard s.downloads.fetches.contains(where: { $0.item == item }) else { return }
            contentGate.withLock { $0[item, default: 0] &+= 1 }
        }
    }

    func isOffline(_ s: State) -> Bool { s.link.failsReads(at: options.clock.now) }

    public func hydrate(_ item: ItemID, range: Range<Int64>, done: @escaping @Sendable (Errno?) -> Void) {
        // Register a waiter on every missing chunk; queue the fetches nobody asked for yet.
        let waiter = Waiter(done)
        let need = state.withLock { s in
            let need = Base.need(s.base(item), range, refused: s.paused || isOffline(s))
            switch need {
            case .fetch(let missing):
                waiter.expect(missing.count)
                for c in missing {
                    want(&s, ChunkKey(item: item, index: c.index, hash: c.hash), at: c.offset, priority: 0, waiter: { waiter.finished($0) })
                }
            case .here, .refused:
                break
            }
            return need
        }
        switch need {
        case .here: done(nil)
        case .refused: done(.EIO)  // paused, or the server just proved unreachable
        case .fetch: pump()
        }
    }

    /// Asks for one chunk (state lock held): adds the waiter and queues a fetch at `priority`
    /// (0 read, 1 pinned or asked for, 2 prefetch) unless it is under way or queued at least as
    /// high. True when something was queued (call `pump()` after the lock).
    @discardableResult
    func want(_ s: inout State, _ key: ChunkKey, at offset: Int64, priority: Int, waiter: (@Sendable (Errno?) -> Void)?) -> Bool {
        s.downloads.fetches.want(key, priority: priority, waiter: waiter) {
            // The item's truncations when asked (lock order: state, then gate).
            ChunkFetch(key: key, offset: offset, truncations: contentGate.withLock { $0[key.item] ?? 0 })
        }
    }

    /// Starts queued fetches while slots are free, highest priority first. When the server is
    /// unreachable or the mount paused, queued fetches fail at once instead.
    func pump() {
        let (starts, failed) = state.withLock { s in
            let next = s.downloads.fetches.next(limit: options.parallelDownloads, refuse: s.paused || isOffline(s))
            return (next.start.map(\.fetch), next.fail)
        }
        for ws in failed { for w in ws { w(.EIO) } }
        // Each fetch ends by its own deadline (hydrationSeconds), or sooner when stop() cancels it.
        for f in starts where !jobs.spawn({ await self.download(f.key, at: f.offset, truncations: f.truncations) }) {
            // Stopping: the fetch does not start, and its readers get EIO now.
            for w in state.withLock({ $0.downloads.fetches.ended(f.key) }) { w(.EIO) }
        }
    }

    /// Fetches one chunk, writing each part into the cache file as it arrives while hashing it;
    /// once checked, records it present and wakes its waiters. Failing (unreachable server,
    /// deadline, bad bytes) answers EIO to them. Bytes of a chunk that fails its check may stay
    /// in the file: it is not marked present, so they are never read and are written over.
    func download(_ key: ChunkKey, at offset: Int64, truncations: UInt64) async {
        var failure: Errno?
        do {
            let target = try openForDownload(key, at: offset)
            var written: Int64 = 0
            var truncated = false
            if let (fd, _, expected) = target {
                defer { close(fd) }
                // Downloaded content never takes the space the local state needs: a chunk that
                // does not fit is refused before a byte of it is written (the reader gets ENOSPC).
                let what = "chunk \(key.index) of \(key.item)"
                // A program waiting for it may have other downloaded files evicted to make room.
                let waited = state.withLock { $0.downloads.fetches.hasWaiters(key) }
                guard store.roomForDownload(expected, of: what)
                        || (waited && makeRoom(for: expected, reading: key.item) && store.roomForDownload(expected, of: what)) else {
                    throw NoRoomForDownload(message: store.lastError ?? "no room for \(what)")
                }
                defer { store.downloadEnded(expected) }
                var hasher = SHA256()
                // Bytes that came inside a changes page are used once, instead of asking.
                let inline = state.withLock { $0.downloads.inline.take(key.hash) }
                // A server in trouble (5xx) before any byte came is asked again, twice, after
                // 0.2 and 0.6 s: one busy answer does not fail the program's read.
                var attempt = 0
                while true {
                    do {
                        let stream: (_ part: (UnsafeRawBufferPointer) throws -> Void) async throws -> Void = { each in
                            if let inline { try inline.withUnsafeBytes { try each($0) } } else { _ = try await self.fetchClient.streamChunk(key.hash, each) }
                        }
                        try await stream { part in
                            hasher.update(bufferPointer: part)
                            guard !truncated else { return }
                            guard written + Int64(part.count) <= expected else {
                                throw SyncError("chunk \(key.hash) arrived with more than its \(expected) bytes")
                            }
                            do {
                                try contentGate.withLock { (g: inout [ItemID: UInt64]) throws -> Void in
                                    // A program truncated the file since the fetch began: its bytes rule.
                                    guard (g[key.item] ?? 0) == truncations else { truncated = true; return }
                                    try Self.writeAll(fd, part, at: offset + written)
                                }
                            } catch let e as WriteFailed where e.errno == ENOSPC {
                                // The disk filled meanwhile (another program): what this chunk
                                // wrote goes, and the reader is told ENOSPC.
                                _ = punchFileHole(fd, offset: offset, length: expected)
                                let free = store.freeBytes
                                throw NoRoomForDownload(message: LocalStore.noRoomMessage(what, bytes: expected - written, free: free, kept: store.keptForState))
                            }
                            written += Int64(part.count)
                        }
                        break
                    } catch {
                        guard attempt < 2, written == 0, !truncated, Self.isServerTrouble(error) else { throw error }
                        attempt += 1
                        log("download of chunk \(key.index) of \(key.item): \(error); asking again")
                        await options.clock.sleep(for: .milliseconds(attempt == 1 ? 200 : 600))
                        hasher = SHA256()
                    }
                }
                guard ContentHash(digest: hasher.finalize()) == key.hash, truncated || written == expected else {
                    throw SyncError("chunk \(key.hash) arrived with other bytes")
                }
            }
            let now = options.clock.now, rules = pacingRules
            let arrival = state.withLock { s in
                s.cache.useClock &+= 1
                let arrival = s.items.chunkArrived(key.item, index: key.index, hash: key.hash, offset: offset, generation: target?.generation,
                                                   truncated: truncated, use: s.cache.useClock, at: now, rules: rules)
                s.downloads.bytesFetched += truncated ? 0 : written
                switch arrival {
                case .present, .whole: s.cache.used += written
                case .replaced, .overwritten: break
                }
                return arrival
            }
            switch arrival {
            case .present:
                try persistPresence(key.item)
            case .whole(let b):
                try persistPresence(key.item)
                services?.events.append(.downloaded, origin: .sync, path: tree.path(of: key.item), detail: "v\(b.version)")
                if ItemName.same(b.record.name.value, IgnoreMatch.fileName) { unparkAll(why: "a .nimbusignore is here") }
            case .replaced:
                failure = .EIO
            case .overwritten:
                break
            }
        } catch let e as NoRoomForDownload {
            failure = .ENOSPC
            log("download of chunk \(key.index) of \(key.item) refused: \(e.message)")
            store.downloadFoundNoRoom(e.message)
            let now = options.clock.now, rules = pacingRules
            state.withLock { s in
                s.cache.dropAfterNoRoom.insert(key.item)
                // Prefetches of the item nobody waits for would only fill the disk to its floor.
                s.downloads.fetches.dropUnwaited { $0.item == key.item && $0 != key }
                s.link.lastError = "download: \(e.message)"
                s.items[key.item, default: SyncItem()].upload.on(.download(failed: "not downloaded: \(e.message)"), at: now, rules: rules)
            }
        } catch {
            failure = .EIO
            log("download of chunk \(key.index) of \(key.item) failed: \(error)")
            let now = options.clock.now, rules = pacingRules
            let gone = state.withLock { s in
                s.items[key.item, default: SyncItem()].upload.on(.download(failed: "download failed: \(error)"), at: now, rules: rules)
                return s.link.downloadFailed("download: \(error)", unreachable: Self.isTransport(error), at: now)
            }
            // A read that could not reach the server is the first sign of a network that went
            // away silently: the status says so now, and the pull's next answer says online again.
            if let gone { setConnection(gone, error: "download: \(error)") }
        }
        for w in state.withLock({ $0.downloads.fetches.ended(key) }) { w(failure) }
        pump()
        if options.cacheLimit != nil { cacheWake.yield() }
    }

    /// Opens the item's cache file for a download of chunk `key` at `offset`: the descriptor,
    /// the content generation it belongs to and the chunk's size. Nil (nothing open) when the
    /// chunk is no longer part of the content here — a remote version replaced it since it was
    /// asked for.
    ///
    /// The generation is read with the check that the current content still holds the chunk
    /// there, and checked again after the file is opened: a new version bumps it (`applied`,
    /// under the filesystem lock) before its cache file is removed, so an unchanged generation
    /// means the descriptor is that generation's file — and a file replaced later is unlinked,
    /// where late bytes harm nothing. (The generation used to be taken when the download
    /// started, unchecked, and the bytes written before any check: a download of the old
    /// version queued before a new one arrived wrote into the new version's file — a byte past
    /// its end became its size at the next start, old bytes could overwrite new ones.)
    private func openForDownload(_ key: ChunkKey, at offset: Int64) throws -> (fd: Int32, generation: UInt64, size: Int64)? {
        let current: (UInt64, Int64)? = state.withLock { s in
            guard let b = s.base(key.item), b.holds(chunk: key.index, hash: key.hash, at: offset) else { return nil }
            return (s.items[key.item]?.cache.generation ?? 0, b.record.chunks[key.index].size)
        }
        guard let (gen, size) = current else { return nil }
        var fd = store.cache.open(key.item, create: false)
        // A placeholder's file is made at its first download (ContentCache).
        if fd == -ENOENT { fd = tree.openCacheFile(key.item) }
        guard state.withLock({ $0.items[key.item]?.cache.generation == gen }) else {
            if fd >= 0 { close(fd) }
            return nil
        }
        guard fd >= 0 else { throw SyncError("cannot open the cache file of \(key.item): \(String(cString: strerror(-fd)))") }
        return (fd, gen, size)
    }

    private static func writeAll(_ fd: Int32, _ b: UnsafeRawBufferPointer, at offset: Int64) throws {
        var done = 0
        while done < b.count {
            let n = pwrite(fd, b.baseAddress! + done, b.count - done, off_t(offset) + off_t(done))
            if n < 0 { if errno == EINTR { continue }; throw WriteFailed(errno: errno) }
            done += n
        }
    }
}

/// A write into the cache file failed with `errno`.
struct WriteFailed: Error, CustomStringConvertible {
    let errno: Int32
    var description: String { "cannot write the cache file: \(String(cString: strerror(errno)))" }
}

/// A download refused or stopped for lack of space on the state disk (the reader gets ENOSPC).
struct NoRoomForDownload: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
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
