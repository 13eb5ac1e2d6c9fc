import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import Synchronization

// `.nimbusignore` files (docs/ignore.md): gitignore rules for the folder that holds one and
// below it. The tree reads them from their cache files and keeps each parsed, keyed by what
// changes with its content; the sync engine asks for a verdict when it decides a push.

/// What identifies one content of a rules file here: a write, a truncate, a remote version or
/// an identity transfer changes one of these.
struct IgnoreKey: Equatable {
    var node: NodeID
    var writeGen: UInt64
    var size: Int64
    var mtime: Int64
    var ctime: Int64
}

/// A parsed rules file, as of `key`.
struct ParsedIgnore {
    var key: IgnoreKey
    var file: IgnoreFile
}

extension ContainerFS {
    public static var ignoreFileName: String { IgnoreMatch.fileName }
    /// A rules file is read up to this many bytes; what follows is left out (said in its problems).
    static let ignoreFileMaxBytes: Int64 = 256 * 1024

    /// What the `.nimbusignore` files say of the item (`.none` when it is not in the tree);
    /// nil when they cannot be known yet: a rules file on the way is a placeholder.
    public func ignoreVerdict(_ item: ItemID) -> IgnoreVerdict? {
        let place = lock.withLock { () -> (path: [String], isFolder: Bool)? in
            guard let node = t.byID[item], let n = t.nodes[node], n.linked, n.node != .root else { return nil }
            return (components(n, item), n.isDir)
        }
        guard let place else { return IgnoreVerdict.none }
        return ignoreVerdict(path: place.path, isFolder: place.isFolder)
    }

    /// What the `.nimbusignore` files here say of an item at `path` (names from the root), a
    /// folder or not, whether or not one is there now; nil when a rules file on the way is a
    /// placeholder. A `.nimbusignore` inside an ignored folder is ignored with it (git never
    /// reads it, and it could not be pushed without its folder).
    public func ignoreVerdict(path: [String], isFolder: Bool) -> IgnoreVerdict? {
        guard let last = path.last else { return IgnoreVerdict.none }
        if ItemName.same(last, Self.ignoreFileName) {
            // Its own rules never apply to it (nor does its writer make them unknown).
            guard path.count > 1 else { return IgnoreVerdict.none }
            guard let above = ignoreVerdict(path: Array(path.dropLast()), isFolder: true) else { return nil }
            if case .ignored = above { return above }
            return IgnoreVerdict.none
        }
        // Rules files whose parse is stale are read outside the lock, then looked up again.
        for _ in 0..<4 {
            switch lock.withLock({ rulesOnTheWay(to: path) }) {
            case .ready(let files):
                return IgnoreMatch.verdict(path: path, isFolder: isFolder, files: files)
            case .unknown:
                return nil
            case .stale(let reads):
                let parsed = reads.map { r in ParsedIgnore(key: r.key, file: readRules(r.id, size: r.key.size)) }
                lock.withLock { for p in parsed { t.ignoreFiles[p.key.node] = p } }
            }
        }
        return nil
    }

    /// Whether the rules parsed so far ignore `n` (lock held; a rules file not parsed yet, or
    /// not here, counts as none).
    func ignoredLocked(_ n: Node) -> Bool {
        guard n.node != .root else { return false }
        let path = components(n)
        if ItemName.same(n.rec.name, Self.ignoreFileName) { return false }
        guard case .ready(let files) = rulesOnTheWay(to: path),
              case .ignored = IgnoreMatch.verdict(path: path, isFolder: n.isDir, files: files) else { return false }
        return true
    }

    private enum RulesLook {
        case ready([[String]: IgnoreFile])
        case unknown
        case stale([(id: ItemID, key: IgnoreKey)])
    }

