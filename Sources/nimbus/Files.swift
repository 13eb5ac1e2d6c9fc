#if canImport(CFuse3)
import ArgumentParser
import CFuse3  // getxattr/setxattr (sys/xattr.h), not in Glibc's module
import Foundation
import Glibc
import NimbusCore

// `nimbus status|download|evict|pin|unpin|pause|resume`: thin shells over the mount's own
// surface (user.nimbus.* xattrs and .nimbus/status, docs/sync.md "Status and control"), so
// what the CLI does, `getfattr`/`setfattr`/`cat` can do too.

enum MountSurface {
    static func get(_ path: String, _ name: NimbusXattr) -> String? {
        var buf = [UInt8](repeating: 0, count: 4096)
        let n = lgetxattr(realPath(path) ?? path, name.name, &buf, buf.count)
        guard n >= 0 else { return nil }
        return String(decoding: buf[0..<n], as: UTF8.self)
    }

    static func set(_ path: String, _ name: NimbusXattr, _ value: String) throws {
        let bytes = Array(value.utf8)
        // On the resolved path (`root(of:)` checked it is inside the mount) and without following
        // a link: a link swapped in meanwhile is not followed either.
        if lsetxattr(realPath(path) ?? path, name.name, bytes, bytes.count, 0) != 0 {
            let e = errno
            let what: String
            switch e {
            case EBUSY: what = "kept: open, being written, waiting for upload, downloading, or pinned through its folder"
            case EIO: what = "the server cannot be reached (or sync is paused); try again when online"
            case EINVAL: what = "the server refused: no such version, or not a conflict version (see nimbus versions)"
            case ENOENT: what = "not on the server yet (never uploaded) or no such version"
            case EPERM, ENOTSUP, EOPNOTSUPP: what = "not a synced Nimbus mount (or not a file or folder)"
            default: what = String(cString: strerror(e))
            }
            throw CLIFailure(e == EIO ? .network : .usage, "\(path): \(what)")
        }
    }

    /// The mount `path` is in: the nearest folder with a `.nimbus/status` above it. The path is
    /// resolved one component at a time, every symbolic link followed: once a component is
    /// inside a mount, every later one must stay inside that mount, so a link in the mount that
    /// leads out of it (to another mount, or anywhere else) is refused, and no command ever
    /// acts on a file elsewhere. A link to the mount (`~/Nimbus`) is fine. A path that does not
    /// exist yet is judged by its existing folders. Returns the root as `path` names it when it
    /// names it, else the mount's real root.
    static func root(of path: String) throws -> String {
        let abs = URL(fileURLWithPath: path).standardizedFileURL.path
        var prefix = ""
        var entered: (real: String, named: String?)?
        for part in abs.split(separator: "/", omittingEmptySubsequences: true) {
            prefix += "/" + part
            guard let real = realPath(prefix) else { break }
            if let m = entered {
                guard real == m.real || real.hasPrefix(m.real == "/" ? "/" : m.real + "/") else {
                    throw CLIFailure(.usage, "\(path) leads out of the Nimbus mount at \(m.named ?? m.real) through a symbolic link (\(prefix) is \(real)); nothing was changed (give a path inside the mount)")
                }
            } else if let r = mountRoot(containing: real) {
                entered = (r, real == r ? prefix : nil)
            }
        }
        guard let m = entered else { throw CLIFailure(.usage, "\(path) is not inside a Nimbus mount") }
        return m.named ?? m.real
    }

    /// The nearest folder at or above `real` (a path without links) that has a `.nimbus/status`.
    static func mountRoot(containing real: String) -> String? {
        var url = URL(fileURLWithPath: real)
        while true {
            if FileManager.default.fileExists(atPath: url.path + "/.nimbus/status") { return url.path }
            let up = url.deletingLastPathComponent()
            if up.path == url.path { return nil }
            url = up
        }
    }

    static func realPath(_ p: String) -> String? {
        guard let r = realpath(p, nil) else { return nil }
        defer { free(r) }
        return String(cString: r)
    }

    static func statusFile(_ root: String) throws -> [(String, String)] {
        guard let text = try? String(contentsOfFile: root + "/.nimbus/status", encoding: .utf8) else {
            throw CLIFailure(.storage, "cannot read \(root)/.nimbus/status (is the mount alive?)")
        }
        return text.split(separator: "\n").compactMap { line in
            guard let c = line.firstIndex(of: ":") else { return nil }
            return (String(line[..<c]), line[line.index(after: c)...].trimmingCharacters(in: .whitespaces))
        }
    }

