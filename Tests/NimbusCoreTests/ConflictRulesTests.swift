import Foundation
import Testing
@testable import NimbusCore

/// Table tests of the race rules. The key property: two devices that start from the same base and
/// commit concurrently end in the same place whichever commit reaches the server first.
@Suite struct ConflictRulesTests {
    static let devA = DeviceID(UUID(uuidString: "00000000-0000-0000-0000-00000000000a")!)
    static let devB = DeviceID(UUID(uuidString: "00000000-0000-0000-0000-00000000000b")!)
    static let folder1 = ItemID(UUID())
    static let folder2 = ItemID(UUID())

    static func content(_ tag: String) -> ItemContent {
        ItemContent(chunks: [ChunkRef(hash: ContentHash(hex: String(repeating: tag, count: 64))!, size: 10)])
    }

    static func state(_ c: String = "0", name: String = "doc.txt", parent: ItemID = .root, mode: UInt32 = 0o644,
                      t: Int64 = 100, by: DeviceID = devA, deleted: Bool = false) -> ItemState {
        ItemState(kind: .file, location: ItemLocation(parent: parent, name: ItemName(trusted: name)), content: content(c),
                  mode: mode, modified: t, modifiedBy: by, deleted: deleted)
    }

    /// Applies e1 then e2 (both based on `base`) and returns (current, conflicts).
    static func run(_ base: ItemState, _ e1: ItemState, _ e2: ItemState) -> (ItemState, [ItemState]) {
        var current = base
        var conflicts: [ItemState] = []
        for (i, e) in [e1, e2].enumerated() {
            switch ConflictRules.decide(base: base, current: current, incoming: e, baseIsCurrent: i == 0) {
            case .unchanged, .deleteLost: break
            case .apply(let s): current = s
            case .conflict(let cur, let conf):
                current = cur
                conflicts.append(conf)
            }
        }
        return (current, conflicts)
    }

    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var e1: ItemState
        var e2: ItemState
        /// Expected final content tag, deleted flag, and the content tags of conflict versions.
        var content: String
        var deleted: Bool
        var conflicts: [String]
        var testDescription: String { name }
    }

    static let base = state("0")
    static let cases: [Case] = [
        Case(name: "two edits: the later mtime wins, the other is a conflict version",
             e1: state("1", t: 200, by: devA), e2: state("2", t: 300, by: devB), content: "2", deleted: false, conflicts: ["1"]),
        Case(name: "two edits at the same time: the larger device id wins",
             e1: state("1", t: 200, by: devA), e2: state("2", t: 200, by: devB), content: "2", deleted: false, conflicts: ["1"]),
        Case(name: "two identical edits: no conflict",
             e1: state("3", t: 200, by: devA), e2: state("3", t: 250, by: devB), content: "3", deleted: false, conflicts: []),
        Case(name: "edit vs delete: the edit wins",
             e1: state("1", t: 200, by: devA), e2: state("0", t: 300, by: devB, deleted: true), content: "1", deleted: false, conflicts: []),
        Case(name: "rename vs edit: both apply",
             e1: state("0", name: "renamed.txt", t: 100, by: devA), e2: state("5", t: 300, by: devB), content: "5", deleted: false, conflicts: []),
        Case(name: "rename vs delete: the delete applies",
             e1: state("0", name: "renamed.txt", by: devA), e2: state("0", by: devB, deleted: true), content: "0", deleted: true, conflicts: []),
        Case(name: "chmod vs edit: both apply",
             e1: state("0", mode: 0o600, by: devA), e2: state("7", t: 400, by: devB), content: "7", deleted: false, conflicts: []),
        Case(name: "delete vs delete",
             e1: state("0", by: devA, deleted: true), e2: state("0", by: devB, deleted: true), content: "0", deleted: true, conflicts: []),
    ]

    @Test(arguments: cases)
    func symmetric(_ c: Case) {
        for (first, second) in [(c.e1, c.e2), (c.e2, c.e1)] {
            let (current, conflicts) = Self.run(Self.base, first, second)
            #expect(current.content == Self.content(c.content), "order \(first.modifiedBy) first")
            #expect(current.deleted == c.deleted)
            #expect(conflicts.map(\.content).sorted { $0.chunks[0].hash < $1.chunks[0].hash } == c.conflicts.map(Self.content))
        }
    }

    @Test func renameAndEditKeepBoth() {
        let (current, _) = Self.run(Self.base, Self.state("0", name: "renamed.txt"), Self.state("5", t: 300, by: Self.devB))
        #expect(current.location.name.value == "renamed.txt")
        #expect(current.content == Self.content("5"))
    }

    @Test func conflictLoserKeepsItsContentAndTime() {
        let loser = Self.state("1", t: 200, by: Self.devA)
        let winner = Self.state("2", t: 300, by: Self.devB)
        guard case .conflict(let cur, let conf) = ConflictRules.decide(base: Self.base, current: loser, incoming: winner, baseIsCurrent: false) else {
            Issue.record("expected a conflict")
            return
        }
        #expect(cur.content == winner.content && cur.modifiedBy == Self.devB)
        #expect(conf.content == loser.content && conf.modified == 200 && conf.modifiedBy == Self.devA)
    }

    @Test func unknownBaseMakesEveryContentDifferenceAConflict() {
        let current = Self.state("1", t: 200)
        let incoming = Self.state("2", t: 100, by: Self.devB)
        guard case .conflict(let cur, _) = ConflictRules.decide(base: nil, current: current, incoming: incoming, baseIsCurrent: false) else {
            Issue.record("expected a conflict")
            return
        }
        #expect(cur.content == current.content)
        #expect(ConflictRules.decide(base: nil, current: current, incoming: Self.state("1", t: 200, deleted: true), baseIsCurrent: false) == .deleteLost)
    }

    @Test func editOfDeletedItemRevivesIt() {
        let deleted = Self.state("0", deleted: true)
        #expect(ConflictRules.decide(base: Self.base, current: deleted, incoming: Self.state("9", t: 500), baseIsCurrent: false)
                == .apply(Self.state("9", t: 500)))
        // A rename of a deleted item does not bring it back.
        #expect(ConflictRules.decide(base: Self.base, current: deleted, incoming: Self.state("0", name: "x"), baseIsCurrent: false) == .unchanged)
    }

    /// A place the device did not choose (the name beside a local-only item of its own) applies
    /// only if no one moved the item since the base; its content edit applies either way.
    @Test func aPlaceIfUnmovedNeverUndoesAMoveMadeElsewhere() {
        let movedElsewhere = Self.state("0", name: "c.txt", t: 100)
        let beside = Self.state("0", name: "doc 2.txt", t: 100)
        #expect(ConflictRules.decide(base: Self.base, current: movedElsewhere, incoming: beside, baseIsCurrent: false, placeIfUnmoved: true) == .unchanged)
        #expect(ConflictRules.decide(base: Self.base, current: movedElsewhere, incoming: beside, baseIsCurrent: false) == .apply(beside))
        // Not moved since the base (an edit elsewhere): the place applies, with the edit kept.
        let edited = Self.state("5", t: 300)
        guard case .apply(let s) = ConflictRules.decide(base: Self.base, current: edited, incoming: beside, baseIsCurrent: false, placeIfUnmoved: true) else {
            Issue.record("expected the place to apply")
            return
        }
        #expect(s.location.name.value == "doc 2.txt" && s.content == edited.content)
        // With an edit of its own: the content goes in where the item is now.
        let besideEdited = Self.state("7", name: "doc 2.txt", t: 400)
        guard case .apply(let t) = ConflictRules.decide(base: Self.base, current: movedElsewhere, incoming: besideEdited, baseIsCurrent: false, placeIfUnmoved: true) else {
            Issue.record("expected the edit to apply")
            return
        }
        #expect(t.location.name.value == "c.txt" && t.content == besideEdited.content)
    }

    @Test func freshBaseApplies() {
        #expect(ConflictRules.decide(base: Self.base, current: Self.base, incoming: Self.base, baseIsCurrent: true) == .unchanged)
        let e = Self.state("4", t: 1)
        #expect(ConflictRules.decide(base: Self.base, current: Self.base, incoming: e, baseIsCurrent: true) == .apply(e))
    }

    @Test func cycles() {
        // root ← a ← b ← c
        let a = ItemID(UUID()), b = ItemID(UUID()), c = ItemID(UUID())
        let parents: [ItemID: ItemID] = [a: .root, b: a, c: b]
        #expect(ConflictRules.wouldCreateCycle(moving: a, into: c) { parents[$0] })
        #expect(ConflictRules.wouldCreateCycle(moving: a, into: a) { parents[$0] })
        #expect(!ConflictRules.wouldCreateCycle(moving: c, into: a) { parents[$0] })
        #expect(!ConflictRules.wouldCreateCycle(moving: b, into: .root) { parents[$0] })
        // A corrupt loop that does not involve the mover is cut off by the depth bound.
        let x = ItemID(UUID()), y = ItemID(UUID())
        let loop: [ItemID: ItemID] = [x: y, y: x]
        #expect(ConflictRules.wouldCreateCycle(moving: a, into: x, maxDepth: 100) { loop[$0] })
    }
}

