import ContainerFS
import Crypto
import Foundation
import FuseKit
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Testing

/// The real-thread harness of the engine tests that need a real server and real sockets
/// (HeldAnswerTests, RecoveryTests): devices against a `LiveServer`, each through its own TCP
/// relay. The seeded simulation runs on `SimWorld` instead (DeterministicSimulationTests); the
/// steps and checks below are shared.
struct EngineSim {
    let plan: SimPlan
    let server: LiveServer
    let container = "docs"

    struct Report: Sendable {
        var failure: String?
    }

    /// The plan on three devices over the real network (CollectingServerTests: a server that
    /// collects garbage meanwhile): the steps, then every device resumed, settled and checked.
    func run() async throws -> Report {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-enginesim-\(plan.seed)-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: base) }
        var devices: [SimDevice] = []
        guard let port = server.url.split(separator: ":").last.flatMap({ Int($0) }) else { throw SimFailure("no port in \(server.url)") }
        defer { for d in devices { d.relay.close() } }
        var tokens: [String] = []
        for i in 0..<plan.devices {
            let name = String(UnicodeScalar(UInt8(97 + i)))
            tokens.append(try await server.token(device: name))
            devices.append(try SimDevice(index: i, dir: base.appendingPathComponent(name), serverPort: port, token: tokens[i], container: container))
        }
        let client = NimbusClient(baseURL: server.url, token: tokens[0])
        var report = Report()
        var steps: [String] = []
        var ledger = SimLedger()
        do {
            for d in devices { d.start() }
            for f in SimPlan.initialFolders {
                let e = try devices[0].fs.mkdir(parent: NodeID.root, name: f, mode: 0o755, caller: .process)
                devices[0].fs.forget(node: e.node, count: 1)
            }
            if let why = await settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the first folders did not reach every device: \(why)") }
            for step in plan.steps {
                steps.append("\(step): \(await SimChecks.execute(step, on: devices[step.device], ledger: &ledger))")
                // Files kept open are closed after the step (real time passes between steps).
                for d in devices { steps += await SimChecks.closeWriters(on: d, ledger: &ledger) { true } }
                if step.pause > 0 { try await Task.sleep(for: .milliseconds(step.pause)) }
            }
            for d in devices {
                d.restore()
                d.engine.setPaused(false)
            }
            if let why = await settle(devices, client: client, within: .seconds(90)) { throw SimFailure("the devices did not agree: \(why)") }
            let lost = await SimChecks.lostContents(ledger) { try await client.versions(container, $0) }
            if !lost.isEmpty { throw SimFailure("lost \(lost.count) of \(ledger.last.count) contents:\n" + lost.joined(separator: "\n")) }
        } catch {
            report.failure = "\(error)\nsteps:\n" + steps.suffix(300).joined(separator: "\n")
        }
        for d in devices { await d.stop() }
        return report
    }

    static func seconds(_ d: Duration) -> String {
        String(format: "%.1f s", Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18)
    }

    /// Waits (polling real time, bounded) until the devices agree (`SimChecks.settled`).
    func settle(_ devices: [SimDevice], client: NimbusClient, within limit: Duration) async -> String? {
        let deadline = ContinuousClock.now + limit
        var check = SimChecks.Settling()
        while ContinuousClock.now < deadline {
            let cursor = try? await client.container(container).cursor
            if await check.settled(devices, serverCursor: cursor) { return nil }
            try? await Task.sleep(for: .milliseconds(100))
        }
        return check.why
    }
}

/// What the simulations do and check, on any `SimDevice`.
enum SimChecks {
    // MARK: steps

    /// The pause of a program between two calls of one step (`which`: the how-manieth), drawn
    /// from the step: none half of the time, else up to 30 ms.
    static func gap(_ step: SimStep, _ which: Int) -> Int {
        let bits = Int((step.pick >> (20 + 8 * which)) & 0xff)
        return bits < 128 ? 0 : 1 + bits % 30
    }

