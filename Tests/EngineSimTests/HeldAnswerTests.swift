import ContainerFS
import Foundation
import FuseKit
import Glibc
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Testing

/// Answers held back in the relay on demand (`Relay.holdNextAnswer`), to make timing races of
/// the engine happen every time.
///
/// A download still on its way when the file's content changes must not write into the file
/// that now holds the new content: neither a new version from elsewhere nor a program's
/// truncation here. Slow downloads are made on demand: b's relay holds the answer to its
/// chunk request until the change is done (with a read deadline long enough that the held
/// download does not simply time out). Two devices each, on the engine-sim harness.
@Suite(.serialized) struct HeldAnswerTests {
    /// 200 KB: one chunk (the chunker's smallest is 256 KiB).
    static let old = String(repeating: "the old content of x.txt\n", count: 8_000)

    /// a writes x.txt; b starts reading it (its download held back); a writes a short new
    /// version, b shows it and reads it; then the old download arrives. Before the fix its bytes
    /// went into the new version's file: b read old bytes under the new size, and after a
    /// restart the file's size was the old one.
    @Test func aSlowDownloadOfAnOldVersionStaysOutOfTheNewOne() async throws {
        try await Self.withHeldRead { a, b, _, _, id, oldRead in
            _ = try a.writeFile(node: a.fs.localState(id)?.node, parent: .absent, name: "x.txt", content: "new\n")
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline, b.fs.localState(id)?.size != 4 { try await Task.sleep(for: .milliseconds(20)) }
            #expect(b.fs.localState(id)?.size == 4, "b never showed the new version")
            #expect(await b.tree()?["x.txt"] == "new\n")  // downloads the new version (not held)

            b.relay.releaseHeld()
            #expect(await oldRead.value == .EIO, "the old version's read is answered EIO, never with other bytes")
            #expect(await b.tree()?["x.txt"] == "new\n")
            #expect(b.store.cache.size(of: id) == 4, "the cache file holds the new version only")
            try await b.restart(crash: true)
            #expect(await b.tree()?["x.txt"] == "new\n")
        }
    }

    /// b starts reading x.txt (its download held back); a program on b truncates and rewrites
    /// it; then the download arrives. Before the fix its bytes went over the program's: b read
    /// old bytes, and the size grew back at the next start.
    @Test func aSlowDownloadStaysOutOfAFileAProgramTruncated() async throws {
        try await Self.withHeldRead { a, b, client, sim, id, read in
            let devices = [a, b]

            guard let node = b.fs.localState(id)?.node else { throw SimFailure("b has no x.txt") }
            _ = try b.writeFile(node: node, parent: .absent, name: "x.txt", content: "mine\n")
            b.relay.releaseHeld()
            #expect(await read.value == nil, "the read goes on, on the file as the program left it")
            #expect(b.store.cache.size(of: id) == 5, "the cache file holds the program's bytes only")
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the devices did not agree: \(why)") }
            #expect(await a.tree()?["x.txt"] == "mine\n")
            #expect(await b.tree()?["x.txt"] == "mine\n")
            try await b.restart(crash: true)
            #expect(await b.tree()?["x.txt"] == "mine\n")
        }
    }

    /// Two devices (read deadline long enough that a held download does not simply time out):
    /// a writes `x.txt` (`old`), both settle, and b starts reading it with the answer held back.
    static func withHeldRead(_ body: @escaping @Sendable (SimDevice, SimDevice, NimbusClient, EngineSim, ItemID,
                                                          Task<Errno?, Never>) async throws -> Void) async throws {
        try await RecoveryTests.twoDevices(hydrationSeconds: 60) { a, b, client, sim in
            let id = try a.writeFile(node: nil, parent: NodeID.root, name: "x.txt", content: Self.old)
            if let why = await sim.settle([a, b], client: client, within: .seconds(30)) { throw SimFailure("x.txt did not reach b: \(why)") }
            try await body(a, b, client, sim, id, try await Self.startHeldRead(b, id))
        }
    }

    /// Evicts `id` on `dev` and starts a read of all of it whose chunk answer the relay holds back; returns
    /// once the request is out. The task ends with the read's answer.
    static func startHeldRead(_ dev: SimDevice, _ id: ItemID) async throws -> Task<Errno?, Never> {
        guard let rec = dev.fs.localState(id) else { throw SimFailure("\(dev.name) has no \(id)") }
        let size = rec.size
        // The settle read every file: make it a placeholder again.
        try dev.fs.setxattr(node: rec.node, name: "user.nimbus.evict", value: Array("1".utf8), flags: 0)
        dev.relay.holdNextAnswer(after: "GET /v1/chunks/")
        let engine = dev.engine
        let read = Task {
            await withCheckedContinuation { (c: CheckedContinuation<Errno?, Never>) in
                engine.hydrate(id, range: 0..<size) { c.resume(returning: $0) }
            }
        }
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline, !dev.relay.holdMatched { try await Task.sleep(for: .milliseconds(10)) }
        guard dev.relay.holdMatched else {
            dev.relay.releaseHeld()
            read.cancel()
            throw SimFailure("\(dev.name)'s chunk request never went out (the read: \(String(describing: await read.value)), "
                + "status \(dev.engine.statusLines().map { "\($0.0)=\($0.1)" }.joined(separator: " ")))")
        }
        return read
    }

