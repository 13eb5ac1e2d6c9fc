import ContainerFS
import Foundation
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusCore
import NimbusRemote
import NimbusTesting
import SyncEngine

/// No kernel here: nothing to invalidate.
struct NoKernel: KernelCache {
    func invalidateNode(_ node: NodeID) {}
    func invalidateEntry(parent: NodeID, name: String) {}
    func notifyDelete(parent: NodeID, child: NodeID, name: String) {}
}

/// How a simulated device reaches the server.
enum SimNetwork {
    /// Over TCP, through a relay that can cut and hold (real threads, real time).
    case relay(Relay)
    /// In process, on the deterministic simulation's one thread and clock.
    case link(SimLink, SimWorld)
}

/// One simulated device: a state directory with LocalStore + ContainerFS + SyncEngine, wired as
/// `MountDaemon` wires them, with no mount — the steps call ContainerFS as the kernel would.
final class SimDevice: @unchecked Sendable {
    // @unchecked: `store`, `fs` and `engine` change only in `restart`, and the simulation calls a
    // device from one task, one step at a time; the engine's own tasks hold their own references.
    let index: Int
    let dir: URL
    let network: SimNetwork
    let token: String
    let container: String
    /// The read deadline (`SyncEngine.Options.hydrationSeconds`).
    let hydrationSeconds: Int64
    let contentApartBytes: Int64?
    private(set) var store: LocalStore
    private(set) var fs: ContainerFS
    private(set) var engine: SyncEngine
    private(set) var running = false
    /// Stores of earlier runs of this device (restarts), closed by `dispose()`.
    private var retired: [LocalStore] = []
    /// Files a program keeps open for writing (`SimAction.writeOpen`): what it wrote.
    var openWriters: [(node: NodeID, handle: HandleID, content: String)] = []
    /// Open files another step of this device wrote since (their bytes are not the writer's).
    var rewritten: Set<HandleID> = []
    /// The filesystem's notices to the engine on their way (on a simulated link only).
    private(set) var notices: NoticeLine?

    var name: String { String(UnicodeScalar(UInt8(97 + index))) }

    /// The relay of a device on the real network.
    var relay: Relay {
        guard case .relay(let r) = network else { preconditionFailure("device \(name) is on a simulated link") }
        return r
    }

    /// A device on the real network: a relay to `serverPort`.
    convenience init(index: Int, dir: URL, serverPort: Int, token: String, container: String, hydrationSeconds: Int64 = 5) throws {
        let relay = try Relay(targetPort: serverPort)
        do {
            try self.init(index: index, dir: dir, network: .relay(relay), token: token, container: container, hydrationSeconds: hydrationSeconds)
        } catch {
            relay.close()
            throw error
        }
    }

    init(index: Int, dir: URL, network: SimNetwork, token: String, container: String, hydrationSeconds: Int64 = 5,
         contentApartBytes: Int64? = nil) throws {
        self.hydrationSeconds = hydrationSeconds
        self.contentApartBytes = contentApartBytes
        self.index = index
        self.dir = dir
        self.network = network
        self.token = token
        self.container = container
        (store, fs, engine, notices) = try Self.open(dir: dir, network: network, token: token, container: container, hydrationSeconds: hydrationSeconds,
                                                     contentApartBytes: contentApartBytes)
    }