    /// Does one step on one device as a program (or the user) would; the outcome is "ok", or
    /// why nothing was done (nothing to pick, a name taken, an errno the program would see).
    static func execute(_ step: SimStep, on dev: SimDevice, ledger: inout SimLedger) async -> String {
        let fs = dev.fs
        do {
            switch step.action {
            case .create:
                guard let parent = dev.folderNode(step.folder) else { return "no folder \(step.folder)" }
                let existing = dev.lookup(parent, step.name)
                // A shell's `>` to a FIFO writes into the pipe: no file is made.
                if let existing, dev.entries(localOnly: true).contains(where: { $0.rec.node == existing && $0.rec.isSpecial }) { return "a FIFO has the name" }
                let id = try dev.writeFile(node: existing, parent: parent, name: step.name, content: step.content)
                ledger.wrote(on: dev, item: id, content: step.content)
            case .write:
                let files = dev.files()
                guard !files.isEmpty else { return "no file" }
                let f = files[Int(step.pick % UInt64(files.count))]
                let id = try dev.writeFile(node: f.rec.node, parent: .absent, name: f.rec.name, content: step.content)
                ledger.wrote(on: dev, item: id, content: step.content)
                return "ok (\(f.path))"
            case .rename, .move:
                let files = dev.files()
                guard !files.isEmpty else { return "no file" }
                let f = files[Int(step.pick % UInt64(files.count))]
                guard let from = f.rec.parent.flatMap(dev.node(of:)) else { return "no parent" }
                let to = step.action == .rename ? from : dev.folderNode(step.toFolder)
                guard let to else { return "no folder \(step.toFolder)" }
                // Only to a free name: a rename over a file makes the survivor take the other's
                // identity (SafeSaveTests) — the ledger would have to follow; deletes cover that.
                try fs.rename(parent: from, name: f.rec.name, newParent: to, newName: step.toName, flags: .noReplace)
                if let toID = to == .root ? ItemID.root : dev.entries().first(where: { $0.rec.node == to })?.rec.id {
                    ledger.moved(device: dev.index, item: f.rec.id, parent: toID, name: step.toName)
                }
                return "ok (\(f.path))"
            case .delete:
                let files = dev.files()
                guard !files.isEmpty else { return "no file" }
                let f = files[Int(step.pick % UInt64(files.count))]
                try remove(f, on: dev, ledger: &ledger)
                return "ok (\(f.path))"
            case .saveOver:
                let files = dev.files().filter { !$0.rec.name.hasPrefix(".") }
                guard !files.isEmpty else { return "no file" }
                let f = files[Int(step.pick % UInt64(files.count))]
                guard let parent = f.rec.parent.flatMap(dev.node(of:)) else { return "no parent" }
                let tmp = "." + f.rec.name + ".tmp"
                for w in dev.openWriters where w.node == f.rec.node { dev.rewritten.insert(w.handle) }
                let old = dev.lookup(parent, tmp)
                let shown = old.flatMap { try? fs.getxattr(node: $0, name: NimbusXattr.version.name) }.flatMap { Int64(String(decoding: $0, as: UTF8.self)) }
                let tmpID = try dev.writeFile(node: old, parent: parent, name: tmp, content: step.content)
                await dev.idle(milliseconds: gap(step, 0))
                guard dev.lookup(parent, f.rec.name) == f.rec.node else { return "the file changed while saved" }
                let targetShown = (try? fs.getxattr(node: f.rec.node, name: NimbusXattr.version.name)).flatMap { Int64(String(decoding: $0, as: UTF8.self)) }
                // What the temporary name holds now: during the pause another device's file of
                // the same name can have arrived, and this device's file been given the name
                // the server chose for it (`.c.txt 2.tmp`). The program renames whatever is
                // there, as a real one would; its bytes stay in the file it wrote.
                guard let atTmp = dev.lookup(parent, tmp) else { return "the temporary file went while saved" }
                let atTmpID = try fs.getxattr(node: atTmp, name: NimbusXattr.itemid.name)
                guard let renamedID = ItemID(String(decoding: atTmpID, as: UTF8.self)) else { throw Errno.EIO }
                let renamedShown = (try? fs.getxattr(node: atTmp, name: NimbusXattr.version.name)).flatMap { Int64(String(decoding: $0, as: UTF8.self)) }
                try fs.rename(parent: parent, name: tmp, newParent: parent, newName: f.rec.name, flags: [])
                ledger.placeUnknown(tmpID)
                ledger.placeUnknown(renamedID)
                // The file renamed over keeps its identity and takes the new bytes
                // (ContainerFS+Remove.swift): the write is the saved file's.
                guard let node = dev.lookup(parent, f.rec.name) else { return "gone after the rename" }
                let raw = try fs.getxattr(node: node, name: NimbusXattr.itemid.name)
                guard let id = ItemID(String(decoding: raw, as: UTF8.self)) else { throw Errno.EIO }
                ledger.forgetXattrs(id)
                guard renamedID == tmpID else {
                    // Another file was renamed: this device's write lives on in `tmpID`; the
                    // file renamed went into the saved one (or became it).
                    ledger.wrote(on: dev, item: tmpID, content: step.content)
                    if renamedID != id { ledger.deleted(device: dev.index, item: renamedID, showing: renamedShown) }
                    if f.rec.id != id { ledger.deleted(device: dev.index, item: f.rec.id, showing: targetShown) }
                    return "ok (\(f.path)), another file renamed"
                }
                ledger.wrote(on: dev, item: id, content: step.content)
                // A temporary file left by an earlier save was overwritten, then went with the
                // rename: this device deleted that item.
                if tmpID != id { ledger.deleted(device: dev.index, item: tmpID, showing: shown) }
                // The file did not keep its identity (it has conflict versions, or is not all
                // here): the rename deleted it, and the new bytes are a new item.
                if f.rec.id != id { ledger.deleted(device: dev.index, item: f.rec.id, showing: targetShown) }
                return "ok (\(f.path))"
            case .writeOpen:
                let files = dev.files()
                guard !files.isEmpty else { return "no file" }
                let f = files[Int(step.pick % UInt64(files.count))]
                guard !dev.openWriters.contains(where: { $0.node == f.rec.node }) else { return "open already" }
                let h = try fs.open(node: f.rec.node, flags: O_WRONLY | O_TRUNC).handle
                let bytes = Array(step.content.utf8)
                do {
                    let n = try bytes.withUnsafeBytes { try fs.write(node: f.rec.node, handle: h, offset: 0, data: $0) }
                    guard n == bytes.count else { throw Errno.EIO }
                } catch {
                    fs.release(node: f.rec.node, handle: h)
                    throw error
                }
                // This device's earlier write to the file is overwritten; the new bytes are
                // promised only once fsynced (at the close).
                ledger.unpromised(on: dev, item: f.rec.id)
                dev.openWriters.append((f.rec.node, h, step.content))
                return "ok (\(f.path)), kept open"
            case .saveAside:
                let files = dev.files().filter { !$0.rec.name.hasPrefix(".") && !$0.rec.name.hasSuffix("~") }
                guard !files.isEmpty else { return "no file" }
                let f = files[Int(step.pick % UInt64(files.count))]
                guard let parent = f.rec.parent.flatMap(dev.node(of:)) else { return "no parent" }
                let backup = f.rec.name + "~"
                guard dev.lookup(parent, backup) == nil else { return "backup name taken" }
                ledger.placeUnknown(f.rec.id)
                try fs.rename(parent: parent, name: f.rec.name, newParent: parent, newName: backup, flags: .noReplace)
                // An editor takes a moment between its calls: the engines run meanwhile.
                await dev.idle(milliseconds: gap(step, 0))
                let id = try dev.writeFile(node: nil, parent: parent, name: f.rec.name, content: step.content)
                ledger.wrote(on: dev, item: id, content: step.content)
                await dev.idle(milliseconds: gap(step, 1))
                // Deleting the backup gives the new file the document's identity (`remove`).
                guard let b = dev.files().first(where: { $0.rec.parent == f.rec.parent && $0.rec.name == backup }) else { return "backup gone" }
                try remove(b, on: dev, ledger: &ledger)
                return "ok (\(f.path))"
            case .rmTree:
                guard dev.folderNode(step.folder) != nil else { return "no folder \(step.folder)" }
                // One file at a time, looked up again each time: removing an editor's backup
                // gives its identity to the new file (`remove`).
                var n = 0
                while let f = dev.files().first(where: { $0.path.hasPrefix(step.folder + "/") }), n < 100 {
                    try remove(f, on: dev, ledger: &ledger)
                    n += 1
                }
                // And the FIFOs, as `rm -r` does.
                for e in dev.entries(localOnly: true) where e.rec.isSpecial && e.path.hasPrefix(step.folder + "/") {
                    if let p = e.rec.parent.flatMap(dev.node(of:)) { try fs.unlink(parent: p, name: e.rec.name) }
                }
                try fs.rmdir(parent: NodeID.root, name: step.folder)
                return "ok (\(n) files)"
            case .setxattr:
                let files = dev.files()
                guard !files.isEmpty else { return "no file" }
                let f = files[Int(step.pick % UInt64(files.count))]
                if step.xattrRemoves {
                    guard fs.snapshot(f.rec.id).xattrs[step.xattrName] != nil else { return "none (\(f.path))" }
                    try fs.removexattr(node: f.rec.node, name: step.xattrName)
                    ledger.setXattr(device: dev.index, item: f.rec.id, name: step.xattrName, value: nil)
                } else {
                    try fs.setxattr(node: f.rec.node, name: step.xattrName, value: Array(step.content.utf8), flags: 0)
                    ledger.setXattr(device: dev.index, item: f.rec.id, name: step.xattrName, value: step.content)
                }
                return "ok (\(f.path))"
            case .link:
                let files = dev.files().filter { !$0.rec.isSpecial }
                guard !files.isEmpty else { return "no file" }
                let f = files[Int(step.pick % UInt64(files.count))]
                guard let parent = dev.folderNode(step.toFolder) else { return "no folder \(step.toFolder)" }
                guard dev.lookup(parent, step.toName) == nil else { return "name taken" }
                // A placeholder's content is downloaded first, as the mount does (`FuseAdapter.link`).
                if fs.linkNeedsContent(f.rec.node) != nil { _ = try await dev.read(f.rec) }
                let e = try fs.link(node: f.rec.node, newParent: parent, newName: step.toName)
                fs.forget(node: e.node, count: 1)
                return "ok (\(f.path))"
            case .mkfifo:
                guard let parent = dev.folderNode(step.folder) else { return "no folder \(step.folder)" }
                if let there = dev.lookup(parent, step.name) {
                    guard dev.entries(localOnly: true).contains(where: { $0.rec.node == there && $0.rec.isSpecial }) else { return "a file has the name" }
                    try fs.unlink(parent: parent, name: step.name)
                    return "ok (removed)"
                }
                let e = try fs.mknod(parent: parent, name: step.name, mode: S_IFIFO | 0o644, caller: .process)
                fs.forget(node: e.node, count: 1)
            case .ignoreRule:
                guard let parent = dev.folderNode(step.folder) else { return "no folder \(step.folder)" }
                let there = dev.lookup(parent, IgnoreMatch.fileName)
                if step.ignoreRemoves {
                    guard let there, let f = dev.entries().first(where: { $0.rec.node == there }) else { return "no rules there" }
                    try remove(f, on: dev, ledger: &ledger)
                    return "ok (removed)"
                }
                let id = try dev.writeFile(node: there, parent: parent, name: IgnoreMatch.fileName, content: step.ignoreText)
                ledger.wrote(on: dev, item: id, content: step.ignoreText)
            case .mkdir:
                let e = try fs.mkdir(parent: NodeID.root, name: step.folder, mode: 0o755, caller: .process)
                fs.forget(node: e.node, count: 1)
            case .rmdir:
                try fs.rmdir(parent: NodeID.root, name: step.folder)
            case .pause, .resume:
                dev.engine.setPaused(step.action == .pause)
            case .disconnect:
                dev.cut()
            case .reconnect:
                dev.restore()
            case .restart, .crash:
                // A crash, or a clean stop that could not save (a full disk), leaves on disk an
                // earlier state: renames made since without an fsync of their folder may be gone.
                if try await dev.restart(crash: step.action == .crash) { ledger.crashed(device: dev.index) }
            case .trashRestore, .trashPurge:
                guard case .link(let link, _) = dev.network else { return "no link" }
                let entries = try await link.trash(link.container).entries
                guard !entries.isEmpty else { return "Recently Deleted is empty" }
                let e = entries[Int(step.pick % UInt64(entries.count))]
                if step.action == .trashRestore {
                    let r = try await link.restoreTrash(link.container, e.item.id, to: nil)
                    return "ok (\(e.path) as \(r.item.name.value), \(r.restored) items)"
                }
                // Recorded before it is sent: an answer lost after the purge went in still purged.
                let items = try await link.trashItems(link.container, e.item.id).items.map(\.id)
                ledger.purged(items)
                let r = try await link.purgeTrash(link.container, e.item.id)
                return "ok (\(e.path), \(r.items) items)"
            }
            return "ok"
        } catch let e as Errno {
            return "\(e)"
        } catch let e as WriteNotDurable {
            if let id = e.item { ledger.unpromised(on: dev, item: id) }
            return "\(e)"
        } catch let e as WrittenAfterDelete {
            return "\(e)"
        } catch {
            return "failed: \(error)"
        }
    }

