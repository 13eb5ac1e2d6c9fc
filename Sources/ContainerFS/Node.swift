import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore

/// The in-memory state of one item. Guarded by `ContainerFS.lock` (every field).
final class Node {
    var rec: ItemRecord { didSet { recount() } }
    /// Kernel lookup count: +1 per entry reply (lookup, create, mkdir, readdirplus…), −n per forget.
    var lookups: UInt64 = 0
    /// When (monotonic ns) a listing of this folder with attributes (readdirplus) last began:
    /// the kernel's entries and attributes of its children are fresh for a while after it.
    var listedAt: UInt64 = 0
    /// Node id of the parent folder (root: itself); mirrors `rec.parent`.
    var parentNode = NodeID.root
    /// Open file handles (files) — an unlinked file lives on while either count is positive.
    var openHandles = 0
    /// Every open handle of this file (for swapping the cache file under readers).
    var handles: Set<HandleID> = []
    /// Handles open for writing. While positive (and no fsync since the last write) the content
    /// is mid-save: the sync engine must not upload it (docs/sync.md).
    var writers = 0
    /// An fsync came after the last write: the content is a state the writer asked to keep.
    var fsyncedSinceWrite = false
    /// Writes and truncations under way: their bytes change outside the lock, and the write
    /// generation moves only when they are done, so a reader of the content (an upload's
    /// chunking) also needs to know that one is under way (`WriteState.changing`).
    var changing = 0
    /// Folder contents: name → node id, names compared by bytes.
    var children = Children()
    /// Number of child folders (for st_nlink = 2 + subfolders).
    var subdirs = 0
    var xattrs: [String: [UInt8]] = [:]
    /// False once unlinked/removed/replaced; the node stays until forgotten and closed.
    var linked = true { didSet { recount() } }
    /// The tree's counts while the node is in `Tables.nodes`, and what it adds to them.
    private var counts: TreeCounts?
    private var counted = TreeCounts.Share()
    /// Size/times changed by writes but not yet queued for the database (queued on flush/fsync/release).
    var metaDirty = false
    /// The generation of the last write, truncate or identity transfer (`ContainerFS.bumpWriteGen`,
    /// unique in the tree; 0 = none since the node was made): a snapshot taken between two equal
    /// readings saw no change.
    var writeGen: UInt64 = 0
    /// When the last write ended (CLOCK_MONOTONIC, ns).
    var lastWrite: UInt64 = 0
    /// Bytes programs wrote into this node's content (wrapping): what upload pacing measures
    /// uploads against.
    var bytesWritten: UInt64 = 0
    /// A remote version replaced the content in place: the kernel may still hold pages of the old
    /// bytes (its invalidation is sent later, off the lock), so the next open drops them.
    var pagesStale = false
    /// Where the first kernel page begins that a write covered only in part since the last
    /// `ContainerFS.storePages` (nil: none). Writes go through, and the kernel keeps a page it
    /// was given whole only: such a page's next read would ask the daemon.
    var partialFrom: Int64?
    /// `ContainerFS.storePages` is filling the kernel's pages of this file: no writer opens and
    /// no truncation starts until it is done (the kernel would keep the older bytes).
    var storing = false
    /// A remote version or an eviction changed the content while `storing`: the pages stored
    /// are dropped again once it is done.
    var storeOverrun = false
    /// No pages are owed to the kernel; a store under way is taken back when it ends.
    func dropPageStore() {
        partialFrom = nil
        if storing { storeOverrun = true }
    }
    /// Changes of this content made under the lock whose notice the sync engine has not had yet
    /// (`ContainerFS.notify(_:pending:)`): while positive, no remote state replaces or deletes
    /// the content, since the engine would not know it holds a local change.
    var noticesPending = 0
    /// Bumped by every rename or move of the item made here; `placeNoticed` is the last one the
    /// sync engine has heard of. A remote state planned before a move here, or shown while the
    /// move's notice is on its way, keeps the local place (`applyOne`): a pull never undoes a
    /// local rename.
    var placeGen: UInt64 = 0
    /// Its place is the name beside a local-only item that this device chose for it (`nameBeside`),
    /// not one a program chose: that move is pushed to apply only if no one moved it meanwhile.
    /// A rename here ends it. (In memory: after a restart the move is pushed as any.)
    var placedBeside = false
    /// `setxattr`/`removexattr` calls whose notice the sync engine has not had yet, by name: a
    /// remote state keeps those names as they are here (they are pushed next) and brings the
    /// others (`XattrRules.shown`).
    var xattrNotices: [String: Int] = [:]
    var placeNoticed: UInt64 = 0
    /// A change of this content waits for its notice (`noticesPending`).
    var unnoticed: Bool { noticesPending > 0 && !Mutation.pullOverlooksUnnoticedChange.isOn }
    /// Open for writing, or written since its last close or fsync: no remote state replaces
    /// the bytes (the engine decides the same from the facts it read; this is the check at the
    /// moment of showing, under the lock, for a writer that came in between).
    var beingWritten: Bool { (metaDirty || writers > 0) && !Mutation.dropWriterHold.isOn }