    private static func open(dir: URL, network: SimNetwork, token: String, container: String,
                             hydrationSeconds: Int64, contentApartBytes: Int64? = nil) throws -> (LocalStore, ContainerFS, SyncEngine, NoticeLine?) {
        var o = SyncEngine.Options()
        o.hydrationSeconds = hydrationSeconds
        o.longPoll = 10
        o.logLabel = dir.lastPathComponent
        var fo = ContainerFS.Options()
        let store: LocalStore
        var notices: NoticeLine?
        switch network {
        case .relay:
            store = try LocalStore(directory: dir)
            // Back-offs, the tick loop and the offline window run ten times faster (EngineClock).
            o.clock = .scaled(10)
        case .link(_, let world):
            store = try LocalStore(directory: dir, writer: .caller)
            o.clock = .driven(by: world.clock)
            if let contentApartBytes { o.contentApartBytes = contentApartBytes }
            o.cacheLimit = world.cacheLimits[dir.lastPathComponent] ?? nil
            o.logSink = { [name = dir.lastPathComponent] line in world.log(name, line) }
            o.executor = world.executor
            fo.clock = world.mountClock
            if let maxDelay = world.noticeDelays[dir.lastPathComponent] ?? nil {
                let line = NoticeLine(world: world, maxDelay: maxDelay, seed: world.seed ^ UInt64(dir.lastPathComponent.utf8.first ?? 0))
                fo.deliverNotice = { line.send($0) }
                notices = line
            }
        }
        do {
            let engine: SyncEngine
            switch network {
            case .relay(let relay):
                engine = try SyncEngine(store: store, client: NimbusClient(baseURL: relay.url, token: token), container: container, options: o)
            case .link(let link, _):
                engine = try SyncEngine(store: store, remote: link, fetch: link, container: container, options: o)
            }
            let fs = try ContainerFS(store: store, options: fo, content: engine, observer: engine, syncStatus: engine, control: engine, versions: engine)
            try engine.attach(fs, services: fs.services)
            fs.setKernel(NoKernel())
            return (store, fs, engine, notices)
        } catch {
            store.close()
            throw error
        }
    }

    /// Lets time pass for the device's program (simulated time on a simulated link).
    func idle(milliseconds ms: Int) async {
        guard ms > 0 else { return }
        switch network {
        case .relay: try? await Task.sleep(for: .milliseconds(ms))
        case .link(_, let world): await world.clock.sleep(for: .milliseconds(ms))
        }
    }

    /// Cuts the device's network (requests fail, answers are lost) / brings it back.
    func cut() {
        switch network {
        case .relay(let r): r.cut()
        case .link(let l, _): l.cut = true
        }
    }

    func restore() {
        switch network {
        case .relay(let r): r.restore()
        case .link(let l, _): l.cut = false
        }
    }

    /// The pull loop lists the container first when this state has never synced.
    func start() {
        engine.start()
        running = true
    }

    /// A clean stop (unmount): the engine's loops end, the store commits what is queued.
    /// `crash`: the store's write-behind queue is dropped first, as `kill -9` would (what it had
    /// committed stays; cache files keep every byte written — they are the kernel's page cache).
    /// Returns whether what the store had not saved was lost (a crash, or a clean stop whose last
    /// save failed, e.g. on a full disk: docs/errors.md, what is on disk is as after a crash).
    @discardableResult
    func stop(crash: Bool = false) async -> Bool {
        guard running else { return false }
        running = false
        // The program's open files end with it: closed on a clean stop (the kernel releases
        // them at unmount), gone with a crash. Neither was fsynced: nothing of them is promised.
        if !crash { for w in openWriters { fs.release(node: w.node, handle: w.handle) } }
        openWriters = []
        rewritten = []
        // Every call a program saw return had told the engine before it returned (the window
        // is between the filesystem lock's release and that return): a crash, like an unmount,
        // comes after those notices.
        await notices?.drain()
        if crash { store.abandon() }
        await engine.stop()
        if !crash {
            fs.saveEventSequence()
            return store.close() != nil
        }
        return true
    }

    /// After the last stop of a simulated device: closes every database it opened.
    func dispose() {
        for s in retired + [store] { s.closeDatabase() }
        retired = []
    }

    /// Stop, then open the same state directory again and start.
    /// Returns whether the stop lost what the store had not saved (`stop`).
    @discardableResult
    func restart(crash: Bool) async throws -> Bool {
        let lost = await stop(crash: crash)
        retired.append(store)
        (store, fs, engine, notices) = try Self.open(dir: dir, network: network, token: token, container: container,
                                                     hydrationSeconds: hydrationSeconds, contentApartBytes: contentApartBytes)
        start()
        return lost
    }

    // MARK: looking

    struct Entry {
        var path: String
        var rec: ItemRecord
    }

