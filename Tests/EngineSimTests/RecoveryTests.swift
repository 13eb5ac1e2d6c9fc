import ContainerFS
import Foundation
import FuseKit
import Glibc
import MountPorts
import NimbusCore
import NimbusRemote
import NimbusTesting
import Testing

/// What the engine must not forget: remote states it could not show yet, across a restart
/// (engine sim seed 19), and a create whose answer was lost (seed 21). Two devices each, on
/// the engine-sim harness.
@Suite(.serialized) struct RecoveryTests {
    /// A renames its file onto a name that B's new file (still open, not uploaded) holds, so B
    /// skips the rename. B restarts; its file is then uploaded (the server names it `b 2.txt`)
    /// and the rename must follow. Before the fix B kept the old name forever.
    @Test func aRemoteRenameSkippedForATakenNameIsShownAfterARestart() async throws {
        try await Self.twoDevices { a, b, client, sim in
            let devices = [a, b]
            _ = try a.writeFile(node: nil, parent: NodeID.root, name: "d.txt", content: "written on a\n")
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("d.txt did not reach b: \(why)") }

            // b's own b.txt, written and still open: not uploaded until it is closed.
            let (e, open) = try b.fs.create(parent: NodeID.root, name: "b.txt", mode: 0o644,
                                            flags: O_WRONLY | O_CREAT, caller: .process)
            b.fs.forget(node: e.node, count: 1)
            let bytes = Array("written on b\n".utf8)
            _ = try bytes.withUnsafeBytes { try b.fs.write(node: e.node, handle: open.handle, offset: 0, data: $0) }

            try a.fs.rename(parent: NodeID.root, name: "d.txt", newParent: NodeID.root,
                            newName: "b.txt", flags: .noReplace)
            // b pulls the rename and cannot show it (the name is taken here).
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline {
                let cursor = try await client.container("docs").cursor
                if a.status("upload-queue") == "0", b.status("cursor") == "\(cursor)" { break }
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(b.lookup(NodeID.root, "d.txt") != nil, "b skipped the rename (its b.txt holds the name)")

            // A clean restart (the open file's program is gone with it): b.txt is uploaded
            // and renamed by the server; the skipped rename must be shown then.
            try await b.restart(crash: false)
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the devices did not agree: \(why)") }
            let tree = await b.tree() ?? [:]
            #expect(tree["b.txt"] == "written on a\n")
            #expect(tree["b 2.txt"] == "written on b\n")
            #expect(tree["d.txt"] == nil)
        }
    }