    /// The file's other names, made here by link(2) (docs/posix.md "Hard links"): each is an item
    /// of its own, which the server and other devices see as an ordinary file with the same
    /// content. `rec` holds the first name; everything but the place is the node's, shared.
    var links: [LinkName] = []
    /// Names this file had and lost while it had others (`ContainerFS.dropName`).
    var droppedNames: Set<ItemID> = []

    init(_ rec: ItemRecord) { self.rec = rec }

    /// What this node adds to `.nimbus/status`'s counts: a linked folder, or a linked file (not
    /// a FIFO, socket or device) and its bytes.
    var share: TreeCounts.Share {
        guard linked else { return TreeCounts.Share() }
        if isDir { return TreeCounts.Share(folders: 1) }
        if rec.kind == .file && !rec.isSpecial { return TreeCounts.Share(files: 1, bytes: rec.size) }
        return TreeCounts.Share()
    }

    private func recount() {
        guard let counts else { return }
        let now = share
        guard now != counted else { return }
        counts.add(counted, -1)
        counts.add(now, 1)
        counted = now
    }

    /// The node went into the tree's table (`NodeMap`): it counts there.
    fileprivate func join(_ c: TreeCounts) {
        counts = c
        counted = share
        c.add(counted, 1)
    }

    /// The node left the tree's table.
    fileprivate func leave() {
        counts?.add(counted, -1)
        counts = nil
        counted = TreeCounts.Share()
    }

    var isDir: Bool { rec.kind == .folder }
    var node: NodeID { rec.node }

    /// Every item naming this node: the first name's, then the links'.
    var itemIDs: [ItemID] { links.isEmpty ? [rec.id] : [rec.id] + links.map(\.id) }
    /// `st_nlink` of a file: one per name (0 once unlinked).
    var nameCount: Int { linked ? 1 + links.count : 0 }

    func linkIndex(_ id: ItemID) -> Int? { links.isEmpty ? nil : links.firstIndex { $0.id == id } }

    /// The row of item `id`, one of this node's names: `rec` at that name's place.
    func record(_ id: ItemID) -> ItemRecord {
        guard let i = linkIndex(id) else { return rec }
        var r = rec
        r.id = links[i].id
        r.parent = links[i].parent
        r.name = links[i].name
        return r
    }

    /// The place of item `id` (its folder's item and node, its name).
    func place(_ id: ItemID) -> (parent: ItemID?, parentNode: NodeID, name: String) {
        guard let i = linkIndex(id) else { return (rec.parent, parentNode, rec.name) }
        return (links[i].parent, links[i].parentNode, links[i].name)
    }

    func setPlace(_ id: ItemID, parent: ItemID, parentNode p: NodeID, name: String) {
        guard let i = linkIndex(id) else {
            rec.parent = parent
            rec.name = name
            parentNode = p
            return
        }
        links[i].parent = parent
        links[i].parentNode = p
        links[i].name = name
    }

    /// The item naming this node as `name` in folder `folder` (the first name's when none does).
    func id(in folder: NodeID, named name: String) -> ItemID {
        if links.isEmpty || (parentNode == folder && ItemName.same(rec.name, name)) { return rec.id }
        return links.first { $0.parentNode == folder && ItemName.same($0.name, name) }?.id ?? rec.id
    }

    /// `placeGen` of item `id`, one of this node's names; `movedHere` bumps it.
    func placeGen(_ id: ItemID) -> UInt64 { linkIndex(id).map { links[$0].placeGen } ?? placeGen }
    func placeNoticed(_ id: ItemID) -> UInt64 { linkIndex(id).map { links[$0].placeNoticed } ?? placeNoticed }
    func movedHere(_ id: ItemID) -> UInt64 {
        guard let i = linkIndex(id) else {
            placeGen &+= 1
            placedBeside = false
            return placeGen
        }
        links[i].placeGen &+= 1
        return links[i].placeGen
    }
    /// (A name of this file removed meanwhile, `droppedNames`, is no one's: its generation must
    /// not become the first name's.)
    func noticedPlace(_ id: ItemID, _ gen: UInt64) {
        if let i = linkIndex(id) {
            if links[i].placeNoticed < gen { links[i].placeNoticed = gen }
        } else if !droppedNames.contains(id), placeNoticed < gen {
            placeNoticed = gen
        }
    }
}

/// A hard link's name (`Node.links`): its item, its folder and name, and its own rename
/// generations (`Node.placeGen`).
struct LinkName {
    var id: ItemID
    var parent: ItemID
    var parentNode: NodeID
    var name: String
    var placeGen: UInt64 = 0
    var placeNoticed: UInt64 = 0
}

/// A folder's names → node ids. Names compare by their bytes, as on every Linux filesystem
/// (`ItemName.same`): an NFC and an NFD spelling of `é` are two entries, as they are two items
/// on the server. A `[String: NodeID]` would make them one (Swift's `String ==` compares
/// canonical equivalence).
struct Children: Sequence {
    private struct Key: Hashable {
        let name: String
        static func == (a: Key, b: Key) -> Bool { ItemName.same(a.name, b.name) }
        func hash(into h: inout Hasher) { ItemName.hashBytes(name, into: &h) }
    }
    private var map: [Key: NodeID] = [:]

