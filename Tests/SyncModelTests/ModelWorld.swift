import Foundation
import NimbusCore
import NimbusProtocol
@testable import NimbusServer
import NimbusTesting
import SyncCore

/// The only source of choice in a run: NimbusTesting's SplitMix64, with the draws the model needs.
struct ModelRandom {
    var g: SplitMix64
    init(seed: UInt64) { g = SplitMix64(seed: seed &+ 0x9E37_79B9_7F4A_7C15) }
    mutating func below(_ n: Int) -> Int { g.below(max(n, 1)) }
    mutating func chance(_ percent: Int) -> Bool { below(100) < percent }
    mutating func pick<T>(_ xs: [T]) -> T? { xs.isEmpty ? nil : xs[below(xs.count)] }
}

/// The deterministic simulation of the sync protocol at the planner level (docs/sync.md
/// "Simulation"): `devices` model devices (SyncCore decisions over an in-memory tree) and one
/// `ModelServer` (the real `CommitEngine` over in-memory tables), joined by a network of
/// messages that the seed delays, reorders, loses and duplicates, with devices going offline,
/// crashing (losing what was only in memory) and starting again, on a stepped clock. After
/// `steps` steps the network heals and the run settles; then every device must show the
/// server's tree, and the last content each device wrote to each item (unless it deleted the
/// item itself) must be on the server as a current, conflict or earlier version.
///
/// Nothing reads a real clock, a thread or a hash seed: the same seed gives the same run, event
/// for event (`events`).
struct ModelWorld {
    struct Message {
        var request: Int
        var device: Int
        var toServer: ModelRequest?
        var toDevice: ModelAnswer?
    }

    let seed: UInt64
    var rng: ModelRandom
    let server = ModelServer()
    var devices: [ModelDevice] = []
    var records: [DeviceRecord] = []
    var now = SimInstant(ns: 1_800_000_000 * 1_000_000_000)
    var network: [Message] = []
    var nextRequest = 0
    var nextToken: UInt64 = 0
    /// The last content each device wrote to each item, while it has not deleted the item.
    var must: [Int: [ItemID: UInt64]] = [:]
    var events: [String] = []
    var figures = (ops: 0, commits: 0, lost: 0, duplicated: 0, crashes: 0, settleSteps: 0)

    static let names = ["a", "b", "c", "d.txt"]

    init(seed: UInt64, devices n: Int = 3) {
        self.seed = seed
        rng = ModelRandom(seed: seed)
        for i in 0..<n {
            let id = DeviceID(UUID(uuid: Self.uuidBytes(0xD0 + UInt64(i), 0)))
            devices.append(ModelDevice(index: i, id: id))
            records.append(DeviceRecord(id: id, name: devices[i].record.name, accountID: 1, accountName: "model"))
        }
    }