    /// Every item here with its path, in path order (one look at the tree). Local-only items
    /// (FIFOs) only with `localOnly`: they are no part of what devices share.
    func entries(localOnly: Bool = false) -> [Entry] {
        let recs = fs.descendants(of: .root).compactMap(fs.localState).filter { localOnly || !$0.isSpecial }
        let byID = Dictionary(recs.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        func path(_ r: ItemRecord) -> String {
            var parts = [r.name]
            var p = r.parent
            while let id = p, id != .root, let up = byID[id] {
                parts.append(up.name)
                p = up.parent
            }
            return parts.reversed().joined(separator: "/")
        }
        return recs.map { Entry(path: path($0), rec: $0) }.sorted { $0.path < $1.path }
    }

    func files() -> [Entry] { entries().filter { $0.rec.kind == .file } }

    func folderNode(_ folder: String) -> NodeID? {
        if folder.isEmpty { return NodeID.root }
        return entries().first { $0.path == folder && $0.rec.kind == .folder }?.rec.node
    }

    func node(of id: ItemID) -> NodeID? { id.isRoot ? NodeID.root : fs.localState(id)?.node }

    /// `id` and every other name of its file here (hard links), in path order.
    func names(of id: ItemID) -> [ItemID] {
        guard let node = node(of: id) else { return [id] }
        let all = entries(localOnly: true).filter { $0.rec.node == node }.map(\.rec.id)
        return all.contains(id) ? all : [id] + all
    }

    /// The content of a file here, downloaded first when it is a placeholder (as a read would).
    func read(_ rec: ItemRecord) async throws -> String {
        let h = try fs.open(node: rec.node, flags: O_RDONLY)
        defer { fs.release(node: rec.node, handle: h.handle) }
        let size = Int64(try fs.getattr(node: rec.node).st_size)
        switch fs.readPlan(node: rec.node, handle: h.handle, range: 0..<max(size, 1)) {
        case .direct: break
        case .fail(let e): throw e
        case .hydrate(let id):
            let engine = self.engine
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<Void, any Error>) in
                engine.hydrate(id, range: 0..<max(size, 1)) { e in
                    if let e { c.resume(throwing: e) } else { c.resume() }
                }
            }
        }
        guard let fd = fs.descriptor(h.handle) else { throw Errno.EBADF }
        var bytes = [UInt8](repeating: 0, count: Int(size))
        let n = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress, $0.count, 0) }
        guard n == size else { throw Errno.EIO }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// path → `/` for a folder, the content for a file. Nil when the tree changed while it was
    /// read (a remote change landed): not settled yet.
    func tree() async -> [String: String]? {
        try? await readTree().get()
    }

    /// `tree()`, or why a file could not be read.
    func readTree() async -> Result<[String: String], SimFailure> {
        var out: [String: String] = [:]
        for e in entries() {
            switch e.rec.kind {
            case .folder: out[e.path] = "/"
            case .file:
                do { out[e.path] = try await read(e.rec) } catch { return .failure(SimFailure("\(e.path): \(error)")) }
                // Its user attributes are part of what devices agree on.
                let xattrs = fs.snapshot(e.rec.id).xattrs
                if !xattrs.isEmpty {
                    out[e.path]! += " [" + xattrs.sorted { $0.key < $1.key }.map { "\($0.key)=\(String(decoding: $0.value, as: UTF8.self))" }.joined(separator: ",") + "]"
                }
            default: out[e.path] = "?\(e.rec.kind)"
            }
        }
        return .success(out)
    }

    /// The item as this device has it: record, cache file, status (NIMBUS_SIM_WATCH).
    func describe(_ id: ItemID) -> String {
        guard let r = fs.localState(id) else { return "not here" }
        var st = stat()
        let file = stat(store.cache.path(for: id), &st) == 0 ? "\(st.st_size) bytes" : "none"
        let version = engine.itemAttribute(.version, item: id, ancestors: []) ?? "-"
        let bytes = (try? String(contentsOfFile: store.cache.path(for: id), encoding: .utf8))?.replacingOccurrences(of: "\0", with: "\\0") ?? "-"
        let xattrs = fs.snapshot(id).xattrs.keys.sorted()
        return "\(r.name) size \(r.size) dirty \(r.dirty) cache file \(file) status \(engine.itemStatus(id)) version \(version) bytes \(String(reflecting: bytes))"
            + (xattrs.isEmpty ? "" : " xattrs \(xattrs.joined(separator: ","))")
    }

    func status(_ key: String) -> String? { engine.statusLines().first { $0.0 == key }?.1 }

    // MARK: doing (as a program would through the mount)

    /// Opens `node` (or creates `name` in `parent` when nil) truncated, writes `content`,
    /// fsyncs and closes; returns the item written, asked through the open handle.
    func writeFile(node: NodeID?, parent: NodeID, name: String, content: String) throws -> ItemID {
        let n: NodeID, h: HandleID
        if let node {
            for w in openWriters where w.node == node { rewritten.insert(w.handle) }
            (n, h) = (node, try fs.open(node: node, flags: O_WRONLY | O_TRUNC).handle)
        } else {
            let (e, o) = try fs.create(parent: parent, name: name, mode: 0o644, flags: O_WRONLY | O_CREAT, caller: .process)
            fs.forget(node: e.node, count: 1)
            (n, h) = (e.node, o.handle)
        }
        do {
            let bytes = Array(content.utf8)
            let written = try bytes.withUnsafeBytes { b in try fs.write(node: n, handle: h, offset: 0, data: b) }
            guard written == bytes.count else { throw Errno.EIO }
            // Programs that care fsync; it also makes the write durable before a simulated crash,
            // so no loss of a written content is excused by the crash.
            do { try fs.fsync(node: n, handle: h, dataOnly: false) } catch let e as Errno {
                // The bytes are in the file, but the program was told they may not be kept:
                // this device's earlier write to the item is overwritten, and this one is not
                // promised.
                let raw = try fs.getxattr(node: n, name: "user.nimbus.itemid")
                throw WriteNotDurable(errno: e, item: ItemID(String(decoding: raw, as: UTF8.self)))
            }
            let raw = try fs.getxattr(node: n, name: "user.nimbus.itemid")
            guard let id = ItemID(String(decoding: raw, as: UTF8.self)) else { throw Errno.EIO }
            // Opened after a delete from another device was shown here (the file was picked
            // before): like a local `rm` racing the write, the bytes went to the deleted file.
            let unlinked = fs.localState(id) == nil
            fs.release(node: n, handle: h)
            if unlinked { throw WrittenAfterDelete() }
            return id
        } catch {
            fs.release(node: n, handle: h)
            throw error
        }
    }

    func lookup(_ parent: NodeID, _ name: String) -> NodeID? {
        guard let e = try? fs.lookup(parent: parent, name: name) else { return nil }
        fs.forget(node: e.node, count: 1)
        return e.node
    }
}

