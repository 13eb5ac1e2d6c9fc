import Foundation
import NimbusCore
import Synchronization

/// The content cache: one file per item at `cache/<first two hex digits>/<item id>`, sparse while
/// partly downloaded (which chunks are present is the sync engine's base). A placeholder has no
/// file until its content is first needed (open, download, upload): creating 100,000 empty
/// files was most of a first sync's time, and far more on ext4 than on tmpfs.
public struct ContentCache: Sendable {
    public let directory: URL
    /// `directory.path`, kept: `URL.path` decodes the URL again on every call.
    private let root: String
    /// The fan-out folders that got a new name since the last `syncDirectories`.
    let unsynced = FolderMarks()

    public init(directory: URL) throws {
        self.directory = directory
        root = directory.path
        try StateFiles.directory(directory.path)
        // The 256 fan-out folders are made with the cache (when they exist, 256 failing
        // `mkdir`s: well under a millisecond). Made at a file's first need instead, each would
        // cost that file's create an ext4 `mkdir` (~0.1 ms), most of the first thousand files of
        // a new state paying one. (`open` and `link` still make a missing one.)
        for i in 0..<256 { mkdir(folder(i), 0o700) }
        // Names made by an earlier run may not be durable yet: the first sync takes every folder.
        for i in 0...256 { unsynced.mark(i) }
    }

    /// A folder in the cache folder (fan-out or trash), when missing.
    private func makeFolder(_ path: String) {
        if mkdir(path, 0o700) == 0 { unsynced.mark(FolderMarks.cacheFolder) }
    }

    /// Fan-out folder `i` (the first byte of the ids it holds, as the two hex digits that begin
    /// their text).
    private func folder(_ i: Int) -> String {
        let digits = Array("0123456789abcdef".utf8)
        return root + "/" + String(decoding: [digits[i >> 4 & 15], digits[i & 15]], as: UTF8.self)
    }

    private func newName(_ id: ItemID) { unsynced.mark(Int(id.uuid.uuid.0)) }

    /// A file was put at the item's place by other means than this type (a copy renamed into
    /// place): the next `syncDirectories` makes its name durable.
    public func placed(_ id: ItemID) { newName(id) }

    /// Exchanges the content files of `a` and `b` (open descriptors keep their files). Both
    /// must exist. False (and nothing changed) when a rename fails.
    public func exchange(_ a: ItemID, _ b: ItemID) -> Bool {
        let pa = path(for: a), pb = path(for: b), tmp = pa + ".exchange"
        guard Glibc.rename(pa, tmp) == 0 else { return false }
        guard Glibc.rename(pb, pa) == 0 else { _ = Glibc.rename(tmp, pa); return false }
        guard Glibc.rename(tmp, pb) == 0 else { _ = Glibc.rename(pa, pb); _ = Glibc.rename(tmp, pa); return false }
        newName(a)
        newName(b)
        return true
    }

    public func path(for id: ItemID) -> String {
        let s = id.description
        return root + "/" + s.prefix(2) + "/" + s
    }

    /// Opens the item's file, creating it (and its fan-out folder) when `create` is set; a file
    /// created by this call gets `size` (holes: a placeholder's bytes are not here yet).
    /// Returns a file descriptor or a negative errno.
    /// `fresh`: the item is new, so its file is created first (one `open` instead of two).
    public func open(_ id: ItemID, create: Bool, truncate: Bool = false, size: Int64 = 0, fresh: Bool = false) -> Int32 {
        let p = path(for: id)
        var flags = O_RDWR | O_CLOEXEC
        if truncate { flags |= O_TRUNC }
        var fd: Int32 = -1
        if !(fresh && create) {
            fd = Glibc.open(p, flags)
            guard fd < 0, errno == ENOENT, create else { return fd >= 0 ? fd : -errno }
        }
        fd = Glibc.open(p, flags | O_CREAT | O_EXCL, 0o600)
        if fd < 0 && errno == ENOENT {
            makeFolder((p as NSString).deletingLastPathComponent)
            fd = Glibc.open(p, flags | O_CREAT | O_EXCL, 0o600)
        }
        if fd < 0 && errno == EEXIST {
            fd = Glibc.open(p, flags)  // created meanwhile: it has its size already
        } else if fd >= 0 && size > 0 && ftruncate(fd, off_t(size)) != 0 {
            let e = errno
            close(fd)
            unlink(p)
            return -e
        } else if fd >= 0 {
            newName(id)
        }
        return fd >= 0 ? fd : -errno
    }

    public func remove(_ id: ItemID) { unlink(path(for: id)) }