    /// An editor's save (vim: `doc.txt` → `doc.txt~`, a new `doc.txt` written and fsynced, the
    /// backup deleted) begun while the server is unreachable: the commit of the rename goes out
    /// as the server comes back, and its answer (held here) merges b's edit, stored meanwhile.
    /// The answer must neither replace the saved bytes, which reached the document's id through
    /// the identity transfer, nor undo the rename back: every device ends with `doc.txt` holding
    /// a's save (the later) and b's edit as a conflict version. Before, the answer was shown
    /// (the new file's write generation happened to equal the old file's): `doc.txt~` with b's
    /// content everywhere, and the next push found nothing to send — the save was lost.
    @Test func anEditorSaveWhileItsRenameIsOnItsWayIsKeptEverywhere() async throws {
        try await RecoveryTests.twoDevices { a, b, client, sim in
            let devices = [a, b]
            let root = NodeID.root
            let id = try a.writeFile(node: nil, parent: root, name: "doc.txt", content: "first\n")
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("doc.txt did not reach b: \(why)") }

            // a cannot reach the server; b's edit is stored meanwhile.
            a.relay.cut()
            _ = try b.writeFile(node: b.fs.localState(id)?.node, parent: .absent, name: "doc.txt", content: "edited on b\n")
            var deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline, b.status("upload-queue") != "0" { try await Task.sleep(for: .milliseconds(10)) }
            #expect(b.status("upload-queue") == "0", "b's edit reached the server")

            // The save begins offline; the server is back as the rename's commit goes out.
            try a.fs.rename(parent: root, name: "doc.txt", newParent: root, newName: "doc.txt~", flags: [])
            a.relay.holdNextAnswer(after: "/commit")
            a.relay.restore()
            deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline, !a.relay.holdMatched { try await Task.sleep(for: .milliseconds(10)) }
            guard a.relay.holdMatched else {
                a.relay.releaseHeld()
                throw SimFailure("a's rename never went out")
            }
            // The rest of the save, while that commit is on its way.
            _ = try a.writeFile(node: nil, parent: root, name: "doc.txt", content: "saved on a\n")
            try a.fs.unlink(parent: root, name: "doc.txt~")
            #expect(a.fs.localState(id)?.name == "doc.txt", "the new doc.txt took the document's identity")
            a.relay.releaseHeld()

            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the devices did not agree: \(why)") }
            for d in devices {
                #expect(await d.tree() == ["doc.txt": "saved on a\n"], "\(d.name)")
            }
            var kept: [String: Set<VersionRole>] = [:]
            for v in try await client.versions("docs", id) where !v.state.deleted {
                var bytes: [UInt8] = []
                for c in v.state.chunks { bytes += try await client.getChunk(c.hash) }
                kept[String(decoding: bytes, as: UTF8.self), default: []].insert(v.role)
            }
            #expect(kept["saved on a\n"]?.contains(.current) == true, "\(kept)")
            #expect(kept["edited on b\n"]?.contains(.conflict) == true, "\(kept)")
        }
    }

    /// Engine sim seed 6, made on demand: b deletes x.txt and its commit's answer is held back;
    /// meanwhile a edits x.txt (an edit against a delete wins: the server brings it back), and b
    /// pulls that version while its delete is still on its way. When the answer comes, b must
    /// show a's version. Before the fix it waited for good and x.txt stayed gone on b only.
    @Test func anEditThatArrivesWhileTheDeleteIsOnItsWayIsShownAfterIt() async throws {
        try await RecoveryTests.twoDevices { a, b, client, sim in
            let devices = [a, b]
            let id = try a.writeFile(node: nil, parent: NodeID.root, name: "x.txt", content: "first\n")
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("x.txt did not reach b: \(why)") }

            // a edits on its old base: it must not hear of the delete first.
            a.engine.setPaused(true)
            b.relay.holdNextAnswer(after: "/commit")
            try b.fs.unlink(parent: NodeID.root, name: "x.txt")
            var deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline, !b.relay.holdMatched { try await Task.sleep(for: .milliseconds(10)) }
            guard b.relay.holdMatched else {
                b.relay.releaseHeld()
                throw SimFailure("b's delete never went out")
            }
            // The delete is stored; a's edit (on its old base) wins against it.
            _ = try a.writeFile(node: a.fs.localState(id)?.node, parent: .absent, name: "x.txt", content: "edited on a\n")
            a.engine.setPaused(false)
            deadline = ContinuousClock.now + .seconds(20)
            var cursor: Int64 = -1
            while ContinuousClock.now < deadline {
                cursor = try await client.container("docs").cursor
                if a.status("upload-queue") == "0", b.status("cursor") == "\(cursor)" { break }
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(b.status("cursor") == "\(cursor)", "b pulled a's edit while its delete was on its way")
            b.relay.releaseHeld()
            if let why = await sim.settle(devices, client: client, within: .seconds(30)) { throw SimFailure("the devices did not agree: \(why)") }
            #expect(await b.tree()?["x.txt"] == "edited on a\n")
            #expect(await a.tree()?["x.txt"] == "edited on a\n")
        }
    }
}