    /// The rules files of the folders on the way to `path` (lock held): parsed, or which to read.
    private func rulesOnTheWay(to path: [String]) -> RulesLook {
        var files: [[String]: IgnoreFile] = [:]
        var stale: [(id: ItemID, key: IgnoreKey)] = []
        guard var folder = t.nodes[.root] else { return .ready([:]) }
        for depth in 0..<path.count {
            if let fileNode = folder.children[Self.ignoreFileName], let f = t.nodes[fileNode], f.rec.kind == .file, !f.rec.isSpecial {
                let key = IgnoreKey(node: f.node, writeGen: f.writeGen, size: f.rec.size, mtime: f.rec.mtime, ctime: f.rec.ctime)
                if let parsed = t.ignoreFiles[f.node], parsed.key == key {
                    files[Array(path[..<depth])] = parsed.file
                } else if f.writers > 0 || (lazyContent && !content.isPresent(f.rec.id, range: 0..<min(f.rec.size, Self.ignoreFileMaxBytes))) {
                    // Being written (its rules are those of its next close), or still a placeholder.
                    return .unknown
                } else {
                    stale.append((f.rec.id, key))
                }
            }
            guard depth < path.count - 1 else { break }
            guard let next = folder.children[path[depth]], let n = t.nodes[next], n.isDir else { break }
            folder = n
        }
        return stale.isEmpty ? .ready(files) : .stale(stale)
    }

    /// The rules in the cache file of `id` (an unreadable file has none).
    private func readRules(_ id: ItemID, size: Int64) -> IgnoreFile {
        let fd = store.cache.open(id, create: false)
        guard fd >= 0 else { return IgnoreFile(text: "") }
        defer { close(fd) }
        let want = Int(min(max(size, 0), Self.ignoreFileMaxBytes))
        var bytes = [UInt8](repeating: 0, count: want)
        var got = 0
        while got < want {
            let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + got, want - got, off_t(got)) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { break }
            got += n
        }
        var text = String(decoding: bytes[..<got], as: UTF8.self)
        // A line cut by the limit is left out with the rest.
        if size > Self.ignoreFileMaxBytes, let cut = text.lastIndex(of: "\n") { text = String(text[...cut]) }
        return IgnoreFile(text: text)
    }

    /// The names from the root to `n` (lock held).
    func components(_ n: Node, _ id: ItemID? = nil) -> [String] {
        guard n.node != .root else { return [] }
        let first = n.place(id ?? n.rec.id)
        var parts: [String] = [first.name]
        guard var x = t.nodes[first.parentNode] else { return parts }
        while x.node != .root {
            parts.append(x.rec.name)
            guard let p = t.nodes[x.parentNode] else { break }
            x = p
        }
        return parts.reversed()
    }

    /// The lines of the rules file `item` that are left out, and why (`user.nimbus.error` of a
    /// `.nimbusignore`); empty when every line is used, nil when `item` is no rules file here.
    func rulesProblems(_ item: ItemID) -> [String]? {
        let look = lock.withLock { () -> (key: IgnoreKey, parsed: IgnoreFile?)? in
            guard let node = t.byID[item], let f = t.nodes[node], f.linked, f.rec.kind == .file, !f.rec.isSpecial,
                  ItemName.same(f.rec.name, Self.ignoreFileName) else { return nil }
            let key = IgnoreKey(node: f.node, writeGen: f.writeGen, size: f.rec.size, mtime: f.rec.mtime, ctime: f.rec.ctime)
            if let p = t.ignoreFiles[f.node], p.key == key { return (key, p.file) }
            if lazyContent && !content.isPresent(item, range: 0..<min(f.rec.size, Self.ignoreFileMaxBytes)) { return (key, IgnoreFile(text: "")) }
            return (key, nil)
        }
        guard let look else { return nil }
        if let parsed = look.parsed { return parsed.problems + (look.key.size > Self.ignoreFileMaxBytes ? [Self.cutNote] : []) }
        let file = readRules(item, size: look.key.size)
        lock.withLock { t.ignoreFiles[look.key.node] = ParsedIgnore(key: look.key, file: file) }
        return file.problems + (look.key.size > Self.ignoreFileMaxBytes ? [Self.cutNote] : [])
    }

    static var cutNote: String { "the file is over \(ignoreFileMaxBytes / 1024) KiB: what follows is left out" }

    /// `MountedTree.rulesGeneration`.
    public var rulesGeneration: UInt64 { rulesGen.load(ordering: .acquiring) }

    /// The rules above some items may have changed (any thread, any lock).
    func rulesChanged() { rulesGen.add(1, ordering: .releasing) }

    /// `user.nimbus.ignored`: the rule that ignores the item, `PATTERN (/FOLDER/.nimbusignore
    /// line N)`; nil when none does.
    func ignoredText(_ item: ItemID) -> String? {
        guard case .ignored(let rule, let folder)? = ignoreVerdict(item) else { return nil }
        let file = "/" + (folder + [Self.ignoreFileName]).joined(separator: "/")
        return "\(rule.text) (\(file) line \(rule.line))"
    }
}