    /// b creates a file; the server stores it, but the answer is lost and b goes offline. b then
    /// deletes the file (it believes it never left the device). Back online, the delete must
    /// reach the server — before the fix it was dropped as "never uploaded", and the file lived
    /// on every other device while gone here. A second file, edited on a meanwhile, comes back
    /// on b (edit vs delete: the edit wins).
    @Test func aDeleteAfterALostCreateAnswerReachesTheServer() async throws {
        try await Self.twoDevices { a, b, client, sim in
            let devices = [a, b]
            try await Self.createLosingTheAnswer("gone.txt", on: b)
            try b.fs.unlink(parent: NodeID.root, name: "gone.txt")
            b.relay.restore()
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the devices did not agree: \(why)") }

            try await Self.createLosingTheAnswer("kept.txt", on: b)
            // a sees it (the server has it) and edits it.
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline, a.lookup(NodeID.root, "kept.txt") == nil { try await Task.sleep(for: .milliseconds(20)) }
            guard let kept = a.lookup(NodeID.root, "kept.txt") else { throw SimFailure("a never saw kept.txt") }
            let id = try a.writeFile(node: kept, parent: .absent, name: "kept.txt", content: "edited on a\n")
            // a's edit is on the server (its version is past b's create) before b deletes: an
            // empty upload queue on a can be read before the filesystem's notice reaches it.
            let first = try await client.versions("docs", id).map(\.version).min() ?? 0
            while ContinuousClock.now < deadline, (try? await client.item("docs", id))?.version ?? 0 <= first {
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect((try? await client.item("docs", id))?.version ?? 0 > first, "a's edit never reached the server")
            try b.fs.unlink(parent: NodeID.root, name: "kept.txt")
            b.relay.restore()
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the devices did not agree: \(why)") }
            for d in devices {
                let tree = await d.tree() ?? [:]
                #expect(tree["gone.txt"] == nil, "device \(d.name): the delete reached the server; tree \(tree)")
                #expect(tree["kept.txt"] == "edited on a\n", "device \(d.name): the edit made elsewhere wins over the delete; tree \(tree)")
            }
        }
    }

    /// b creates a file; the server stores it, but the answer is lost and b goes offline. a
    /// edits the file. Back online, b sends its create again — decided while the file was still
    /// there, and b's program deletes it while the commit is on its way (held in the relay).
    /// The server keeps a's edit as current and b's state as a conflict version. b never
    /// showed a's edit, so its delete must not go on the answer's version, which holds that edit:
    /// the edit stays on both devices.
    @Test func aCreateSentAgainOntoAnEditMadeElsewhereIsNotDeletedByADeleteHere() async throws {
        try await Self.twoDevices { a, b, client, sim in
            let devices = [a, b]
            try await Self.createLosingTheAnswer("kept.txt", on: b)
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline, a.lookup(NodeID.root, "kept.txt") == nil { try await Task.sleep(for: .milliseconds(20)) }
            guard let kept = a.lookup(NodeID.root, "kept.txt") else { throw SimFailure("a never saw kept.txt") }
            let id = try a.writeFile(node: kept, parent: .absent, name: "kept.txt", content: "edited on a\n")
            // a's edit is on the server (its version is past b's create).
            let first = try await client.versions("docs", id).map(\.version).min() ?? 0
            while ContinuousClock.now < deadline, (try? await client.item("docs", id))?.version ?? 0 <= first {
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect((try? await client.item("docs", id))?.version ?? 0 > first, "a's edit never reached the server")

            // b's push of its create is decided with the file there (its bytes go inside the
            // commit); the commit's answer is held.
            b.relay.holdNextAnswer(after: "/commit")
            b.relay.restore()
            while ContinuousClock.now < deadline, !b.relay.holdMatched { try await Task.sleep(for: .milliseconds(10)) }
            #expect(b.relay.holdMatched, "b never sent its create again")
            try b.fs.unlink(parent: NodeID.root, name: "kept.txt")
            b.relay.releaseHeld()
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the devices did not agree: \(why)") }
            for d in devices {
                let tree = await d.tree() ?? [:]
                #expect(tree["kept.txt"] == "edited on a\n", "device \(d.name): the edit made elsewhere wins over the delete; tree \(tree)")
            }
        }
    }

    /// b writes `name` as a new file; the commit reaches the server, its answer is lost, and b
    /// goes offline.
    static func createLosingTheAnswer(_ name: String, on b: SimDevice) async throws {
        b.relay.loseNextAnswer(after: "/commit")
        _ = try b.writeFile(node: nil, parent: NodeID.root, name: name, content: "b made \(name)\n")
        let deadline = ContinuousClock.now + .seconds(20)
        while !b.relay.isCut, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        guard b.relay.isCut else { throw SimFailure("b's commit of \(name) never went out") }
    }

    /// Two devices (a, b) on a live server, started; `body` runs; both are stopped whatever
    /// happens, and an error thrown by `body` is recorded.
    /// a removes folder `d` while b writes a new file in it (open, so in no upload queue yet):
    /// b keeps the folder and the file (before the fix the delete took the file being written).
    /// b's program then removes its file, and b restarts before the kept delete was tried again.
    /// The journal is past the delete, so only the relist at start can bring it: before the fix
    /// it listed live items only and b kept the empty `d` for good (engine sim seed 4).
    @Test func aFolderDeleteKeptForAFileBeingWrittenIsShownAfterARestart() async throws {
        try await Self.twoDevices { a, b, client, sim in
            let devices = [a, b]
            let made = try a.fs.mkdir(parent: NodeID.root, name: "d", mode: 0o755, caller: .process)
            a.fs.forget(node: made.node, count: 1)
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("d did not reach b: \(why)") }
            guard let dB = b.lookup(NodeID.root, "d") else { throw SimFailure("b has no d") }

            // b's program writes d/x.txt and keeps it open.
            let (e, open) = try b.fs.create(parent: dB, name: "x.txt", mode: 0o644, flags: O_WRONLY | O_CREAT, caller: .process)
            b.fs.forget(node: e.node, count: 1)
            let bytes = Array("being written on b\n".utf8)
            _ = try bytes.withUnsafeBytes { try b.fs.write(node: e.node, handle: open.handle, offset: 0, data: $0) }
            // b tried to upload it (mid-save: nothing sent; the close queues it again).
            try await Task.sleep(for: .milliseconds(300))

            try a.fs.rmdir(parent: NodeID.root, name: "d")
            let deadline = ContinuousClock.now + .seconds(20)
            var cursor: Int64 = -1
            while ContinuousClock.now < deadline {
                cursor = try await client.container("docs").cursor
                if a.status("upload-queue") == "0", b.status("cursor") == "\(cursor)", a.lookup(NodeID.root, "d") == nil { break }
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(b.status("cursor") == "\(cursor)", "b pulled a's delete")
            #expect(b.lookup(dB, "x.txt") != nil, "the file being written in d survives the delete from elsewhere")

            // The program gives up: it closes and removes the file. b stops (paused first, so
            // the kept delete is not tried again before) and crashes.
            b.engine.setPaused(true)
            b.fs.release(node: e.node, handle: open.handle)
            try b.fs.unlink(parent: dB, name: "x.txt")
            _ = b.store.sync()  // the removal is durable (a crash may lose what is not)
            try await b.restart(crash: true)
            b.engine.setPaused(false)
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the devices did not agree: \(why)") }
            #expect(b.lookup(NodeID.root, "d") == nil)
        }
    }

    /// b makes folder `d`; the server stores it but the answer is lost and b goes offline. a
    /// sees `d` and removes it. Back online, b sends its create again and the server answers
    /// with the delete: b must remove `d` too. Before the fix b saved the answer as its base and
    /// kept the folder for good (the journal's delete was then old news: engine sim seed 4).
    @Test func aCreateSentAgainAfterADeleteElsewhereEndsDeleted() async throws {
        try await Self.twoDevices { a, b, client, sim in
            let devices = [a, b]
            // Both online first (a commit before the container exists is answered 404).
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("no start: \(why)") }
            b.relay.loseNextAnswer(after: "/commit")
            let made = try b.fs.mkdir(parent: NodeID.root, name: "d", mode: 0o755, caller: .process)
            b.fs.forget(node: made.node, count: 1)
            var deadline = ContinuousClock.now + .seconds(20)
            while !b.relay.isCut, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
            guard b.relay.isCut else { throw SimFailure("b's commit of d never went out") }
            deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline, a.lookup(NodeID.root, "d") == nil { try await Task.sleep(for: .milliseconds(20)) }
            guard a.lookup(NodeID.root, "d") != nil else { throw SimFailure("a never saw d") }
            try a.fs.rmdir(parent: NodeID.root, name: "d")
            while ContinuousClock.now < deadline, a.status("upload-queue") != "0" { try await Task.sleep(for: .milliseconds(20)) }
            b.relay.restore()
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the devices did not agree: \(why)") }
            #expect(b.lookup(NodeID.root, "d") == nil)
        }
    }

    static func twoDevices(hydrationSeconds: Int64 = 5, _ body: @escaping @Sendable (SimDevice, SimDevice, NimbusClient, EngineSim) async throws -> Void) async throws {
        try await LiveServer.with { server in
            let base = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-enginesim-recovery-\(UUID().uuidString)")
            defer { try? FileManager.default.removeItem(at: base) }
            guard let port = server.url.split(separator: ":").last.flatMap({ Int($0) }) else { throw SimFailure("no port in \(server.url)") }
            var devices: [SimDevice] = []
            defer { for d in devices { d.relay.close() } }
            for i in 0..<2 {
                let name = String(UnicodeScalar(UInt8(97 + i)))
                devices.append(try SimDevice(index: i, dir: base.appendingPathComponent(name), serverPort: port,
                                             token: try await server.token(device: name), container: "docs",
                                             hydrationSeconds: hydrationSeconds))
            }
            let client = NimbusClient(baseURL: server.url, token: try await server.token(device: "checker"))
            let sim = EngineSim(plan: SimPlan(seed: 0, rounds: 0), server: server)
            var failure: String?
            do {
                for d in devices { d.start() }
                // Both online first (their container exists): a commit a test means to reach the
                // server must not race a device's first sync.
                let online = ContinuousClock.now + .seconds(20)
                while ContinuousClock.now < online, !devices.allSatisfy({ $0.status("connection") == "online" }) {
                    try await Task.sleep(for: .milliseconds(20))
                }
                try await body(devices[0], devices[1], client, sim)
            } catch {
                failure = "\(error)"
            }
            for d in devices { await d.stop() }
            if let failure { Issue.record(Comment(rawValue: failure)) }
        }
    }
}