    /// `rm` of one file as a program does it, with what the ledger must know: the version the
    /// device showed, and an editor's save whose new file took the deleted item's identity.
    static func remove(_ f: SimDevice.Entry, on dev: SimDevice, ledger: inout SimLedger) throws {
        guard let parent = f.rec.parent.flatMap(dev.node(of:)) else { throw Errno.ENOENT }
        let files = dev.files()
        let before = Dictionary(files.map { ($0.rec.node, $0.rec.id) }, uniquingKeysWith: { a, _ in a })
        // (The names of a hard-linked file share its node: each pair is one name.)
        let names = Set(files.map { "\($0.rec.node) \($0.rec.id)" })
        let shown = (try? dev.fs.getxattr(node: f.rec.node, name: NimbusXattr.version.name)).flatMap { Int64(String(decoding: $0, as: UTF8.self)) }
        try dev.fs.unlink(parent: parent, name: f.rec.name)
        ledger.deleted(device: dev.index, item: f.rec.id, showing: shown)
        // An editor's save (rename away, create, delete the backup): the new file took
        // the deleted item's identity (ContainerFS+Remove.swift).
        for g in dev.files() where !names.contains("\(g.rec.node) \(g.rec.id)") && before[g.rec.node].map({ $0 != g.rec.id }) == true {
            ledger.identityMoved(device: dev.index, from: before[g.rec.node]!, to: g.rec.id)
            ledger.placeUnknown(before[g.rec.node]!)
            ledger.placeUnknown(g.rec.id)
        }
    }

