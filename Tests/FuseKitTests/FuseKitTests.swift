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
        let o = FuseOpen(handle: 7)
        #expect(o.keepCache && !o.directIO)
    }
}
