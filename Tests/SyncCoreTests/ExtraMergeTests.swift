import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

/// `extra` and the user attributes in it: how a commit carries them (`XattrRules`,
/// `SyncedXattrs`) and how the server merges them (`ExtraMerge`).
@Suite struct ExtraMergeTests {
    static func x(_ pairs: [String: String], note: String? = nil) -> String {
        var o: [String: JSONValue] = ["xattrs": .object(pairs.mapValues { .string(Data($0.utf8).base64EncodedString()) })]
        if let note { o["note"] = .string(note) }
        return JSONValue.object(o).serialized()
    }

    @Test(arguments: [
        // base, current, incoming → merged
        (x(["user.a": "1"]), x(["user.a": "1", "user.b": "2"]), x(["user.a": "1", "user.c": "3"]), x(["user.a": "1", "user.b": "2", "user.c": "3"])),
        // The same name on both: the committer's.
        (x(["user.a": "1"]), x(["user.a": "2"]), x(["user.a": "3"]), x(["user.a": "3"])),
        // Removed by the committer: gone; set elsewhere meanwhile: kept.
        (x(["user.a": "1"]), x(["user.a": "1", "user.b": "2"]), x([:]), x(["user.b": "2"])),
        // Untouched by the committer: the current value stays (another field changed).
        (x(["user.a": "1"], note: "old"), x(["user.a": "9"], note: "old"), x(["user.a": "1"], note: "new"), x(["user.a": "9"], note: "new")),
        // A commit with no extra at all over a base that had attributes: they count as emptied.
        (x(["user.a": "1"]), x(["user.a": "1", "user.b": "2"]), nil, x(["user.b": "2"])),
    ] as [(String?, String?, String?, String?)])
    func fieldByFieldAndNameByName(_ base: String?, _ current: String?, _ incoming: String?, _ merged: String?) {
        let got = ExtraMerge.threeWay(base: base, current: current, incoming: incoming)
        #expect(got.flatMap(JSONValue.parse) == merged.flatMap(JSONValue.parse))
    }

    @Test func aCommitCarriesTheItemsAttributesOverItsBasesOtherFields() {
        let base = JSONValue.parse(Self.x(["user.old": "1"], note: "kept"))
        let draft = XattrRules.draftExtra(base: base, here: ["user.tag": [0, 255], "user.nimbus.status": [1]])
        #expect(SyncedXattrs.of(draft) == ["user.tag": [0, 255]])
        guard case .object(let o)? = draft else { Issue.record("not an object"); return }
        #expect(o["note"] == .string("kept"))
        // None here, none in the base: the base as it was (nothing to send for it).
        #expect(XattrRules.draftExtra(base: nil, here: [:]) == nil)
        // None here but some in the base: `{}` says they were removed.
        #expect(SyncedXattrs.of(XattrRules.draftExtra(base: base, here: [:])) == [:])
        // Over the budget (set before it held): the base's, untouched.
        let big = [UInt8](repeating: 1, count: UserXattrs.budget)
        #expect(XattrRules.draftExtra(base: base, here: ["user.big": big]) == base)
    }

    @Test func malformedEntriesAreLeftOut() {
        let extra = JSONValue.parse(#"{"xattrs":{"user.ok":"AQ==","user.nimbus.x":"AQ==","security.y":"AQ==","user.bad":"***","user.num":5,"user.a\u0000b":"AQ=="}}"#)
        #expect(SyncedXattrs.of(extra) == ["user.ok": [1]])
        #expect(SyncedXattrs.of(JSONValue.parse(#"{"other":1}"#)) == nil)
    }
}

/// The budget keeps every item's attributes inside what the server takes as `extra`, whatever the
/// mix of names and values.
@Suite struct XattrBudgetTests {
    @Test(arguments: [0, 1, 2, 16, 200])
    func attributesAtTheBudgetFitTheServersExtra(_ valueBytes: Int) throws {
        var xattrs: [String: [UInt8]] = [:]
        var i = 0
        while true {
            let name = "user.\(i)"
            let next = UserXattrs.size(xattrs) + name.utf8.count + valueBytes
            if next > UserXattrs.budget { break }
            xattrs[name] = [UInt8](repeating: 0xff, count: valueBytes)
            i += 1
        }
        if valueBytes > 0, UserXattrs.size(xattrs) < UserXattrs.budget - 8 { xattrs["user.rest"] = [UInt8](repeating: 0xff, count: UserXattrs.budget - UserXattrs.size(xattrs) - 9) }
        let extra = try #require(XattrRules.draftExtra(base: nil, here: xattrs))
        try extra.checkAsExtra()
        #expect(SyncedXattrs.of(extra) == xattrs)
    }
}