    static func uuidBytes(_ hi: UInt64, _ lo: UInt64) -> uuid_t {
        var b = [UInt8](repeating: 0, count: 16)
        for i in 0..<8 {
            b[i] = UInt8(truncatingIfNeeded: hi >> (56 - 8 * UInt64(i)))
            b[8 + i] = UInt8(truncatingIfNeeded: lo >> (56 - 8 * UInt64(i)))
        }
        return (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15])
    }

    mutating func newID() -> ItemID { ItemID(UUID(uuid: Self.uuidBytes(rng.g.next(), rng.g.next()))) }

    mutating func note(_ s: String) {
        drainDeviceLogs()
        events.append(s)
    }

    /// What the devices noted about their decisions joins the events, in order.
    mutating func drainDeviceLogs() {
        for d in devices.indices where !devices[d].log.isEmpty {
            events += devices[d].log.map { "  \(d): \($0)" }
            devices[d].log.removeAll()
        }
    }

    // MARK: the run

    /// Runs the plan, settles, checks; nil when everything holds, else what failed.
    mutating func run(steps: Int) -> String? {
        for _ in 0..<steps {
            step()
            drainDeviceLogs()
        }
        defer { drainDeviceLogs() }
        return settleAndCheck()
    }

    mutating func step() {
        let r = rng.below(100)
        let d = rng.below(devices.count)
        switch r {
        case 0..<25: localOperation(d)
        case 25..<50: pump(d)
        case 50..<80: deliver(faults: true)
        case 80..<92: advance(.milliseconds(200 + rng.below(2800)))
        case 92..<98:
            devices[d].online.toggle()
            note("\(d): \(devices[d].online ? "online" : "offline")")
        default:
            figures.crashes += 1
            devices[d].crash()
            note("\(d): crash (memory lost)")
        }
    }

    mutating func send(_ d: Int, _ request: ModelRequest) -> Int {
        nextRequest += 1
        network.append(Message(request: nextRequest, device: d, toServer: request))
        note("\(d) -> server #\(nextRequest): \(Self.describe(request))")
        return nextRequest
    }

    mutating func pump(_ d: Int) {
        var dev = devices[d]
        var sends: [ModelRequest] = []
        var ids: [Int] = []
        let base = nextRequest
        // Requests get their numbers in the order they are made.
        let sendFn: (ModelRequest) -> Int = { req in sends.append(req); return base + sends.count }
        if rng.chance(60) {
            dev.startPush(now: now, send: sendFn)
        } else {
            dev.startPull(now: now, send: sendFn)
        }
        devices[d] = dev
        for req in sends { ids.append(send(d, req)) }
    }

    mutating func advance(_ by: Duration) {
        now = now.advanced(by: by)
        for d in devices.indices {
            if let f = devices[d].inFlight, f.deadline <= now {
                devices[d].inFlight = nil
                devices[d].pushFailed(f, now: now, why: "no answer")
                note("\(d): push of \(f.id) timed out")
            }
            if let p = devices[d].pull, p.deadline <= now {
                devices[d].pull = nil
                note("\(d): pull timed out")
            }
        }
    }

    /// One message arrives: one of the first three (reordering); with faults, it may be lost
    /// or, for an answer, arrive twice.
    mutating func deliver(faults: Bool) {
        guard !network.isEmpty else { return }
        let i = faults ? rng.below(min(3, network.count)) : 0
        let m = network.remove(at: i)
        if faults, rng.chance(8) {
            figures.lost += 1
            note("lost #\(m.request)\(m.toServer != nil ? " on its way to the server" : " on its way back")")
            return
        }
        if let req = m.toServer {
            let answer = serve(req, from: m.device)
            network.append(Message(request: m.request, device: m.device, toDevice: answer))
            return
        }
        guard let answer = m.toDevice else { return }
        if faults, rng.chance(4) {
            figures.duplicated += 1
            network.append(m)
        }
        receive(answer, request: m.request, device: m.device)
    }

    mutating func serve(_ req: ModelRequest, from d: Int) -> ModelAnswer {
        let at = now.ns
        switch req {
        case .commit(let c):
            figures.commits += 1
            let r = server.commit(c, by: records[d], now: at)
            note("server #: commit \(c.item) on v\(c.baseVersion ?? -1) -> \(Self.describe(r))")
            return .commit(r)
        case .deleteUnanswered(let id, let seen):
            guard let current = server.item(id), !current.deleted, let first = server.firstVersion(id) else { return .nothing }
            var draft = ItemDraft(current)
            draft.deleted = true
            let r = server.commit(CommitRequest(item: id, baseVersion: first, state: draft, seenCursor: seen), by: records[d], now: at)
            note("server: delete of unanswered \(id) on v\(first) -> \(Self.describe(r))")
            return .commit(r)
        case .changes(let since, let folders):
            return .changes(server.changes(since: since, limit: 50), folders: folders.compactMap { server.item($0) })
        case .list(let missing):
            return .list(server.live(), cursor: server.t.cursor, missing: missing.compactMap { server.item($0) })
        case .item(let id):
            return .item(server.item(id))
        }
    }

    mutating func receive(_ answer: ModelAnswer, request: Int, device d: Int) {
        guard devices[d].online else { note("\(d): #\(request) arrived offline; dropped"); return }
        var dev = devices[d]
        var sends: [ModelRequest] = []
        let base = nextRequest
        let sendFn: (ModelRequest) -> Int = { req in sends.append(req); return base + sends.count }
        switch answer {
        case .commit(let r):
            guard let f = dev.inFlight, f.request == request else { return note("\(d): stale answer #\(request)") }
            dev.commitAnswered(f, r, now: now, send: sendFn)
        case .nothing:
            guard let f = dev.inFlight, f.request == request else { return note("\(d): stale answer #\(request)") }
            dev.commitAnswered(f, nil, now: now, send: sendFn)
        case .changes(let r, let folders):
            guard let p = dev.pull, p.request == request, !p.relist else { return note("\(d): stale answer #\(request)") }
            dev.changesAnswered(r, folders: folders)
        case .list(let all, let cursor, let missing):
            guard let p = dev.pull, p.request == request, p.relist else { return note("\(d): stale answer #\(request)") }
            dev.listed(all, cursor: cursor, missing: missing)
        case .item(let item):
            if let item {
                dev.apply([item], force: [item.id])
                dev.retrySkipped(current: [:])
            }
        }
        note("\(d) <- #\(request)")
        devices[d] = dev
        for req in sends { _ = send(d, req) }
    }

    // MARK: local operations

    mutating func localOperation(_ d: Int) {
        figures.ops += 1
        var dev = devices[d]
        let t = now.ns
        let folders = [ItemID.root] + dev.disk.tree.filter { $0.value.kind == .folder }.map(\.key).sorted()
        let files = dev.disk.tree.filter { $0.value.kind == .file }.map(\.key).sorted()
        let all = dev.disk.tree.keys.sorted()
        let choice = rng.below(100)
        let parent = rng.pick(folders) ?? .root
        let name = rng.pick(Self.names) ?? "a"
        switch choice {
        case 0..<25:
            guard !dev.nameTaken(name, in: parent) else { return }
            let id = newID()
            nextToken += 1
            let token = UInt64(d + 1) << 32 | nextToken
            dev.create(id, kind: .file, name: name, in: parent, content: token, now: t)
            must[d, default: [:]][id] = token
            note("\(d): create file \(id) \(name) in \(parent) = \(token)")
        case 25..<55:
            guard let id = rng.pick(files) else { return }
            nextToken += 1
            let token = UInt64(d + 1) << 32 | nextToken
            dev.write(id, content: token, now: t)
            must[d, default: [:]][id] = token
            note("\(d): write \(id) = \(token)")
        case 55..<70:
            guard !dev.nameTaken(name, in: parent) else { return }
            let id = newID()
            dev.create(id, kind: .folder, name: name, in: parent, content: 0, now: t)
            note("\(d): mkdir \(id) \(name) in \(parent)")
        case 70..<85:
            guard let id = rng.pick(all), !dev.nameTaken(name, in: parent, excluding: id) else { return }
            if dev.disk.tree[id]?.kind == .folder, dev.isInside(parent, id) { return }
            dev.move(id, to: parent, name: name)
            note("\(d): move \(id) to \(parent)/\(name)")
        default:
            guard let id = rng.pick(all) else { return }
            let gone = dev.remove(id)
            for g in gone { must[d]?[g] = nil }
            note("\(d): rm -r \(id) (\(gone.count) items)")
        }
        devices[d] = dev
    }

    // MARK: settling and the checks

    mutating func settleAndCheck() -> String? {
        for d in devices.indices { devices[d].online = true }
        var quiet = 0
        for n in 0..<3000 {
            figures.settleSteps = n
            while !network.isEmpty { deliver(faults: false) }
            for d in devices.indices {
                pump(d)
                while !network.isEmpty { deliver(faults: false) }
            }
            let done = devices.allSatisfy { $0.idle && $0.disk.cursor == server.t.cursor && $0.disk.listed } && network.isEmpty
            quiet = done ? quiet + 1 : 0
            if quiet >= 2 { break }
            advance(.seconds(1))
        }
        if quiet < 2 {
            let stuck = devices.filter { !($0.idle && $0.disk.cursor == server.t.cursor) }.map { d in
                "\(d.index): queue \(d.queue.items) ops \(d.disk.ops.keys.sorted()) inFlight \(d.inFlight?.id.description ?? "-") holds \(d.items.filter { !$0.value.remote.isEmpty }.sorted { $0.key < $1.key }.map { id, r in "\(id) [writer v\(r.remote.forWriter?.version ?? -1) skipped v\(r.remote.skipped?.version ?? -1) \(r.remote.skipped.map { "\($0.parent)/\($0.name.value)\($0.deleted ? " deleted" : "")" } ?? "")] base v\(d.disk.bases[id]?.version ?? -1) here \(d.disk.tree[id].map { "\($0.parent)/\($0.name)" } ?? "none")" }) cursor \(d.disk.cursor)/\(server.t.cursor)"
            }
            let differences = devices.compactMap { d in treeDifference(d).map { "device \(d.index): \($0)" } }
            return "did not settle: \(stuck.joined(separator: "; "))\ndifferences: \(differences.joined(separator: "; "))"
        }
        // Every device shows the server's tree.
        for d in devices {
            if let difference = treeDifference(d) { return "device \(d.index) diverged: \(difference)" }
        }
        // Nothing a device wrote last is lost.
        for d in devices.indices {
            for (id, token) in (must[d] ?? [:]).sorted(by: { $0.key < $1.key }) {
                let kept = server.states(of: id).contains { ModelContent.token($0.content.chunks) == token }
                if !kept { return "lost: device \(d)'s last content \(token) of \(id) is in no version on the server" }
            }
        }
        return nil
    }

    /// Where `d`'s tree differs from the server's live tree; nil where it shows it.
    func treeDifference(_ d: ModelDevice) -> String? {
        let want = Dictionary(uniqueKeysWithValues: server.live().map { r in
            (r.id, "\(r.parent) \(r.name.value) \(r.kind.rawValue) \(ModelContent.token(r.chunks))")
        })
        let have = Dictionary(uniqueKeysWithValues: d.disk.tree.map { id, n in (id, "\(n.parent) \(n.name) \(n.kind.rawValue) \(n.content)") })
        guard have != want else { return nil }
        let missing = want.filter { have[$0.key] != $0.value }.map { "\($0.key): server \($0.value), here \(have[$0.key] ?? "none")" }.sorted()
        let extra = have.filter { want[$0.key] == nil }.map { "\($0.key): here \($0.value), not on the server" }.sorted()
        return (missing + extra).joined(separator: "; ")
    }

    static func describe(_ r: ModelRequest) -> String {
        switch r {
        case .commit(let c): "commit \(c.item) on v\(c.baseVersion ?? -1)\(c.state.deleted ? " delete" : " \(c.state.parent)/\(c.state.name.value) = \(ModelContent.token(c.state.chunks))")"
        case .deleteUnanswered(let id, _): "delete unanswered \(id)"
        case .changes(let since, let folders): "changes since \(since)\(folders.isEmpty ? "" : " + \(folders.count) folders")"
        case .list(let missing): "list (+\(missing.count))"
        case .item(let id): "item \(id)"
        }
    }

    static func describe(_ r: Result<CommitResponse, APIError>) -> String {
        switch r {
        case .success(let c): "\(c.outcome.rawValue) v\(c.item.version)\(c.item.deleted ? " deleted" : " \(c.item.parent)/\(c.item.name.value)")\(c.renamed ? " renamed" : "")"
        case .failure(let e): "error \(e.code.rawValue)"
        }
    }
}