    /// `present/size` from `user.nimbus.progress` ("P% HAVE/SIZE…").
    static func progress(_ path: String) -> (have: Int64, size: Int64)? {
        guard let p = get(path, .progress), let field = p.split(separator: " ").dropFirst().first else { return nil }
        let parts = field.split(separator: "/")
        guard parts.count == 2, let h = Int64(parts[0]), let s = Int64(parts[1]) else { return nil }
        return (h, s)
    }

    /// `path` itself when a file; every file below it when a folder (a listing: no download).
    static func files(_ path: String) throws -> [String] {
        var isDir: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDir) else { throw CLIFailure(.usage, "\(path): no such file or folder") }
        guard isDir.boolValue else { return [path] }
        var out: [String] = []
        let e = FileManager.default.enumerator(atPath: path)
        while let rel = e?.nextObject() as? String {
            let full = path + "/" + rel
            if let a = try? FileManager.default.attributesOfItem(atPath: full), a[.type] as? FileAttributeType == .typeRegular { out.append(full) }
        }
        return out
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show sync status: of the mount (no PATH, or the mount root) or of files and folders.")

    @Argument(help: "Files or folders in a mount (default: the mount holding the current folder).")
    var paths: [String] = []

    @Flag(help: "Print JSON.")
    var json = false

    func run() throws {
        let targets = paths.isEmpty ? [FileManager.default.currentDirectoryPath] : paths
        var out: [[String: String]] = []
        for p in targets {
            let root = try MountSurface.root(of: p)
            if URL(fileURLWithPath: p).standardizedFileURL.path == root {
                var d = ["path": root]
                for (k, v) in try MountSurface.statusFile(root) { d[k] = v }
                out.append(d)
                if !json {
                    print("\(root):")
                    for (k, v) in try MountSurface.statusFile(root) {
                        print("  \(k): \(v)")
                        if k == "refused-programs", v != "none" {
                            print("    (refused downloads by reading placeholders; allow one: nimbus policy allow PROGRAM)")
                        }
                    }
                }
                continue
            }
            var d = ["path": p]
            for x in [NimbusXattr.status, .progress, .version, .pinned, .itemid, .error] {
                d[x.rawValue] = MountSurface.get(p, x) ?? ""
            }
            // FIFOs, sockets and device nodes carry no user xattrs (the kernel refuses them):
            // they are local-only items.
            var st = stat()
            if lstat(p, &st) == 0, [S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK].contains(st.st_mode & S_IFMT) {
                d[NimbusXattr.status.rawValue] = ItemStatus.localOnly.rawValue
            }
            // The `.nimbusignore` rule that keeps it on this device, if one does.
            if let rule = MountSurface.get(p, .ignored) { d[NimbusXattr.ignored.rawValue] = rule }
            out.append(d)
            if !json {
                let pin = d["pinned"] == "1" ? " pinned" : ""
                let err = (d["error"] ?? "").isEmpty ? "" : "  (\(d["error"]!))"
                let ignored = d["ignored"].map { "  (ignored by \($0))" } ?? ""
                print("\(d["status"]!.padding(toLength: 11, withPad: " ", startingAt: 0)) \(d["progress"]!.padding(toLength: 26, withPad: " ", startingAt: 0)) v\(d["version"]!)\(pin)  \(p)\(err)\(ignored)")
            }
        }
        if json {
            let data = try JSONSerialization.data(withJSONObject: paths.count == 1 || paths.isEmpty ? out[0] as Any : out, options: [.sortedKeys, .prettyPrinted])
            print(String(decoding: data, as: UTF8.self))
        }
    }
}