    subscript(name: String) -> NodeID? {
        get { map[Key(name: name)] }
        set { map[Key(name: name)] = newValue }
    }
    var isEmpty: Bool { map.isEmpty }
    var count: Int { map.count }

    func makeIterator() -> some IteratorProtocol<(name: String, node: NodeID)> {
        map.lazy.map { (name: $0.key.name, node: $0.value) }.makeIterator()
    }
}

/// What `.nimbus/status` counts of the tree — linked folders, files and their bytes — kept as
/// nodes change (`Node.share`), so a read of it does not look at every node under the lock.
final class TreeCounts {
    private(set) var files = 0
    private(set) var folders = 0
    private(set) var bytes: Int64 = 0

    struct Share: Equatable {
        var files = 0
        var folders = 0
        var bytes: Int64 = 0
    }

    func add(_ s: Share, _ sign: Int) {
        files += sign * s.files
        folders += sign * s.folders
        bytes += Int64(sign) * s.bytes
    }
}

/// The nodes by id, with the counts of those linked (`TreeCounts`): a node counts while it is in
/// the table.
struct NodeMap {
    private var map: [NodeID: Node] = [:]
    let counts = TreeCounts()

    subscript(id: NodeID) -> Node? {
        get { map[id] }
        set {
            let old = map[id]
            guard old !== newValue else { return }
            old?.leave()
            newValue?.join(counts)
            map[id] = newValue
        }
    }

    var values: Dictionary<NodeID, Node>.Values { map.values }
    var count: Int { map.count }
}

/// The tables behind the lock.
final class Tables {
    var nodes = NodeMap()
    /// Item id → node id of every node in `nodes` (the sync engine addresses items by id).
    var byID: [ItemID: NodeID] = [:]
    /// The last write generation given out (`ContainerFS.bumpWriteGen`).
    var lastWriteGen: UInt64 = 0
    /// File handles open for writing.
    var writerHandles: Set<HandleID> = []
    /// Handles whose file's content was replaced by a remote version while they were open: they
    /// keep reading the old cache file (unlinked, so only they see it). `present` says which bytes
    /// of it are there (nil: all); reads of the rest fail with EIO — never a mix of versions.
    var stale: [HandleID: StaleHandle] = [:]
    /// Safe-save detection (ContainerFS+Remove.swift): files recently renamed away from a name,
    /// and new files created under such a name (new node → renamed node, when).
    var renamedAway: [(folder: NodeID, name: String, node: NodeID, at: UInt64)] = []
    var safeSaves: [NodeID: (renamed: NodeID, at: UInt64)] = [:]
    /// Open listings of the tree: handle → snapshot.
    var dirs: [HandleID: DirSnapshot] = [:]
    var openFiles = 0
    /// Parsed `.nimbusignore` files by their node (ContainerFS+Ignore.swift).
    var ignoreFiles: [NodeID: ParsedIgnore] = [:]
}

/// A reader of `.nimbus/events`: `caller` nil sees every line; otherwise only the lines whose
/// paths the caller can reach, through a cursor of its own.
struct EventReader {
    var caller: Caller?
    var cursor = EventLog.FilteredCursor()
}

struct StaleHandle {
    var present: (@Sendable (Range<Int64>) -> Bool)?
}

/// A directory listing fixed at `opendir` (and at rewind): offsets index into it, so entries
/// are neither skipped nor repeated while the folder changes.
struct DirSnapshot {
    var node: NodeID
    var entries: [(name: String, node: NodeID)]
}

/// Removed items' cache files whose move to the trash is owed (`ContainerFS.retire`): waiting
/// for a thread to take them, or being renamed by one.
struct RetiringFiles {
    var waiting: Set<ItemID> = []
    var moving: Set<ItemID> = []
}

/// A pthread mutex, first in `LockRank`'s order (checked in debug builds). Nothing is
/// ever replied to the kernel, and no kernel notification is sent, while `lock` is held.
/// Disk work that a change owes but that need not happen under the lock (`afterUnlock`) runs
/// on the same thread right after it releases the lock, so other requests do not wait for it.
final class FSLock: @unchecked Sendable {
    // @unchecked: the mutex is the synchronization (`after` is touched with it held).
    private var m = pthread_mutex_t()
    private var after: [() -> Void] = []
    init() { pthread_mutex_init(&m, nil) }
    @inline(__always) func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        LockRank.tree.entering()
        pthread_mutex_lock(&m)
        defer {
            if after.isEmpty {
                pthread_mutex_unlock(&m)
                LockRank.tree.leaving()
            } else {
                unlockThenRunAfter()
            }
        }
        return try body()
    }

    /// `work` runs on this thread once it has released the lock (lock held).
    func afterUnlock(_ work: @escaping () -> Void) { after.append(work) }

    @inline(never) private func unlockThenRunAfter() {
        let work = after
        after = []
        pthread_mutex_unlock(&m)
        LockRank.tree.leaving()
        for w in work { w() }
    }
}