    /// Closes the device's open files that `close` picks (fsync, then close), as the program
    /// that opened them would; a write whose fsync succeeded is promised. One line per close.
    static func closeWriters(on d: SimDevice, ledger: inout SimLedger, close: () -> Bool) async -> [String] {
        var left: [(node: NodeID, handle: HandleID, content: String)] = []
        var lines: [String] = []
        for w in d.openWriters {
            guard close() else { left.append(w); continue }
            let raw = try? d.fs.getxattr(node: w.node, name: NimbusXattr.itemid.name)
            let id = raw.flatMap { ItemID(String(decoding: $0, as: UTF8.self)) }
            var outcome = "closed"
            do {
                try d.fs.fsync(node: w.node, handle: w.handle, dataOnly: false)
                // Deleted while open (here or from elsewhere): the bytes went with the file,
                // also when the item was shown again since (as another node: a file of its own).
                // Written again since by another step here: that write is the last.
                if let id, d.fs.localState(id)?.node == w.node, !d.rewritten.contains(w.handle) {
                    ledger.wrote(on: d, item: id, content: w.content)
                }
            } catch {
                if let id { ledger.unpromised(on: d, item: id) }
                outcome = "fsync failed: \(error)"
            }
            d.fs.release(node: w.node, handle: w.handle)
            d.rewritten.remove(w.handle)
            lines.append("\(d.name) closes \(id.map { "\($0)" } ?? "?"): \(outcome)")
        }
        d.openWriters = left
        return lines
    }

