import Foundation
import NimbusCore

/// The content cache: one file per item at `cache/<first two hex digits>/<item id>`, sparse while
/// partly downloaded (which chunks are present is the sync engine's base). A placeholder has no
/// file until its content is first needed (open, download, upload): creating 100,000 empty
/// files was most of a first sync's time, and far more on ext4 than on tmpfs.
public struct ContentCache: Sendable {
    public let directory: URL
    /// `directory.path`, kept: `URL.path` decodes the URL again on every call.
    private let root: String

    public init(directory: URL) throws {
        self.directory = directory
        root = directory.path
        try StateFiles.directory(directory.path)
    }

    /// Exchanges the content files of `a` and `b` (open descriptors keep their files). Both
    /// must exist. False (and nothing changed) when a rename fails.
    public func exchange(_ a: ItemID, _ b: ItemID) -> Bool {
        let pa = path(for: a), pb = path(for: b), tmp = pa + ".exchange"
        guard Glibc.rename(pa, tmp) == 0 else { return false }
        guard Glibc.rename(pb, pa) == 0 else { _ = Glibc.rename(tmp, pa); return false }
        guard Glibc.rename(tmp, pb) == 0 else { _ = Glibc.rename(pa, pb); _ = Glibc.rename(tmp, pa); return false }
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
            mkdir((p as NSString).deletingLastPathComponent, 0o700)
            fd = Glibc.open(p, flags | O_CREAT | O_EXCL, 0o600)
        }
        if fd < 0 && errno == EEXIST {
            fd = Glibc.open(p, flags)  // created meanwhile: it has its size already
        } else if fd >= 0 && size > 0 && ftruncate(fd, off_t(size)) != 0 {
            let e = errno
            close(fd)
            unlink(p)
            return -e
        }
        return fd >= 0 ? fd : -errno
    }

    public func remove(_ id: ItemID) { unlink(path(for: id)) }

    /// Gives item `to` the file of item `from` (a hard link on disk: the names of a file linked
    /// in the mount share one content file). 0 or an errno.
    public func link(_ from: ItemID, as to: ItemID) -> Int32 {
        let dest = path(for: to)
        if Glibc.link(path(for: from), dest) == 0 { return 0 }
        guard errno == ENOENT else { return errno }
        mkdir((dest as NSString).deletingLastPathComponent, 0o700)
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
        mkdir(trashDirectory, 0o700)
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
        mkdir((p as NSString).deletingLastPathComponent, 0o700)
        return Glibc.rename(trashed, p) == 0
    }

    /// Size of the cached file, `nil` when absent.
    public func size(of id: ItemID) -> Int64? {
        var st = stat()
        return stat(path(for: id), &st) == 0 ? Int64(st.st_size) : nil
    }

    /// Makes the cache directory entries of new files durable.
    public func syncDirectories() {
        guard let subdirs = try? FileManager.default.contentsOfDirectory(atPath: directory.path) else { return }
        for d in subdirs + ["."] {
            let fd = Glibc.open(root + "/" + d, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            if fd >= 0 { fsync(fd); close(fd) }
        }
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