@Suite struct ItemNameTests {
    @Test(arguments: [
        ("", ItemName.Problem.empty), (".", .dot), ("..", .dotDot), ("a/b", .slash), ("a\u{0}b", .nul),
        (String(repeating: "é", count: 128), .tooLong(bytes: 256)),
    ])
    func rejects(_ name: String, _ problem: ItemName.Problem) {
        #expect(ItemName.validate(name) == problem)
        #expect(throws: ItemName.Problem.self) { try ItemName(name) }
    }

    @Test func accepts() throws {
        for n in ["a", "...", ".hidden", "name with spaces", "日本語.txt", String(repeating: "x", count: 255)] {
            #expect(try ItemName(n).value == n)
        }
    }

    @Test func deduplicates() {
        let taken: Set<String> = ["report.txt", "report 2.txt", ".bashrc", "Makefile", "archive.tar.gz"]
        #expect(ItemName(trusted: "report.txt").deduplicated { taken.contains($0) }.value == "report 3.txt")
        #expect(ItemName(trusted: ".bashrc").deduplicated { taken.contains($0) }.value == ".bashrc 2")
        #expect(ItemName(trusted: "Makefile").deduplicated { taken.contains($0) }.value == "Makefile 2")
        #expect(ItemName(trusted: "archive.tar.gz").deduplicated { taken.contains($0) }.value == "archive.tar 2.gz")
        #expect(ItemName(trusted: "free.txt").deduplicated { taken.contains($0) }.value == "free.txt")
        let long = String(repeating: "x", count: 251) + ".txt"
        let d = ItemName(trusted: long).deduplicated { $0 == long }
        #expect(d.value.utf8.count <= 255 && d.value.hasSuffix(" 2.txt"))
    }

    @Test func hashes() {
        #expect(ContentHash(hex: "zz") == nil)
        #expect(ContentHash(hex: String(repeating: "A", count: 64))?.hex == String(repeating: "a", count: 64))
        #expect(ContentHash(digest: [0x00, 0xff, 0x10]).hex == "00ff10")
    }
}
