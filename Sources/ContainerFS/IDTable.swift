import FuseKit
import Glibc
import Synchronization

/// Who answers for a node id: the item tree (the root too), a node of `.nimbus/`, or a node of
/// `.nimbus/versions/`.
enum NodeOwner: Hashable, Sendable {
    case item
    case control(ControlFS.File)
    case versions(VersionsFS.VNode)
    case trash(TrashFS.TNode)
}

/// Who answers for a handle id: an open file of the tree (its cache file's descriptor), a listing
/// of the tree, an open file or listing of `.nimbus/`, or a version or listing of `.nimbus/versions/`.
enum HandleOwner: Sendable {
    case file(Int32)
    case listing
    case control
    case versions
    case trash
}

/// The node and handle ids of one mount and what each names. The FUSE adapter resolves an id
/// here once per request and calls its owner.
///
/// Node ids come from one counter, in order: items (whose ids are stored with them, so the counter
/// starts above every stored one) and the nodes of `.nimbus/versions/` alike; an id is never given
/// out twice in a mount. The table records the ids of `.nimbus/` and `.nimbus/versions/`; an id it
/// does not record is the tree's (`ContainerFS`'s nodes answer for it, ENOENT if it has none). The
/// root and the nodes of `.nimbus/` keep fixed ids (`fixedNodes`). Every handle, of a file or a
/// listing, comes from one counter too and is recorded until released.
///
/// Its mutex is a leaf: taken under the filesystem's lock or none, never around another lock.
final class IDTable: Sendable {
    /// The nodes whose ids are the same in every mount (the root, 1, is the tree's).
    static let fixedNodes: [(NodeID, NodeOwner)] = [
        (NodeID(rawValue: 2), .control(.folder)), (NodeID(rawValue: 3), .control(.status)), (NodeID(rawValue: 4), .control(.claims)),
        (NodeID(rawValue: 5), .control(.events)), (NodeID(rawValue: 6), .control(.conflicts)), (NodeID(rawValue: 7), .versions(.mirror(.root))),
        (NodeID(rawValue: 8), .control(.requests)), (NodeID(rawValue: 9), .trash(.folder("/"))),
    ]
    /// The first id the counter gives out (the ids below it are the root's and `fixedNodes`').
    static let firstCountedNode = NodeID(rawValue: 16)

    private struct State {
        var owners: [NodeID: NodeOwner] = [:]
        var nodes: [NodeOwner: NodeID] = [:]
        var nextNode = IDTable.firstCountedNode
        var handles: [HandleID: HandleOwner] = [:]
        var nextHandle = HandleID(rawValue: 1)
    }
    private let state: Mutex<State>

    init() {
        var s = State()
        for (n, o) in Self.fixedNodes {
            s.owners[n] = o
            s.nodes[o] = n
        }
        state = Mutex(s)
    }

    /// What `node` names.
    func owner(of node: NodeID) -> NodeOwner { state.withLock { $0.owners[node] } ?? .item }

    /// The node of `owner` (not `.item`), numbered at its first use; the same one for the rest of
    /// the mount.
    func node(of owner: NodeOwner) -> NodeID {
        state.withLock { s in
            if let n = s.nodes[owner] { return n }
            let n = s.nextNode
            s.nextNode = n.successor
            s.owners[n] = owner
            s.nodes[owner] = n
            return n
        }
    }

    /// A new item's node id.
    func newItemNode() -> NodeID {
        state.withLock { s in
            defer { s.nextNode = s.nextNode.successor }
            return s.nextNode
        }
    }

    /// Marks `node` (an item's, stored) as given out: the counter goes on above it.
    func reserve(_ node: NodeID) {
        state.withLock { s in s.nextNode = max(s.nextNode, node.successor) }
    }

    /// What `handle` names; nil for a handle not open.
    func owner(ofHandle handle: HandleID) -> HandleOwner? { state.withLock { $0.handles[handle] } }

    /// A new handle for `owner`.
    func newHandle(_ owner: HandleOwner) -> HandleID {
        state.withLock { s in
            let h = s.nextHandle
            s.nextHandle = h.successor
            s.handles[h] = owner
            return h
        }
    }

    /// Forgets a released handle; returns what it named.
    @discardableResult
    func release(_ handle: HandleID) -> HandleOwner? { state.withLock { $0.handles.removeValue(forKey: handle) } }
}

/// What `.nimbus/` and `.nimbus/versions/` show the same for every node: the mount's owner, the
/// mount's time and the kernel's cache timeouts.
struct Presentation: Sendable {
    var uid: UInt32
    var gid: UInt32
    var mountTime: Int64
    var attrTimeout: Double
    var entryTimeout: Double

    /// The attributes of a read-only folder of `.nimbus/`.
    func folderAttr(_ node: NodeID) -> stat {
        var st = stat()
        st.node = node
        st.st_uid = uid
        st.st_gid = gid
        let ts = ContainerFS.ts(mountTime)
        st.st_atim = ts; st.st_mtim = ts; st.st_ctim = ts
        st.st_mode = S_IFDIR | 0o555
        st.st_nlink = 2
        st.st_size = 4096
        st.st_blksize = 4096
        return st
    }

    func entry(_ node: NodeID, _ attr: stat) -> FuseEntry {
        FuseEntry(node: node, attr: attr, attrTimeout: attrTimeout, entryTimeout: entryTimeout)
    }
}

extension DirSnapshot {
    /// The entries from entry `offset` on that fit in `room` bytes of the kernel's buffer
    /// (`DirectoryBuffer.entrySize`); `entry` gives each child's entry (nil: skip it). "." and ".."
    /// carry `NodeID.absent`: the kernel takes no reference. `counted` is called for every other
    /// entry returned.
    func page(from offset: Int64, room: Int, plus: Bool, entry: (_ node: NodeID, _ isDot: Bool) -> FuseEntry?,
              counted: (NodeID) -> Void = { _ in }) -> [DirEntry] {
        var out: [DirEntry] = []
        var left = room
        var i = Int(clamping: offset)
        while i < entries.count {
            let (name, child) = entries[i]
            let isDot = i < 2
            guard var e = entry(child, isDot) else { i += 1; continue }
            if isDot { e.node = .absent }
            let size = DirectoryBuffer.entrySize(nameBytes: name.utf8.count, plus: plus)
            guard size <= left else { break }
            left -= size
            out.append(DirEntry(name: name, entry: e, nextOffset: Int64(i + 1)))
            if plus, !isDot { counted(child) }
            i += 1
        }
        return out
    }
}
