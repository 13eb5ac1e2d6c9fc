import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore

// A file handle names a descriptor of the item's cache file (opened O_RDWR; the kernel has
// already checked the caller's access mode) in `ids`. Reads therefore take no filesystem lock
// and allocate nothing: the adapter splices straight from the descriptor.

extension ContainerFS {
    /// The descriptor of an open file's handle; nil for any other handle.
    public func descriptor(_ h: HandleID) -> Int32? {
        if case .file(let fd)? = ids.owner(ofHandle: h) { return fd }
        return nil
    }

    /// Opens a file of the tree; the kernel has checked the access mode against the item's
    /// owner and mode.
    ///
    /// `killSetID`: an O_TRUNC by a caller who may not keep set-ID bits (not root) clears them,
    /// as Linux does (the mount handles FUSE_HANDLE_KILLPRIV_V2: `killSetID(_:)`).
    public func open(node: NodeID, flags: Int32, killSetID: Bool = false) throws(Errno) -> FuseOpen {
        // The cache file is opened under the lock: a remote version swapping the file (and the
        // node) cannot slip between choosing the node and opening its file.
        var stalePages = false
        var item = ItemID.root
        let changes = flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0
        var waits = 0
        var opened: (Int32, HandleID)?
        while opened == nil {
            opened = try lock.withLock { () throws(Errno) -> (Int32, HandleID)? in
                let n = try self.node(node)
                guard n.rec.kind == .file else { throw n.isDir ? .EISDIR : .ELOOP }
                // A node whose content a remote version replaced (its item lives on in a new node):
                // the kernel reached it through a stale name; ESTALE makes it look the name up again.
                if !n.linked, let live = t.byID[n.rec.id], live != n.node { throw .ESTALE }
                // The kernel's pages are being filled from the cache file (`storePages`, a few
                // microseconds): a writer starting now could see its bytes replaced by the older ones.
                if changes && n.storing && waits < Self.storeWaitLimit { return nil }
                relinkCacheFile(n, n.rec.id)
                let fd = store.cache.open(n.rec.id, create: true, size: n.rec.size)
                if fd < 0 { throw Errno(-fd) }
                let h = ids.newHandle(.file(fd))
                n.openHandles += 1
                t.openFiles += 1
                n.handles.insert(h)
                stalePages = n.pagesStale
                n.pagesStale = false
                item = n.rec.id
                if flags & O_ACCMODE != O_RDONLY {
                    t.writerHandles.insert(h)
                    n.writers += 1
                }
                if flags & O_TRUNC != 0 {
                    // The truncation below is a write: under way until its generation moves.
                    n.changing += 1
                    n.fsyncedSinceWrite = false
                }
                return (fd, h)
            }
            if opened == nil { waits += 1; usleep(100) }
        }
        guard let (fd, h) = opened else { throw .EIO }
        if flags & O_TRUNC != 0 {
            var killed = false
            // Atomic O_TRUNC: the kernel leaves the truncation to us (mtime/ctime always change,
            // as on Linux's local filesystems).
            content.willTruncate(item)
            if ftruncate(fd, 0) != 0 {
                let e = Errno.current
                lock.withLock { t.nodes[node]?.changing -= 1 }
                release(node: node, handle: h)
                throw e
            }
            let now = options.clock.wall()
            let changed = lock.withLock { () -> ItemID? in
                guard let n = t.nodes[node] else { return nil }
                n.changing -= 1
                if killSetID { killed = Self.killSetID(n) }
                n.rec.size = 0
                n.rec.mtime = now
                n.rec.ctime = now
                n.rec.dirty = true
                bumpWriteGen(n)
                if n.linked { persist(n) }
                n.metaDirty = true  // the close reports the change (one event per save, not two)
                return n.rec.id
            }
            if let changed {
                // Like a first write: the emptied file's queue entry goes behind the change at
                // once, so the edit survives a stop before its close (a remote state shown
                // meanwhile records the item and leaves the close nothing to report).
                let all = forEveryName(.contentChanged(changed))
                if !Mutation.truncatingOpenUnqueued.isOn { all.forEach(queue) }
                for c in all { observer?.localChange(c) }
            }
            if killed { invalidateAttributesNow(node) }
            // Pages cached from before the truncation must go.
            return FuseOpen(handle: h, keepCache: false)
        }
        // After a remote version the kernel's pages of the old bytes go at this open, not only
        // when the queued invalidation arrives (a presenter told of the version reads at once).
        return FuseOpen(handle: h, keepCache: !stalePages)
    }

