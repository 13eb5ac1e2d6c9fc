import Foundation
import FuseIDs
import MountPorts
import NimbusCore
import NimbusProtocol
import SyncCore

// The content cache and the controls on it (docs/sync.md "Cache", "Status and control"):
// - pin (`user.nimbus.pinned` = 1): the content is downloaded and kept; a pinned folder pins
//   everything below it, present and future (remote changes to pinned files are downloaded).
// - evict (`user.nimbus.evict` = 1): the cached bytes go (the item becomes `cloud`) when the
//   file is closed and has nothing to upload.
// - download (`user.nimbus.download` = 1): fetch the whole file (or every file below a folder).
// - `--cache-size`: above the limit, clean, closed, unpinned content is evicted, least
//   recently read first, down to 90 % of the limit.
// - pause (`user.nimbus.paused` = 1 on the root, `nimbus pause`): no network until resumed.
// The tick loop also starts quiet-period uploads of files kept open (SyncEngine+Push.swift).

extension SyncEngine: SyncControl {
    /// `user.nimbus.pinned|evict|download|paused` (SyncControl).
    public func setItemAttribute(_ name: NimbusXattr, value: String, item: ItemID, isFolder: Bool) throws(Errno) {
        guard let on = ControlPlan.flag(value) else { throw .EINVAL }
        switch name {
        case .pinned: try setPinned(item, on, isFolder: isFolder)
        case .evict: if on { try evict(item, isFolder: isFolder, explicit: true) }
        case .download: if on { try fetchWhole(files(under: item, isFolder: isFolder), priority: 1) }
        case .paused:
            guard item.isRoot else { throw .EPERM }
            setPaused(on)
        case .status, .itemid, .progress, .version, .error, .conflicts, .versions, .resolve, .restore, .discard, .ignored:
            throw .EPERM
        }
    }

    /// The files an operation on `item` covers (itself, or every file below a folder).
    func files(under item: ItemID, isFolder: Bool) -> [ItemID] {
        guard isFolder else { return [item] }
        let fs = tree
        let below = fs.descendants(of: item)
        return state.withLock { s in below.filter { s.base($0)?.record.kind == .file } }
    }

    // MARK: pins

    func setPinned(_ item: ItemID, _ on: Bool, isFolder: Bool) throws(Errno) {
        do { try store.setPinned(item, on) } catch {
            log("cannot save the pin of \(item): \(error)")
            throw .EIO
        }
        state.withLock { $0.cache.pinned.set(item, on) }
        if on { try fetchWhole(files(under: item, isFolder: isFolder), priority: 1) }
        cacheWake.yield()
    }

    /// Whether `item` is pinned, itself or through a folder above it.
    func isPinned(_ item: ItemID, fs: any MountedTree) -> Bool {
        state.withLock { $0.cache.pinned }.covers(item, ancestors: fs.ancestors)
    }

    /// Every pinned item not fully here is fetched (at start, and after a remote change).
    func fetchPinned() {
        let fs = tree
        let files = state.withLock { $0.cache.pinned }.everything(descendants: fs.descendants)
        let missing = state.withLock { s in files.filter { s.base($0).map { !$0.complete && $0.record.kind == .file } ?? false } }
        try? fetchWhole(missing, priority: 1)
    }

    /// Queues every missing chunk of `items` (files) at `priority`, without waiters.
    func fetchWhole(_ items: [ItemID], priority: Int) throws(Errno) {
        guard !items.isEmpty else { return }
        let refused = state.withLock { s -> Bool in
            // Also when the journal's long-poll found the server gone or the token refused: the
            // download would only fail later, and `setfattr user.nimbus.download` must say so now.
            if s.link.refusesDownloads(paused: s.paused, at: options.clock.now) { return items.contains { s.base($0).map { !$0.complete } ?? false } }
            for id in items {
                for c in s.base(id).map({ $0.wants($0.missingChunks) }) ?? [] {
                    want(&s, ChunkKey(item: id, index: c.index, hash: c.hash), at: c.offset, priority: priority, waiter: nil)
                }
            }
            return false
        }
        pump()
        if refused { throw .EIO }  // offline or paused: nothing can be downloaded now
    }

    // MARK: eviction

    /// Drops the cached content of `item` (or of every file below a folder). An explicit evict
    /// of a pinned file unpins it; a file pinned through its folder is kept. Files open, being
    /// written, waiting for upload or downloading are kept: EBUSY (the others are evicted).
    func evict(_ item: ItemID, isFolder: Bool, explicit: Bool) throws(Errno) {
        let fs = tree
        if explicit, state.withLock({ $0.cache.pinned.contains(item) }) { try setPinned(item, false, isFolder: isFolder) }
        let files = files(under: item, isFolder: isFolder)
        let pinned = Set(state.withLock { $0.cache.pinned }.covered(files, ancestors: fs.ancestors))
        var busy = pinned.count
        for id in files where !pinned.contains(id) {
            do { try evictOne(id, fs: fs) } catch { busy += 1 }
        }
        if busy > 0 {
            log("evict: \(busy) file(s) kept (open, pinned, being written, waiting for upload or downloading)")
            throw .EBUSY
        }
    }

