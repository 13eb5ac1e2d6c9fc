import NimbusCore

// What the tree does with a server state it is asked to show where this device holds something
// the server does not know: a local-only or ignored item at the state's name, a file with several
// names here (hard links), user attributes changed here. The tree (ContainerFS) gathers the facts
// under its lock and does what these say. Pure.

public enum ShowRules {
    /// A server item wants a name an item of this device holds.
    public enum TakenName: Sendable, Equatable {
        /// It takes the name the server gives any taken name (`NAME 2.EXT`), and that rename is
        /// pushed like one made here: the item here keeps its name, every device shows the same.
        case besideIt
        /// It waits for the name (an item not uploaded yet holds it: the server renames one of
        /// the two when it comes, or a move in the same batch frees it).
        case waitForName
    }

    /// `occupantLocalOnly`: a FIFO, socket or device node, which the server never hears of;
    /// `occupantIgnored`: an item a `.nimbusignore` keeps here. Either holds the name for good.
    public static func takenName(occupantLocalOnly: Bool, occupantIgnored: Bool) -> TakenName {
        guard occupantLocalOnly || occupantIgnored, !Mutation.remoteWaitsBehindLocalOnly.isOn else { return .waitForName }
        return .besideIt
    }

    /// A server state of one name of a file hard-linked here (docs/posix.md "Hard links").
    public enum LinkedName: Sendable, Equatable {
        /// A commit's answer holding what the commit sent (the file's own state): nothing to show.
        case nothingToShow
        /// New content while the file is written here, or changed with its notice on its way:
        /// not shown now (the local change goes up first).
        case wait
        /// Another device's change of that name: the name leaves the inode for one of its own,
        /// with a copy of the bytes when the state keeps them, and then the state is shown on it.
        /// The other names keep their content, place and attributes.
        case takeOff(copyContent: Bool)
        /// Shown on the shared inode (only under the mutation `linked-name-shown-in-place`).
        case showOnInode
    }

    /// What a commit's answer holds against what the commit sent.
    public struct Answer: Sendable, Equatable {
        /// The place (folder, name) is the one the commit sent (else the server chose another:
        /// the name was taken there).
        public var placeAsSent: Bool
        /// The attributes are the ones the commit sent, or the answer says nothing of them (else
        /// the server merged others set elsewhere).
        public var xattrsAsSent: Bool
        public init(placeAsSent: Bool, xattrsAsSent: Bool) {
            self.placeAsSent = placeAsSent
            self.xattrsAsSent = xattrsAsSent
        }
    }

    /// `answer`: the state answers a commit of this device (nil: another device's, pulled);
    /// `resetsContent`: it brings other content; `heldHere`: the file is being written here or
    /// has a change the engine has not heard of yet.
    public static func linkedName(answer: Answer?, resetsContent: Bool, heldHere: Bool) -> LinkedName {
        if Mutation.linkedNameShownInPlace.isOn { return .showOnInode }
        if let answer, !resetsContent, answer.placeAsSent, answer.xattrsAsSent { return .nothingToShow }
        if resetsContent && heldHere { return .wait }
        return .takeOff(copyContent: !resetsContent)
    }
}
