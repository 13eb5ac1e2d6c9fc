import Foundation
import Glibc
import NimbusTesting
import Testing

/// A machine enrolled with a pairing code mounts with nothing but its state directory, and a
/// device revoked from another device's command line keeps every change and says why.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct PairedMountTests {
    @Test func aPairedMachineSyncsAndARevokeFromAnotherDeviceLosesNothing() async throws {
        try await SyncWorld.run("paired") { w in
            let a = try await w.mount("a")
            let bin = q(NimbusBinary.path)
            let asA = "--server \(w.server.url) --token-file \(q(w.base + "/a.token"))"
            let code = try sh("\(bin) device add laptop \(asA) 2>/dev/null").trimmingCharacters(in: .whitespacesAndNewlines)
            let state = w.base + "/laptop-state", mp = w.base + "/laptop"
            try sh("\(bin) login \(w.server.url) --code \(code) --state \(q(state)) && mkdir -p \(q(mp))")
            defer { _ = shStatus("\(bin) unmount \(q(mp)) 2>/dev/null || fusermount3 -uz \(q(mp)) 2>/dev/null") }
            // No --server, no token on the command line: the state has them.
            try sh("\(bin) mount \(q(mp)) --state \(q(state)) --container docs")
            try sh("printf 'from the laptop' > \(q(mp))/l.txt")
            try await eventually("the laptop's file on a", "test \"$(cat \(q(a))/l.txt)\" = 'from the laptop'")

            // Lost laptop: revoked from device a.
            try sh("\(bin) device revoke laptop \(asA)")
            usleep(1_200_000)
            try sh("printf 'written after the revoke' > \(q(mp))/l.txt && printf kept > \(q(mp))/new.txt")
            try await eventually("the laptop says why it is offline", seconds: 40, "grep -q '^connection: unauthorized' \(q(mp))/.nimbus/status")
            let error = try sh("getfattr --absolute-names -n user.nimbus.error --only-values \(q(mp))/new.txt")
            #expect(error.contains("refused this device's token") && error.contains("the change is kept"), "\(error)")
            #expect(try sh("cat \(q(mp))/l.txt") == "written after the revoke", "nothing lost on the laptop")
            #expect(try sh("cat \(q(a))/l.txt") == "from the laptop", "nothing of the revoked device reached a")
            #expect(!FileManager.default.fileExists(atPath: a + "/new.txt"))
        }
    }
}