    /// Writes through the handle's descriptor, then records the new size and times. With
    /// `killSetID` (a writer who may not keep set-ID bits: not root) the set-user-ID bit and
    /// a group-executable file's set-group-ID bit go, as on Linux's local filesystems.
    public func write(node: NodeID, handle: HandleID, offset: Int64, data: UnsafeRawBufferPointer, killSetID: Bool = false) throws(Errno) -> Int {
        guard let fd = descriptor(handle) else { throw .EBADF }
        lock.withLock { t.nodes[node]?.changing += 1 }
        let n = pwrite(fd, data.baseAddress, data.count, off_t(offset))
        if n < 0 {
            let e = Errno.current
            lock.withLock { t.nodes[node]?.changing -= 1 }
            throw e
        }
        let now = options.clock.wall()
        let mono = options.clock.monotonic()
        var killed = false
        let first = lock.withLock { () -> ItemID? in
            guard let x = t.nodes[node] else { return nil }
            x.changing -= 1
            // (A write of 0 bytes succeeds at any offset, Int64.max too: it changes no size.)
            if n > 0 {
                x.rec.size = max(x.rec.size, offset + Int64(n))
                Self.notePartialPages(x, offset: offset, count: n)
            }
            if killSetID { killed = Self.killSetID(x) }
            x.rec.mtime = now
            x.rec.ctime = now
            x.rec.dirty = true
            let wasClean = !x.metaDirty
            x.metaDirty = true
            x.fsyncedSinceWrite = false
            bumpWriteGen(x)
            x.lastWrite = mono
            x.bytesWritten &+= UInt64(n)
            return wasClean && x.linked ? x.rec.id : nil
        }
        if let first { notify(.writing(first)) }
        if killed { invalidateAttributesNow(node) }
        return n
    }

    /// A new write generation for `n` (lock held): one counter for the whole tree, so a value
    /// names one node's content at one moment. An identity transfer gives the item another node,
    /// and a generation read from the old node never matches the new one.
    func bumpWriteGen(_ n: Node) {
        t.lastWriteGen &+= 1
        n.writeGen = t.lastWriteGen
    }

    public func writeState(_ item: ItemID) -> WriteState? {
        let now = options.clock.monotonic()
        return lock.withLock {
            guard let node = t.byID[item], let n = t.nodes[node] else { return nil }
            return writeState(of: n, now: now)
        }
    }

    /// How `n` is being written (lock held).
    func writeState(of n: Node, now: UInt64) -> WriteState {
        WriteState(writers: n.writers, unsynced: n.writers > 0 && !n.fsyncedSinceWrite, changing: n.changing > 0, generation: n.writeGen,
                   idleNanoseconds: now &- n.lastWrite, dirty: n.metaDirty, written: n.bytesWritten, unnoticed: n.noticesPending > 0)
    }

    /// `MountedTree.snapshot`: the item's row, write state and pending safe save, under one lock.
    public func snapshot(_ item: ItemID) -> TreeSnapshot {
        let now = options.clock.monotonic()
        return lock.withLock {
            guard let node = t.byID[item], let n = t.nodes[node] else { return TreeSnapshot(local: nil, write: nil, pendingSafeSave: false) }
            let isFile = n.rec.kind == .file
            return TreeSnapshot(local: n.linked ? n.record(item) : nil, write: isFile ? writeState(of: n, now: now) : nil,
                                pendingSafeSave: isFile && pendingSafeSave(node, now: now), xattrs: n.xattrs,
                                placedBeside: n.placedBeside && n.rec.id == item)
        }
    }