/// A write that went to a file deleted (by another device) before it was opened.
struct WrittenAfterDelete: Error, CustomStringConvertible {
    var description: String { "written to a file deleted elsewhere just before it was opened" }
}

/// A write whose fsync failed (a full disk): the program was told, so nothing of the item
/// written by this device must survive.
struct WriteNotDurable: Error, CustomStringConvertible {
    let errno: Errno
    let item: ItemID?
    var description: String { "written, but fsync failed: \(errno)" }
}

/// The notices of one run of a simulated device's filesystem to its engine, delivered as later
/// jobs of the simulation (`ContainerFS.Options.deliverNotice`): at the next turn, or after up
/// to `maxDelay` ms of simulated time, as the seed draws. A change and its notice are apart as
/// they are when a FUSE thread has released the filesystem lock and not yet told the engine.
final class NoticeLine: @unchecked Sendable {
    // @unchecked: used on the simulation's one thread only.
    private let world: SimWorld
    private let maxDelay: Int
    private var rng: SplitMix64
    private var pending = 0

    init(world: SimWorld, maxDelay: Int, seed: UInt64) {
        self.world = world
        self.maxDelay = maxDelay
        rng = SplitMix64(seed: seed ^ 0x0071_CE5)
    }

    private struct Notice: @unchecked Sendable { let deliver: @Sendable () -> Void }

    func send(_ deliver: @escaping @Sendable () -> Void) {
        let delay = rng.below(2) == 0 ? 0 : 1 + rng.below(maxDelay)
        let notice = Notice(deliver: deliver)
        pending += 1
        let clock = world.clock
        Task(executorPreference: world.executor) {
            if delay > 0 { await clock.sleep(for: .milliseconds(delay)) }
            self.pending -= 1
            notice.deliver()
        }
    }

    /// Waits until every notice sent is delivered.
    func drain() async {
        while pending > 0 { await world.clock.sleep(for: .milliseconds(1)) }
    }

}