struct Download: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Download files (or every file below folders) now, with a progress bar on a terminal.")

    @Argument(help: "Files or folders in a mount.")
    var paths: [String]

    @Option(help: "Give up after this many seconds without progress.")
    var stallTimeout: Double = 30

    func run() throws {
        var files: [String] = []
        var root = ""
        for p in paths {
            root = try MountSurface.root(of: p)
            files += try MountSurface.files(p)
        }
        // With a cache limit, ask in batches of at most half the limit: each batch is complete
        // here before the next starts, so nothing is evicted before it was all downloaded.
        let limit = try MountSurface.statusFile(root).first { $0.0 == "cache-limit" }.flatMap { Int64($0.1) }
        let sizes = Dictionary(files.map { f in (f, (try? FileManager.default.attributesOfItem(atPath: f)[.size] as? Int64) ?? 0) },
                               uniquingKeysWith: { a, _ in a })
        let all = sizes.values.reduce(0, +)
        if let limit, all > limit {
            FileHandle.standardError.write(Data("nimbus: note: \(all) bytes asked for, the cache keeps \(limit): earlier files may be evicted again (pin them to keep them, or mount with a larger --cache-size)\n".utf8))
        }
        let budget = limit.map { max($0 / 2, 1) } ?? Int64.max
        var batch: [String] = []
        var batchBytes: Int64 = 0
        var done: [String] = []
        for f in files {
            if !batch.isEmpty && batchBytes + sizes[f]! > budget {
                try wait(for: batch, before: done.count, of: files.count)
                done += batch
                batch = []
                batchBytes = 0
            }
            try MountSurface.set(f, .download, "1")
            batch.append(f)
            batchBytes += sizes[f]!
        }
        try wait(for: batch, before: done.count, of: files.count)
        print("downloaded \(files.count) file(s), \(all) bytes")
    }

    /// Waits until every file of `files` was complete here once, with a progress bar on a terminal.
    func wait(for files: [String], before: Int, of count: Int) throws {
        let tty = isatty(2) != 0
        var last: Int64 = -1
        var lastChange = Date()
        // A file counts once it was complete here (with a small --cache-size, earlier files of
        // a big download may be evicted again before the last one is in).
        var complete = Set<String>()
        var sizes: [String: Int64] = [:]
        while true {
            var have: Int64 = 0, total: Int64 = 0, errors: [String] = []
            var done = true
            for f in files {
                if complete.contains(f) { have += sizes[f] ?? 0; total += sizes[f] ?? 0; continue }
                let status = MountSurface.get(f, .status) ?? "?"
                if let p = MountSurface.progress(f) { have += p.have; total += p.size; sizes[f] = p.size }
                if ["cloud", "partial", "downloading"].contains(status) { done = false } else { complete.insert(f) }
                if status == "error" || (status == "cloud" && !(MountSurface.get(f, .error) ?? "").isEmpty) {
                    errors.append("\(f): \(MountSurface.get(f, .error) ?? "error")")
                }
            }
            if tty {
                let frac = total == 0 ? 1.0 : Double(have) / Double(total)
                let bar = String(repeating: "#", count: Int(frac * 30)).padding(toLength: 30, withPad: ".", startingAt: 0)
                FileHandle.standardError.write(Data("\r[\(bar)] \(Int(frac * 100))% \(have >> 20)/\(total >> 20) MiB, files \(before + 1)-\(before + files.count) of \(count)  ".utf8))
            }
            if done {
                if tty { FileHandle.standardError.write(Data("\n".utf8)) }
                return
            }
            if have != last { last = have; lastChange = Date() }
            if Date().timeIntervalSince(lastChange) > stallTimeout {
                if tty { FileHandle.standardError.write(Data("\n".utf8)) }
                throw CLIFailure(.network, "no progress for \(Int(stallTimeout)) s (\(have) of \(total) bytes here)"
                    + (errors.isEmpty ? "; see nimbus status" : ": " + errors.prefix(3).joined(separator: "; ")))
            }
            usleep(100_000)
        }
    }
}

/// `nimbus evict|pin|unpin PATH…`: one xattr per path.
struct SetEach {
    static func run(_ paths: [String], _ name: NimbusXattr, _ value: String, _ verb: String) throws {
        var failed = 0
        for p in paths {
            do {
                _ = try MountSurface.root(of: p)
                try MountSurface.set(p, name, value)
                print("\(verb) \(p)")
            } catch {
                FileHandle.standardError.write(Data("nimbus: \(error)\n".utf8))
                failed += 1
            }
        }
        if failed > 0 { throw CLIFailure(.usage, "\(failed) of \(paths.count) path(s) not \(verb)") }
    }
}

struct Evict: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Free the local copy of files (they stay in the cloud and download again when read).")
    @Argument(help: "Files or folders in a mount.") var paths: [String]
    func run() throws { try SetEach.run(paths, .evict, "1", "evicted") }
}

struct Pin: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Keep files (or everything below folders) downloaded on this device.")
    @Argument(help: "Files or folders in a mount.") var paths: [String]
    func run() throws { try SetEach.run(paths, .pinned, "1", "pinned") }
}