    /// Drops the cached bytes of a file that nobody has open and that has no unsaved writes:
    /// `decide` (called with the lock held, so no open can race) says whether the engine lets it
    /// go and marks it not present; then the cache file becomes holes of the same size. Throws
    /// EBUSY when the file is open or mid-save, when a change of it has not reached the engine
    /// yet (`noticesPending`: its bytes are unsynced although no queue holds it, as after a save
    /// renamed over it), or `decide` refuses. The kernel's pages go too.
    public func evictContent(_ item: ItemID, decide: () -> Bool) throws(Errno) {
        let node = try lock.withLock { () throws(Errno) -> NodeID in
            guard let node = t.byID[item], let n = t.nodes[node], n.linked else { throw .ENOENT }
            guard n.rec.kind == .file else { throw .EISDIR }
            guard !n.rec.isSpecial else { throw .EINVAL }
            guard n.links.isEmpty else { throw .EBUSY }  // its other names are local content
            guard n.openHandles == 0, !n.metaDirty, n.noticesPending == 0 || Mutation.evictUnnoticedChange.isOn, decide() else { throw .EBUSY }
            n.dropPageStore()
            let fd = store.cache.open(item, create: false)
            if fd >= 0 {
                // Punching keeps the size; a file system without hole punching gets truncated
                // and re-extended (the same result: a sparse file of holes).
                if !punchHole(fd, offset: 0, length: n.rec.size) {
                    ftruncate(fd, 0)
                    ftruncate(fd, off_t(n.rec.size))
                }
                close(fd)
            }
            return n.node
        }
        sendKernel([.node(node)])  // the kernel's cached pages of the file go too
    }

    /// Queues the size/times a handle's writes changed; tells the sync engine the content changed.
    func settle(node: NodeID) {
        let changed = lock.withLock { () -> (ItemID, Node)? in
            guard let n = t.nodes[node], n.metaDirty else { return nil }
            if n.linked { persist(n) } else { n.metaDirty = false }
            guard n.linked else { return nil }
            n.noticesPending += 1
            return (n.rec.id, n)
        }
        if let (id, n) = changed { notify(.contentChanged(id), pending: n) }
    }

    public func flush(node: NodeID, handle: HandleID) {
        if descriptor(handle) != nil { settle(node: node) }
    }

    public func release(node: NodeID, handle: HandleID) {
        guard case .file(let fd)? = ids.release(handle) else { return }
        settle(node: node)
        defer { close(fd) }
        let (closedWriter, pages) = lock.withLock { () -> (ItemID?, PageStore?) in
            t.openFiles -= 1
            let wasWriter = t.writerHandles.remove(handle) != nil
            t.stale[handle] = nil
            guard let n = t.nodes[node] else { return (nil, nil) }
            n.handles.remove(handle)
            n.openHandles -= 1
            if wasWriter { n.writers -= 1 }
            let id = wasWriter && n.linked ? n.rec.id : nil
            let pages = n.openHandles == 0 ? pageStore(n) : nil
            reapIfUnused(n)
            return (id, pages)
        }
        // A push deferred while the file was being written goes now (an unchanged file uploads nothing).
        if let closedWriter { for c in forEveryName(.contentChanged(closedWriter)) { observer?.localChange(c) } }
        if let pages { storePages(node, fd: fd, pages) }
    }

    /// The kernel's pages of a closed file to fill from its cache file.
    struct PageStore {
        var offset: Int64
        var length: Int
        var generation: UInt64
    }

    /// Pages whose content the kernel cannot hold whole after write-through are filled at the
    /// last close, so the next read is served by the kernel (a `cat` right after an untar, an
    /// editor's save read back) instead of asking the daemon. Aligned to 2 MiB, the largest
    /// page a kernel may cache a file in, so every page stored is whole.
    static let storeAlign: Int64 = 2 << 20
    /// Files whose pages to fill span more than this keep the reads (a copy in the kernel's
    /// memory per close would cost more than it saves).
    static let storeLimit: Int64 = 4 << 20
    /// How many times (100 µs apart) a writer's open or a truncation waits for a store under
    /// way before it goes on (then the stored pages are dropped again): a bound, never reached
    /// by a store of a few megabytes.
    static let storeWaitLimit = 10_000
    static let pageSize = Int64(sysconf(Int32(_SC_PAGESIZE)))

    /// Records the first page that a write of `count` bytes at `offset` covered only in part (lock held).
    static func notePartialPages(_ n: Node, offset: Int64, count: Int) {
        let end = offset + Int64(count)
        var first: Int64?
        if offset % pageSize != 0 { first = offset - offset % pageSize } else if end % pageSize != 0 { first = end - end % pageSize }
        if let first { n.partialFrom = min(n.partialFrom ?? first, first) }
    }