    // MARK: checks

    /// Settledness over successive looks: every device has an empty upload queue and its cursor
    /// at the server's, and all trees are equal — in two looks in a row. `why` is the last
    /// difference seen.
    struct Settling {
        var why = "not checked"
        var lastTree: [String: String]?

        mutating func settled(_ devices: [SimDevice], serverCursor: Int64?) async -> Bool {
            if let w = await SimChecks.difference(devices, serverCursor: serverCursor) {
                why = w
                lastTree = nil
            } else if let t = await devices[0].tree() {
                if t == lastTree { return true }
                lastTree = t
            }
            return false
        }
    }

    static func difference(_ devices: [SimDevice], serverCursor: Int64?) async -> String? {
        guard let cursor = serverCursor else { return "the server did not answer" }
        for d in devices {
            let lines = Dictionary(d.engine.statusLines(), uniquingKeysWith: { a, _ in a })
            let queue = lines["upload-queue"] ?? "?"
            let at = lines["cursor"] ?? "?"
            if queue != "0" || at != "\(cursor)" {
                return "device \(d.name): upload-queue \(queue), cursor \(at) of \(cursor), "
                    + "connection \(lines["connection"] ?? "?"), sync-error \(lines["sync-error"] ?? "?")"
            }
        }
        var trees: [[String: String]] = []
        for d in devices {
            switch await d.readTree() {
            case .success(let t): trees.append(t)
            case .failure(let why): return "device \(d.name): its tree changed while read (\(why))"
            }
        }
        for (i, t) in trees.enumerated().dropFirst() where t != trees[0] {
            return "device a and device \(devices[i].name) differ:\n" + Self.diff(trees[0], t, devices[0].name, devices[i].name)
                + "\ntrees:\n" + trees.enumerated().map { "\(devices[$0.offset].name): " + Self.show($0.element) }.joined(separator: "\n")
        }
        return nil
    }