struct Unpin: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Let the cache evict files again.")
    @Argument(help: "Files or folders in a mount.") var paths: [String]
    func run() throws { try SetEach.run(paths, .pinned, "0", "unpinned") }
}

struct Pause: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Take a mount offline on purpose: local work goes on and is queued; no network until resume.")
    @Argument(help: "The mountpoint (or a path inside it; default: the current folder).") var path: String?
    func run() throws {
        let root = try MountSurface.root(of: path ?? FileManager.default.currentDirectoryPath)
        try MountSurface.set(root, .paused, "1")
        print("paused \(root)")
    }
}

struct Resume: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Bring a paused mount back online.")
    @Argument(help: "The mountpoint (or a path inside it; default: the current folder).") var path: String?
    func run() throws {
        let root = try MountSurface.root(of: path ?? FileManager.default.currentDirectoryPath)
        try MountSurface.set(root, .paused, "0")
        print("resumed \(root)")
    }
}

/// `nimbus versions PATH`: the versions the server keeps of a file (docs/sync.md "Conflicts and
/// versions"), read from `user.nimbus.versions`.
struct Versions: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the versions of a file: current, unresolved conflict versions, and history.")
    @Argument(help: "A file in a synced mount.") var path: String
    @Flag(help: "One JSON object per version.") var json = false

    func run() throws {
        _ = try MountSurface.root(of: path)
        let size = lgetxattr(path, NimbusXattr.versions.name, nil, 0)
        guard size >= 0 else {
            throw CLIFailure(errno == EIO ? .network : .usage,
                             "\(path): \(errno == EIO ? "the server cannot be reached (or sync is paused); try again when online" : String(cString: strerror(errno)))")
        }
        var buf = [UInt8](repeating: 0, count: size + 4096)
        let n = lgetxattr(path, NimbusXattr.versions.name, &buf, buf.count)
        guard n >= 0 else { throw CLIFailure(.network, "\(path): \(String(cString: strerror(errno)))") }
        let rows = String(decoding: buf[0..<n], as: UTF8.self).split(separator: "\n").map { $0.split(separator: "\t", omittingEmptySubsequences: false).map(String.init) }
        if json {
            for r in rows where r.count == 5 {
                let obj: [String: Any] = ["version": Int(r[0]) ?? 0, "role": r[1], "device": r[2], "time": r[3], "size": Int(r[4]) ?? 0]
                print(String(decoding: try JSONSerialization.data(withJSONObject: obj, options: [.sortedKeys]), as: UTF8.self))
            }
            return
        }
        guard !rows.isEmpty else { print("no versions yet (not uploaded)"); return }
        let header = ["VERSION", "ROLE", "DEVICE", "TIME (UTC)", "SIZE"]
        let table = [header] + rows.filter { $0.count == 5 }.map { [$0[0], $0[1] == "conflict" ? "conflict!" : $0[1], $0[2], $0[3], $0[4]] }
        let widths = (0..<5).map { c in table.map { $0[c].count }.max() ?? 0 }
        for r in table {
            print((0..<5).map { c in c == 4 ? r[c] : r[c].padding(toLength: widths[c], withPad: " ", startingAt: 0) }.joined(separator: "  "))
        }
    }
}

/// `nimbus resolve PATH --keep current|VERSION`.
struct Resolve: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Resolve a file's conflict: keep the current version, or make another version current; the other conflict versions are discarded.")
    @Argument(help: "A file in a synced mount.") var path: String
    @Option(help: "current, or the version number to keep (see nimbus versions).") var keep: String

    func validate() throws {
        if keep != "current" && Int64(keep) == nil { throw ValidationError("--keep: give current or a version number") }
    }

    func run() throws {
        _ = try MountSurface.root(of: path)
        try MountSurface.set(path, .resolve, keep)
        print("resolved \(path): kept \(keep == "current" ? "the current version" : "version \(keep)")")
    }
}

/// `nimbus restore PATH --version V`.
struct Restore: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Make an earlier version of a file current again (its conflict versions stay).")
    @Argument(help: "A file in a synced mount.") var path: String
    @Option(help: "The version to bring back (see nimbus versions).") var version: Int64

    func run() throws {
        _ = try MountSurface.root(of: path)
        try MountSurface.set(path, .restore, "\(version)")
        print("restored \(path) to version \(version)")
    }
}
#endif