    /// What to store of `n`, closed by its last handle (lock held): nil when nothing is owed, a
    /// writer or truncation is under way, or the range is over `storeLimit`.
    func pageStore(_ n: Node) -> PageStore? {
        guard let from = n.partialFrom, n.linked, n.rec.kind == .file, n.writers == 0, n.changing == 0, !n.storing else { return nil }
        n.partialFrom = nil
        let start = from - from % Self.storeAlign
        guard n.rec.size > start, n.rec.size - start <= Self.storeLimit else { return nil }
        n.storing = true
        return PageStore(offset: start, length: Int(n.rec.size - start), generation: n.writeGen)
    }

    /// Fills the kernel's pages (no lock held; the handle's descriptor still open). A change that
    /// could not wait for it (a remote version, an eviction, a writer past `storeWaitLimit`)
    /// drops them again.
    func storePages(_ node: NodeID, fd: Int32, _ s: PageStore) {
        kernel.withLock { $0 }?.storePages(node, fd: fd, offset: s.offset, length: s.length)
        let overrun = lock.withLock { () -> Bool in
            guard let n = t.nodes[node] else { return false }
            n.storing = false
            defer { n.storeOverrun = false }
            return n.storeOverrun || n.writeGen != s.generation || n.writers > 0 || n.changing > 0
        }
        if overrun { sendKernel([.node(node)]) }
    }

    /// Whether `item` is mid-save: open for writing with writes since the last fsync. Its content
    /// must not be uploaded yet; the close (or fsync) announces it again.
    public func isBeingWritten(_ item: ItemID) -> Bool {
        lock.withLock {
            guard let node = t.byID[item], let n = t.nodes[node] else { return false }
            return n.writers > 0 && !n.fsyncedSinceWrite
        }
    }

    /// The item's data and its metadata to disk: the metadata (and the change's queue entries)
    /// are queued first and the database's full commit starts, so its fsync runs while this
    /// thread's `fsync` of the data does; then this waits for the commit. Either may land first
    /// in a crash: the start reconciles a recorded size with the bytes in the cache file.
    public func fsync(node: NodeID, handle: HandleID, dataOnly: Bool) throws(Errno) {
        guard let fd = descriptor(handle) else { return }
        lock.withLock { t.nodes[node]?.fsyncedSinceWrite = true }
        settle(node: node)
        store.startSync()
        if (dataOnly ? fdatasync(fd) : Glibc.fsync(fd)) != 0 { throw Errno.current }
        try syncMetadata()
    }

    public func fsyncdir() throws(Errno) { try syncMetadata() }

    /// Commits every queued change with fsync (never called with `lock` held). While the local
    /// state cannot be saved: ENOSPC for a full disk, else EIO (the changes stay queued and the
    /// next fsync that finds them committed answers 0).
    public func syncMetadata() throws(Errno) {
        if let failure = store.sync() { throw Errno(failure.errno) }
        store.cache.syncDirectories()
    }

    public func fallocate(node: NodeID, handle: HandleID, mode: Int32, offset: Int64, length: Int64) throws(Errno) {
        guard let fd = descriptor(handle) else { throw .EBADF }
        guard mode == 0 else { throw .EOPNOTSUPP }
        let rc = posix_fallocate(fd, off_t(offset), off_t(length))
        if rc != 0 { throw Errno(rc) }
        let now = options.clock.wall()
        lock.withLock {
            let (end, overflow) = offset.addingReportingOverflow(length)
            guard let n = t.nodes[node], !overflow, end > n.rec.size else { return }
            n.rec.size = end
            n.rec.ctime = now
            n.rec.dirty = true
            persist(n)
        }
    }