    static func show(_ t: [String: String]) -> String {
        t.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value.trimmingCharacters(in: .newlines).replacingOccurrences(of: "\0", with: "\\0"))" }.joined(separator: "  ")
    }

    static func diff(_ a: [String: String], _ b: [String: String], _ an: String, _ bn: String) -> String {
        Set(a.keys).union(b.keys).sorted().compactMap { k in
            guard a[k] != b[k] else { return nil }
            // Escaped: contents that differ only in newlines or NUL bytes show how.
            let show = { (v: String?) in v.map { String(reflecting: $0) } }
            return "  \(k): \(an) \(show(a[k]) ?? "-") | \(bn) \(show(b[k]) ?? "-")"
        }.joined(separator: "\n")
    }

    /// The ledger's contents the server lost: each device's last write to an item must be live
    /// (the current state or a conflict version), kept as history under a later state, or
    /// given up by a delete whose device had shown a version holding it. A write that survives
    /// only in the history of an item deleted by a device that never showed it is lost.
    /// `inTrash` (when known: the simulated server's tables) says whether a deleted item is in
    /// Recently Deleted: a content whose item is deleted now must still be there (or have been
    /// purged by a device on purpose).
    /// Items whose place one device alone chose (the last rename or move it made of them; no
    /// other device moved them, no save changed their identity) and that end elsewhere: a
    /// rename lost. The name may be the one the server gives a taken name (`NAME 2.EXT`); an
    /// item deleted, or whose chosen folder is gone, is not looked at.
    /// An item that ends under the name beside a local-only item of some device (a FIFO holding
    /// the name it arrived at there: `ContainerFS.nameBeside`, a move that device pushes) is not
    /// looked at either: that move is the rule's, and may come after the rename.
    static func misplaced(_ ledger: SimLedger, on dev: SimDevice, all devices: [SimDevice]) -> [String] {
        var out: [String] = []
        let fifos = devices.flatMap { d in d.entries(localOnly: true).filter(\.rec.isSpecial).compactMap { e in e.rec.parent.map { ($0, e.rec.name) } } }
        for (id, place) in ledger.placed.sorted(by: { $0.key.description < $1.key.description }) {
            guard let place, let rec = dev.fs.localState(id), let parent = rec.parent else { continue }
            guard place.parent == .root || dev.fs.localState(place.parent) != nil else { continue }
            if parent == place.parent && (rec.name == place.name || Self.isTakenNameOf(rec.name, place.name)) { continue }
            if fifos.contains(where: { $0.0 == parent && Self.isTakenNameOf(rec.name, $0.1) }) { continue }
            out.append("\(id): device \(place.device) put it at \(place.parent)/\(place.name); it ended at \(parent)/\(rec.name)")
        }
        return out
    }

    /// Attributes that one device alone set or removed (its last `setfattr` of that name; no
    /// other device touched the name, no save changed the item's identity, no device deleted it)
    /// and that end otherwise on a live item: an attribute change lost.
    static func lostXattrs(_ ledger: SimLedger, on dev: SimDevice) -> [String] {
        var out: [String] = []
        for (k, set) in ledger.xattrs.sorted(by: { $0.key < $1.key }) {
            guard let set, dev.fs.localState(k.item) != nil else { continue }
            let here = dev.fs.snapshot(k.item).xattrs[k.name].map { String(decoding: $0, as: UTF8.self) }
            if here == set.value { continue }
            out.append("\(k.item) \(k.name): device \(set.device) left \(String(reflecting: set.value)); it ended \(String(reflecting: here))")
        }
        return out
    }

    /// Whether `name` is what the server gives `wanted` when it is taken (`a.txt` → `a 2.txt`,
    /// `a 3.txt`…).
    /// `depth` 2: the name beside a local-only item (`NAME 2.EXT`) may itself be taken on the
    /// server (`NAME 2 2.EXT`).
    static func isTakenNameOf(_ name: String, _ wanted: String, depth: Int = 2) -> Bool {
        var taken: Set<String> = [wanted]
        for _ in 2..<100 {
            let next = ItemName(trusted: wanted).deduplicated(isTaken: { taken.contains($0) }).value
            if next == name || (depth > 1 && name.hasPrefix(next.split(separator: ".").first.map(String.init) ?? next)
                                && isTakenNameOf(name, next, depth: depth - 1)) { return true }
            taken.insert(next)
        }
        return false
    }

    static func lostContents(_ ledger: SimLedger, versionsOf: (ItemID) async throws -> [VersionRecord],
                             inTrash: ((ItemID) -> Bool)? = nil) async -> [String] {
        var lost: [String] = []
        for (key, content) in ledger.mustSurvive {
            if ledger.purged.contains(key.item) { continue }
            let hash = ContentHash(digest: SHA256.hash(data: Array(content.utf8)))
            let versions: [VersionRecord]
            do { versions = try await versionsOf(key.item) } catch {
                lost.append("\(key.item) (device \(key.device)): \(content.trimmingCharacters(in: .newlines)) — no versions: \(error)")
                continue
            }
            let vs = versions.map { v in
                "v\(v.version) \(v.role) \(v.deviceName) \(v.state.name.value)\(v.state.deleted ? " deleted" : "")"
            }
            if let inTrash, versions.first(where: { $0.role == .current })?.state.deleted == true, !inTrash(key.item) {
                lost.append("\(key.item) (device \(key.device)): \(content.trimmingCharacters(in: .newlines)) — deleted and not in Recently Deleted; versions: \(vs)")
                continue
            }
            let holding = versions.filter { $0.state.chunks.contains { $0.hash == hash } }
            guard let first = holding.map(\.version).min() else {
                lost.append("\(key.item) (device \(key.device)): \(content.trimmingCharacters(in: .newlines)) — versions: \(vs)")
                continue
            }
            if holding.contains(where: { $0.role == .current || $0.role == .conflict }) { continue }
            guard let current = versions.first(where: { $0.role == .current }), current.state.deleted else { continue }
            // Replaced by a later edit (a `previous` version is one a commit based on it replaced;
            // had the edit not seen it, the server would have kept it as a conflict version):
            // history under a later state. Only a delete right after it can have taken it.
            let lastHolding = holding.map(\.version).max() ?? first
            if let next = versions.filter({ $0.version > lastHolding }).min(by: { $0.version < $1.version }), !next.state.deleted { continue }
            let deleter = current.deviceName.unicodeScalars.first.map { Int($0.value) - 97 }
            let shown = deleter.flatMap { ledger.deletedShowing[SimLedger.Key(device: $0, item: key.item)] } ?? -1
            if shown >= first { continue }
            lost.append("\(key.item) (device \(key.device)): \(content.trimmingCharacters(in: .newlines)) — deleted (v\(current.version)) by "
                + "\(current.deviceName), which had shown v\(shown), not v\(first) that holds it; versions: \(vs)")
        }
        return lost
    }
}

struct SimFailure: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}

extension SimLedger {
    /// A write on `dev` to `item` is a write to every name of its file there (hard links share
    /// the content: `.link`).
    mutating func wrote(on dev: SimDevice, item: ItemID, content: String) {
        for id in dev.names(of: item) { wrote(device: dev.index, item: id, content: content) }
    }

    mutating func unpromised(on dev: SimDevice, item: ItemID) {
        for id in dev.names(of: item) { unpromised(device: dev.index, item: id) }
    }
}