    /// Gives item `to` the file of item `from` (a hard link on disk: the names of a file linked
    /// in the mount share one content file). 0 or an errno.
    public func link(_ from: ItemID, as to: ItemID) -> Int32 {
        let dest = path(for: to)
        newName(to)
        if Glibc.link(path(for: from), dest) == 0 { return 0 }
        guard errno == ENOENT else { return errno }
        makeFolder((dest as NSString).deletingLastPathComponent)
        return Glibc.link(path(for: from), dest) == 0 ? 0 : errno
    }

    /// Where the files of deleted items wait until their deletion is committed.
    public var trashDirectory: String { root + "/trash" }

    /// Moves the item's file to the trash under a name of its own and returns that path (nil:
    /// no file). The caller has the file removed once the item's deletion is committed
    /// (`StoreChange.removeFile`): after a `kill -9` that lost the deletion, the item comes back
    /// from the database with its bytes (`restore`), not as an empty file.
    public func trash(_ id: ItemID) -> String? {
        let dest = trashDirectory + "/" + id.description + "." + FastUUID.make().uuidString
        if Glibc.rename(path(for: id), dest) == 0 { return dest }
        guard errno == ENOENT else { unlink(path(for: id)); return nil }
        makeFolder(trashDirectory)
        return Glibc.rename(path(for: id), dest) == 0 ? dest : nil
    }

    /// The newest trashed file of each item in the trash (read once at start: listing the
    /// trash for every file without a cache file cost a start of 100,000 placeholders ~1 s).
    public func trashedFiles() -> [ItemID: String] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: trashDirectory) else { return [:] }
        var best: [ItemID: (path: String, mtime: Int)] = [:]
        for n in names {
            guard let dot = n.firstIndex(of: "."), let id = ItemID(String(n[..<dot])) else { continue }
            var st = stat()
            let full = trashDirectory + "/" + n
            guard stat(full, &st) == 0 else { continue }
            let mtime = st.st_mtim.tv_sec * 1_000_000_000 + st.st_mtim.tv_nsec
            if let b = best[id], b.mtime >= mtime { continue }
            best[id] = (full, mtime)
        }
        return best.mapValues(\.path)
    }

    /// Puts a trashed file (`trashedFiles`) back as the item's file, when the item has none (its
    /// deletion was lost in a crash). True when restored.
    public func restore(_ trashed: String, as id: ItemID) -> Bool {
        let p = path(for: id)
        makeFolder((p as NSString).deletingLastPathComponent)
        newName(id)
        return Glibc.rename(trashed, p) == 0
    }

    /// Size of the cached file, `nil` when absent.
    public func size(of id: ItemID) -> Int64? {
        var st = stat()
        return stat(path(for: id), &st) == 0 ? Int64(st.st_size) : nil
    }

    /// Makes the cache directory entries of new files durable: the fan-out folders that got a
    /// name since the last call, and the cache folder when it got one (each `fsync` of a file in
    /// the mount calls this: syncing all 257 folders each time would be ~800 system calls, half
    /// of an `fsync`'s time). The trash's names need no sync: a trashed file whose move is lost in a
    /// crash is back at its place, which the start handles like the trashed one.
    public func syncDirectories() {
        for i in unsynced.take() { syncFolder(i == FolderMarks.cacheFolder ? root : folder(i)) }
    }

    private func syncFolder(_ path: String) {
        let fd = Glibc.open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if fd >= 0 { fsync(fd); close(fd) }
    }

    /// Deletes cache files of items that no longer exist (left by a crash between an unlink and
    /// the release of its last handle). Returns how many were removed.
    @discardableResult
    public func sweep(keeping live: Set<ItemID>) -> Int {
        var removed = 0
        let fm = FileManager.default
        guard let subdirs = try? fm.contentsOfDirectory(atPath: directory.path) else { return 0 }
        for d in subdirs {
            guard let files = try? fm.contentsOfDirectory(atPath: root + "/" + d) else { continue }
            for f in files where ItemID(f).map({ !live.contains($0) }) ?? true {
                unlink(root + "/" + d + "/" + f)
                removed += 1
            }
        }
        return removed
    }
}

/// A set of fan-out folders (0–255) and the cache folder (256), marked from any thread.
final class FolderMarks: Sendable {
    static let cacheFolder = 256
    private let words = Mutex<[UInt64]>([0, 0, 0, 0, 0])

    func mark(_ i: Int) {
        words.withLock { $0[min(i >> 6, 4)] |= UInt64(1) << UInt64(i & 63) }
    }

    /// The marked folders, unmarked (one marked meanwhile waits for the next call).
    func take() -> [Int] {
        let taken = words.withLock { w in defer { w = [0, 0, 0, 0, 0] }; return w }
        var out: [Int] = []
        for (n, word) in taken.enumerated() {
            var bits = word
            while bits != 0 {
                out.append(n * 64 + bits.trailingZeroBitCount)
                bits &= bits - 1
            }
        }
        return out
    }
}
