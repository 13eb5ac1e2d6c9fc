import NimbusCore
import SyncCore
import Testing

/// The tree's rules for server states it shows where this device holds what the server does not
/// know (ShowRules, XattrRules.shown): every row, and what each mutation breaks.
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
        #expect(XattrRules.shown(remote, here: here, isSymlink: false, onItsWay: [], sent: nil) == remote)
        #expect(XattrRules.shown(here, here: here, isSymlink: false, onItsWay: [], sent: nil) == nil, "the same")
        #expect(XattrRules.shown(remote, here: here, isSymlink: true, onItsWay: [], sent: nil) == nil)
        #expect(XattrRules.shown(remote, here: here, isSymlink: false, onItsWay: ["user.a"], sent: nil) == nil, "a setxattr on its way")
        #expect(XattrRules.shown(remote, here: here, isSymlink: false, onItsWay: [], sent: [:]) == nil, "changed since the commit")
        #expect(XattrRules.shown(remote, here: here, isSymlink: false, onItsWay: [], sent: here) == remote, "as the commit sent them")
        let over: [String: [UInt8]] = ["user.big": [UInt8](repeating: 0, count: UserXattrs.budget + 1)]
        #expect(XattrRules.shown(remote, here: over, isSymlink: false, onItsWay: [], sent: nil) == nil, "past the budget: stays here")
    }

    /// A change here holds back only its own name: every other name takes the server's value, for
    /// the item's base moves to that state and the next commit drafts against it.
    @Test func attributesSetElsewhereAreShownBesideOnesChangedHere() {
        // Here: user.mine set (its notice on its way); the server: user.theirs set elsewhere.
        let here: [String: [UInt8]] = ["user.mine": [1], "user.old": [7]]
        let remote: [String: [UInt8]] = ["user.theirs": [2], "user.old": [8]]
        #expect(XattrRules.shown(remote, here: here, isSymlink: false, onItsWay: ["user.mine"], sent: nil)
                == ["user.mine": [1], "user.theirs": [2], "user.old": [8]])
        // A removal here on its way stays a removal.
        #expect(XattrRules.shown(["user.gone": [3], "user.theirs": [2]], here: [:], isSymlink: false, onItsWay: ["user.gone"], sent: nil)
                == ["user.theirs": [2]])
        // Changed since the commit this state answers: sent user.mine=1, now 5 here; the answer
        // brings user.theirs merged in by the server.
        #expect(XattrRules.shown(["user.mine": [1], "user.theirs": [2]], here: ["user.mine": [5]], isSymlink: false, onItsWay: [],
                                 sent: ["user.mine": [1]]) == ["user.mine": [5], "user.theirs": [2]])
        // Only the name changed here differs: nothing to show.
        #expect(XattrRules.shown(["user.mine": [2]], here: ["user.mine": [1]], isSymlink: false, onItsWay: ["user.mine"], sent: nil) == nil)
        // The merge would pass the budget: stays as it is.
        let big = [UInt8](repeating: 0, count: UserXattrs.budget / 2)
        #expect(XattrRules.shown(["user.theirs": big], here: ["user.mine": big], isSymlink: false, onItsWay: ["user.mine"], sent: nil) == nil)
    }
}
