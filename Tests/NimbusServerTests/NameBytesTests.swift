import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Testing

/// Names are bytes (docs/protocol.md "Names"): two spellings of one word in different Unicode
/// normal forms are two names, and the control folder's name at the top of a container is no
/// item's.
@Suite struct NameBytesTests {
    static let container = "com.example.names"
    static let nfc = "caf\u{E9}.txt"          // é precomposed
    static let nfd = "cafe\u{301}.txt"        // e + combining acute

    static func draft(_ name: String, parent: ItemID = .root) throws -> ItemDraft {
        ItemDraft(kind: .file, parent: parent, name: try ItemName(name), mode: 0o644, modified: 1)
    }

    @Test func itemNamesCompareByBytes() throws {
        #expect(Self.nfc == Self.nfd, "Swift's String calls them equal (the trap)")
        #expect(try ItemName(Self.nfc) != ItemName(Self.nfd))
        #expect(Set([try ItemName(Self.nfc), try ItemName(Self.nfd)]).count == 2)
        #expect(!ItemName.same(Self.nfc, Self.nfd) && ItemName.same(Self.nfc, "caf\u{E9}.txt"))
    }

    @Test func nfcAndNfdSpellingsAreTwoItemsNotARename() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await c.createContainer(Self.container)
            let a = try await c.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: try Self.draft(Self.nfc)))
            let b = try await c.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: try Self.draft(Self.nfd)))
            #expect(!a.renamed && !b.renamed, "neither name is taken by the other")
            #expect(Array(a.item.name.value.utf8) == Array(Self.nfc.utf8))
            #expect(Array(b.item.name.value.utf8) == Array(Self.nfd.utf8))
            let names = try await c.items(Self.container).items.map { Array($0.name.value.utf8) }
            #expect(names.contains(Array(Self.nfc.utf8)) && names.contains(Array(Self.nfd.utf8)))
        }
    }

    @Test func theControlFolderNameIsReservedAtTheTop() async throws {
        try await LiveServer.with { s in
            let c = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await c.createContainer(Self.container)
            let path = "/v1/containers/\(Self.container)/commit"
            let id = ItemID(UUID())
            let body = "{\"item\":\"\(id)\",\"state\":{\"kind\":\"folder\",\"parent\":\"\(ItemID.root)\",\"name\":\".nimbus\",\"chunks\":[],\"mode\":493,\"modified\":1,\"deleted\":false}}"
            let r = try await c.send(.POST, path, body: ByteBuffer(string: body), contentType: "application/json")
            #expect(r.status == 400 && r.text.contains("invalid_name") && r.text.contains("reserved"), "\(r.status) \(r.text)")
            // A rename into it is refused the same way; below the top the name is an ordinary one.
            let f = try await c.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: try Self.draft("f")))
            var moved = try Self.draft(".nimbus")
            moved.kind = .file
            do {
                _ = try await c.commit(Self.container, CommitRequest(item: f.item.id, baseVersion: f.item.version, state: moved))
                Issue.record("a rename to .nimbus at the top was accepted")
            } catch {
                #expect("\(error)".contains("invalid_name"), "\(error)")
            }
            let folder = try await c.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil,
                                                                          state: ItemDraft(kind: .folder, parent: .root, name: try ItemName("sub"), mode: 0o755, modified: 1)))
            let inner = try await c.commit(Self.container, CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: try Self.draft(".nimbus", parent: folder.item.id)))
            #expect(inner.item.name.value == ".nimbus")
        }
    }
}
