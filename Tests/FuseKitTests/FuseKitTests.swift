import FuseKit
import Glibc
import Testing

@Suite struct FuseKitTests {
    @Test func errnoNamesTheSystemError() {
        #expect(Errno.ENOENT.rawValue == ENOENT)
        #expect(Errno.ENOENT.description.contains("No such file"))
        #expect(Errno(EPERM) == .EPERM)
    }

    @Test func renameFlagsMatchRenameat2() {
        #expect(RenameFlags.noReplace.rawValue == 1)  // RENAME_NOREPLACE
        #expect(RenameFlags.exchange.rawValue == 2)   // RENAME_EXCHANGE
        #expect(RenameFlags.whiteout.rawValue == 4)   // RENAME_WHITEOUT
    }

    @Test func openRepliesDefaultToKeepingThePageCache() {
        let o = FuseOpen(handle: HandleID(rawValue: 7))
        #expect(o.keepCache && !o.directIO)
    }

    @Test func nodeIdsAreTheKernelsNumbers() {
        #expect(NodeID.root.rawValue == 1)  // FUSE_ROOT_ID
        #expect(NodeID.absent.rawValue == 0)  // a negative entry (fuse_entry_param.ino 0)
        #expect(NodeID.root.successor == NodeID(rawValue: 2))
        #expect(NodeID.absent < .root && HandleID.absent < HandleID.absent.successor)
        #expect(NodeID(rawValue: 16).description == "16")
        var st = stat()
        st.node = NodeID(rawValue: 1 << 48)
        #expect(st.st_ino == 1 << 48 && st.node == NodeID(rawValue: 1 << 48))
    }
}
