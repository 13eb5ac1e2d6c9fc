import ContainerFS
import Foundation
import FuseKit
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Testing

/// `.nimbusignore` on the engine-sim harness (two devices on a live server, and a client that
/// commits as a device that does not follow the rules): an edit of an ignored file stays on its
/// device, across a crash, and a pull never replaces it (docs/ignore.md).
@Suite(.serialized) struct IgnoreEngineTests {
    @Test func aParkedEditIsNeverOverwrittenAndGoesUpWhenTheRuleGoes() async throws {
        try await RecoveryTests.twoDevices { a, b, client, sim in
            let id = try a.writeFile(node: nil, parent: NodeID.root, name: "t.tmp", content: "v1\n")
            if let why = await sim.settle([a, b], client: client, within: .seconds(30)) { throw SimFailure("did not settle: \(why)") }
            let rules = try a.writeFile(node: nil, parent: NodeID.root, name: ".nimbusignore", content: "*.tmp\n")
            if let why = await sim.settle([a, b], client: client, within: .seconds(30)) { throw SimFailure("did not settle: \(why)") }
            // a's edit is ignored: parked, never uploaded.
            _ = try a.writeFile(node: a.fs.localState(id)?.node, parent: .absent, name: "t.tmp", content: "mine\n")
            try await Self.until("a parks its edit") { a.engine.itemStatus(id) == .localOnly }
            // A device that does not follow the rules commits another version.
            let current = try await client.item("docs", id)
            var draft = ItemDraft(current)
            draft.chunks = [try await client.upload(Array("theirs\n".utf8))]
            _ = try await client.commit("docs", CommitRequest(item: id, baseVersion: current.version, state: draft))
            try await Self.until("b shows theirs") { await b.tree()?["t.tmp"] == "theirs\n" }
            try await Self.until("a's pull caught up") { a.status("cursor") == b.status("cursor") }
            #expect(await a.tree()?["t.tmp"] == "mine\n", "a pull replaced an ignored file's edit")
            // Across a crash the edit stays parked and kept.
            _ = try await a.restart(crash: true)
            try await Self.until("a online again") { a.status("connection") == "online" }
            try await Self.until("a parks its edit again") { a.engine.itemStatus(id) == .localOnly }
            #expect(await a.tree()?["t.tmp"] == "mine\n", "a pull replaced an ignored file's edit after a restart")
            // The rule goes: a's edit goes up on its base, beside the other (a conflict, both kept).
            guard let rulesName = a.fs.localState(rules)?.name else { throw SimFailure("a has no rules file") }
            try a.fs.unlink(parent: .root, name: rulesName)
            if let why = await sim.settle([a, b], client: client, within: .seconds(30)) { throw SimFailure("did not settle: \(why)") }
            let versions = try await client.versions("docs", id)
            let contents = try await versions.asyncMap { v in
                String(decoding: try await v.state.chunks.asyncMap { try await client.getChunk($0.hash) }.flatMap { $0 }, as: UTF8.self)
            }
            #expect(contents.contains("mine\n") && contents.contains("theirs\n"), "versions on the server: \(contents)")
        }
    }

    /// `rm -r` of a folder holding a synced file ignored here since: the folder's delete goes
    /// (the ignored file's own parked delete does not hold it back), and the server's folder
    /// delete takes the file with it, as it went here.
    @Test func aFolderDeleteIsNotHeldBackByAnIgnoredItemInIt() async throws {
        try await RecoveryTests.twoDevices { a, b, client, sim in
            let folder = try a.fs.mkdir(parent: .root, name: "d", mode: 0o755, caller: .process)
            a.fs.forget(node: folder.node, count: 1)
            _ = try a.writeFile(node: nil, parent: folder.node, name: "x.log", content: "log\n")
            _ = try a.writeFile(node: nil, parent: folder.node, name: "keep.txt", content: "keep\n")
            if let why = await sim.settle([a, b], client: client, within: .seconds(30)) { throw SimFailure("did not settle: \(why)") }
            _ = try a.writeFile(node: nil, parent: NodeID.root, name: ".nimbusignore", content: "*.log\n")
            if let why = await sim.settle([a, b], client: client, within: .seconds(30)) { throw SimFailure("did not settle: \(why)") }
            try a.fs.unlink(parent: folder.node, name: "x.log")
            try a.fs.unlink(parent: folder.node, name: "keep.txt")
            try a.fs.rmdir(parent: .root, name: "d")
            try await Self.until("the folder's delete reaches b") { await b.tree().map { $0["d"] == nil } == true }
            #expect(await b.tree()?["d/x.log"] == nil)
        }
    }

    static func until(_ what: String, within limit: Duration = .seconds(20), _ check: () async -> Bool) async throws {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if await check() { return }
            try await Task.sleep(for: .milliseconds(20))
        }
        throw SimFailure("\(what): not within \(limit)")
    }
}

extension Array {
    func asyncMap<T>(_ f: (Element) async throws -> T) async rethrows -> [T] {
        var out: [T] = []
        for e in self { out.append(try await f(e)) }
        return out
    }
}