    /// chmod, chown, truncate, utimes. The kernel (default_permissions) has checked who may do
    /// what. Set-ID bits are this filesystem's to clear (FUSE_HANDLE_KILLPRIV_V2): a chown of
    /// anything but a folder clears them, and a truncate when the kernel says so (`killSetID`).
    public func setattr(node: NodeID, _ c: FuseSetAttr, handle: HandleID?) throws(Errno) -> stat {
        if let size = c.size {
            if size < 0 { throw .EINVAL }
            var waits = 0
            var target: ItemID?
            while target == nil {
                target = try lock.withLock { () throws(Errno) -> ItemID? in
                    let n = try self.node(node)
                    if n.isDir { throw .EISDIR }
                    guard n.rec.kind == .file else { throw .EINVAL }
                    // Not while the kernel's pages are being filled (`storePages`).
                    if n.storing && waits < Self.storeWaitLimit { return nil }
                    // The truncation is a write: under way until its generation moves (below).
                    n.changing += 1
                    n.fsyncedSinceWrite = false
                    return n.rec.id
                }
                if target == nil { waits += 1; usleep(100) }
            }
            guard let id = target else { throw .EIO }
            content.willTruncate(id)
            let failed: Errno? = {
                if let fd = handle.flatMap(descriptor) {
                    return ftruncate(fd, off_t(size)) != 0 ? Errno.current : nil
                }
                let fd = store.cache.open(id, create: true)
                if fd < 0 { return Errno(-fd) }
                defer { close(fd) }
                return ftruncate(fd, off_t(size)) != 0 ? Errno.current : nil
            }()
            if let failed {
                lock.withLock { t.nodes[node]?.changing -= 1 }
                throw failed
            }
        }
        let now = options.clock.wall()
        let (st, id, content, viaWriter, changed) = try lock.withLock { () throws(Errno) -> (stat, ItemID, Bool, Bool, Node) in
            let n = try self.node(node)
            if let m = c.mode { n.rec.mode = (n.rec.mode & UInt32(S_IFMT)) | (UInt32(m) & 0o7777) }
            if c.killSetID || ((c.uid != nil || c.gid != nil) && !n.isDir) { n.rec.mode = Self.killSetID(n.rec.mode) }
            if let u = c.uid { n.rec.uid = u }
            if let g = c.gid { n.rec.gid = g }
            if let size = c.size {
                if size != n.rec.size { n.rec.mtime = now }
                n.rec.size = size
                n.rec.dirty = true
                n.changing -= 1
                bumpWriteGen(n)
            }
            switch c.atime { case .now?: n.rec.atime = now; case .at(let ts)?: n.rec.atime = Self.ns(ts); case nil: break }
            switch c.mtime { case .now?: n.rec.mtime = now; case .at(let ts)?: n.rec.mtime = Self.ns(ts); case nil: break }
            n.rec.ctime = c.ctime.map(Self.ns) ?? now
            if n.linked { persist(n) }
            // A truncate through an open writer is reported by its close, like its writes.
            let viaWriter = c.size != nil && handle.map { t.writerHandles.contains($0) } == true
            if viaWriter { n.metaDirty = true }
            n.noticesPending += 1
            return (attr(n), n.rec.id, c.size != nil, viaWriter, n)
        }
        if viaWriter {
            for c in forEveryName(.contentChanged(id)) { observer?.localChange(c) }
            lock.withLock { changed.noticesPending -= 1 }
        } else {
            notify(content ? .contentChanged(id) : .attributesChanged(id), pending: changed)
        }
        return st
    }

    /// `mode` without the set-user-ID bit, and without the set-group-ID bit when the group may
    /// execute (without group execute it marks mandatory locking and stays), as Linux clears
    /// them on write, truncate and chown.
    static func killSetID(_ mode: UInt32) -> UInt32 {
        var m = mode & ~UInt32(S_ISUID)
        if m & UInt32(S_IXGRP) != 0 { m &= ~UInt32(S_ISGID) }
        return m
    }

    /// Clears `n`'s set-ID bits (lock held); whether its mode changed. The kernel asked for
    /// FUSE_HANDLE_KILLPRIV_V2 does not drop the mode it cached on a write or an open, so
    /// the caller then sends `invalidateAttributesNow`, before answering.
    static func killSetID(_ n: Node) -> Bool {
        let m = killSetID(n.rec.mode)
        guard m != n.rec.mode else { return false }
        n.rec.mode = m
        return true
    }

    /// Drops the kernel's cached attributes of `node` at once (never under `lock`): sent from
    /// inside the request, so the caller's next stat cannot see the old mode.
    func invalidateAttributesNow(_ node: NodeID) {
        kernel.withLock { $0 }?.invalidateAttributes(node)
    }
}