    /// Evicts one file; the cache-limit pass and `evict` use it.
    @discardableResult
    func evictOne(_ id: ItemID, fs: any MountedTree) throws(Errno) -> Int64 {
        var freed: Int64 = 0
        var newBase: Base?
        try fs.evictContent(id) {
            state.withLock { s in
                let unsent = s.push.queue.hasWork(id)
                let downloading = s.downloads.fetches.contains(where: { $0.item == id })
                guard let (n, placeholder) = s.items.evict(id, unsent: unsent, downloading: downloading) else { return false }
                (freed, newBase) = (n, placeholder)
                s.cache.used -= n
                s.cache.evicted += 1
                return true
            }
        }
        if let newBase { try? saveBase(id, newBase) }
        return freed
    }

    /// Bytes of content held here (present chunks of synced files).
    func measureCache() -> Int64 {
        state.withLock { s in
            s.cache.used = s.items.contentBytes
            return s.cache.used
        }
    }

    /// Above the limit: evict clean, closed, unpinned files, least recently read first, down
    /// to 90 % of the limit. Pinned content is never evicted (it may keep the cache above).
    func enforceCacheLimit() {
        var used = measureCache()
        guard let target = CacheLimit.target(used: used, limit: options.cacheLimit) else { return }
        let fs = tree
        let keep = state.withLock { $0.cache.pinned }.kept(descendants: fs.descendants)
        let candidates = state.withLock { $0.items.evictionOrder(keep: keep) }
        var evicted = 0
        for id in candidates where used > target {
            if let freed = try? evictOne(id, fs: fs) { used -= freed; evicted += 1 }
        }
        log("cache above its limit (\(options.cacheLimit ?? 0) bytes): evicted \(evicted) file(s), \(used) bytes held now")
    }

    /// Room on the state disk for `bytes` of a download a program waits for: clean, closed,
    /// unpinned files other than `reading` are evicted, least recently read first, until it fits.
    /// True when something was evicted (ask the store again).
    func makeRoom(for bytes: Int64, reading: ItemID) -> Bool {
        let fs = tree
        let keep = state.withLock { $0.cache.pinned }.kept(descendants: fs.descendants, also: reading)
        let candidates = state.withLock { $0.items.evictionOrder(keep: keep) }
        var freed: Int64 = 0, evicted = 0
        for id in candidates where store.freeBytes - store.keptForState < bytes {
            if let n = try? evictOne(id, fs: fs) { freed += n; evicted += 1 }
        }
        if evicted > 0 { log("no room on the state disk for a download: evicted \(evicted) file(s), \(freed) bytes") }
        return evicted > 0
    }

    /// Evicts what came of files whose download found no room, once nothing uses them; a file
    /// whose whole content is here by then (a later read fit) is kept.
    func dropPartialAfterNoRoom() {
        let ids = state.withLock { $0.cache.dropAfterNoRoom }
        guard !ids.isEmpty else { return }
        let fs = tree
        for id in ids {
            let partial = state.withLock { s in s.base(id).map { !$0.complete } ?? false }
            if partial, !isPinned(id, fs: fs), (try? evictOne(id, fs: fs)) == nil { continue }
            state.withLock { _ = $0.cache.dropAfterNoRoom.remove(id) }
        }
    }

    // MARK: pause

    /// Takes the mount offline on purpose (no request to the server) or back online.
    public func setPaused(_ on: Bool) {
        let changed = state.withLock { s -> Bool in
            guard s.paused != on else { return false }
            s.paused = on
            s.link.pause(on)
            return true
        }
        guard changed else { return }
        try? store.setMeta("sync.paused", on ? "1" : "0")
        log(on ? "paused: no network until resumed" : "resumed")
        pauseWake.yield()  // the pull supervisor ends the long poll now, or starts the pull again
        if on {
            pump()  // queued downloads fail at once
        } else {
            wake.yield()
            fetchPinned()
        }
    }

    // MARK: tick

    /// Once a second (and after downloads when the cache has a limit): quiet-period uploads
    /// and the cache limit.
    func tickLoop() async {
        await withDiscardingTaskGroup { group in
            group.addTask {
                while !Task.isCancelled {
                    await self.options.clock.sleep(for: .seconds(1))
                    self.cacheWake.yield()
                }
            }
            for await _ in cacheWakes {
                if Task.isCancelled { break }
                await loop.turn(.tick) {
                    startQuietUploads()
                    releasePaced()
                    dropPartialAfterNoRoom()
                    enforceCacheLimit()
                    wakeForRetries()
                }
            }
            group.cancelAll()
        }
    }

    /// Files open and written, without a write for the quiet period: queue a snapshot upload.
    /// Also forgets upload records with nothing left to pace.
    func startQuietUploads() {
        let fs = tree
        let now = options.clock.now
        let rules = pacingRules
        let writing: [ItemID] = state.withLock { s in
            s.items.settle(at: now, rules: rules)
            return s.items.writingIDs
        }
        var queued = false
        for id in writing {
            let w = fs.writeState(id)
            state.withLock { s in
                let look = UploadState<ContinuousClock.Instant>.Event.writerLook(
                    writers: w?.writers ?? 0, unsynced: w?.unsynced ?? false, idle: .nanoseconds(Int64(clamping: w?.idleNanoseconds ?? 0)),
                    generation: w?.generation ?? 0, queued: s.push.queue.hasWork(id))
                queued = s.uploadEvent(id, look, at: now, rules: rules) || queued
            }
        }
        if queued { log("quiet period over for a file kept open: uploading a snapshot"); wake.yield() }
    }
}
