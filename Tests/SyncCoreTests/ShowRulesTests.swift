import NimbusCore
import SyncCore
import Testing

/// The tree's rules for server states it shows where this device holds what the server does not
/// know (ShowRules, XattrRules.showRemote): every row, and what each mutation breaks.
@Suite struct ShowRulesTests {
    @Test func aNameHeldForGoodByAnItemHereIsTakenBesideIt() {
        #expect(ShowRules.takenName(occupantLocalOnly: true, occupantIgnored: false) == .besideIt)
        #expect(ShowRules.takenName(occupantLocalOnly: false, occupantIgnored: true) == .besideIt)
        // An item not uploaded yet: the server renames one of the two when it comes.
        #expect(ShowRules.takenName(occupantLocalOnly: false, occupantIgnored: false) == .waitForName)
    }

    /// (answer, new content, held here) → what the tree does with one name of a linked file.
    @Test(arguments: [
        (ShowRules.Answer(placeAsSent: true, xattrsAsSent: true), false, false, ShowRules.LinkedName.nothingToShow),
        (ShowRules.Answer(placeAsSent: true, xattrsAsSent: true), false, true, .nothingToShow),
        // The server put the name elsewhere (taken there), or merged attributes set elsewhere.
        (ShowRules.Answer(placeAsSent: false, xattrsAsSent: true), false, false, .takeOff(copyContent: true)),
        (ShowRules.Answer(placeAsSent: true, xattrsAsSent: false), false, false, .takeOff(copyContent: true)),
        // An answer with other content (the server's, after a conflict): as another device's.
        (ShowRules.Answer(placeAsSent: true, xattrsAsSent: true), true, false, .takeOff(copyContent: false)),
    ])
    func aCommitsAnswerChangesALinkedNameOnlyWhenItHoldsMoreThanWasSent(_ answer: ShowRules.Answer, _ resets: Bool, _ held: Bool,
                                                                        _ expected: ShowRules.LinkedName) {
        #expect(ShowRules.linkedName(answer: answer, resetsContent: resets, heldHere: held) == expected)
    }

    @Test func anotherDevicesStateTakesTheNameOffTheInodeUnlessALocalChangeGoesFirst() {
        #expect(ShowRules.linkedName(answer: nil, resetsContent: false, heldHere: false) == .takeOff(copyContent: true))
        #expect(ShowRules.linkedName(answer: nil, resetsContent: false, heldHere: true) == .takeOff(copyContent: true),
                "a rename or chmod elsewhere keeps the bytes: the writer goes on with the other names")
        #expect(ShowRules.linkedName(answer: nil, resetsContent: true, heldHere: false) == .takeOff(copyContent: false))
        #expect(ShowRules.linkedName(answer: nil, resetsContent: true, heldHere: true) == .wait)
    }

    @Test func remoteAttributesNeverReplaceOnesChangedHere() {
        let here: [String: [UInt8]] = ["user.a": [1]], remote: [String: [UInt8]] = ["user.a": [2]]
        #expect(XattrRules.showRemote(remote, here: here, isSymlink: false, changeOnItsWay: false, sent: nil))
        #expect(!XattrRules.showRemote(here, here: here, isSymlink: false, changeOnItsWay: false, sent: nil), "the same")
        #expect(!XattrRules.showRemote(remote, here: here, isSymlink: true, changeOnItsWay: false, sent: nil))
        #expect(!XattrRules.showRemote(remote, here: here, isSymlink: false, changeOnItsWay: true, sent: nil), "a setxattr on its way")
        #expect(!XattrRules.showRemote(remote, here: here, isSymlink: false, changeOnItsWay: false, sent: [:]), "changed since the commit")
        #expect(XattrRules.showRemote(remote, here: here, isSymlink: false, changeOnItsWay: false, sent: here), "as the commit sent them")
        let over: [String: [UInt8]] = ["user.big": [UInt8](repeating: 0, count: UserXattrs.budget + 1)]
        #expect(!XattrRules.showRemote(remote, here: over, isSymlink: false, changeOnItsWay: false, sent: nil), "past the budget: stays here")
    }
}
