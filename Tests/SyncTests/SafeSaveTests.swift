import Foundation
import Glibc
import NimbusTesting
import Testing

/// Editors' safe saves keep the item (docs/sync.md "Safe saves"): the same
/// `user.nimbus.itemid`, the version history and the pin on both devices; the other device sees
/// an update of the item, not a delete and a create.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct SafeSaveTests {
    static func itemid(_ path: String) throws -> String {
        try sh("getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(path))")
    }

    /// The number of versions the server keeps of `id` (current and previous).
    static func versions(_ w: SyncWorld, _ id: String) throws -> Int {
        let json = try sh("curl -s --max-time 5 -H \"Authorization: Bearer $(cat \(q(w.base))/a.token)\" \(w.server.url)/v1/containers/docs/items/\(id)/versions")
        let obj = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any]
        return (obj?["versions"] as? [Any])?.count ?? -1
    }

    @Test func libreOfficeAndVimSavesKeepTheItem() async throws {
        try await SyncWorld.run("safesave") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf 'v1\\n' > \(q(a))/doc.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/doc.txt)\" = v1")
            let id = try Self.itemid(a + "/doc.txt")
            #expect(try Self.itemid(b + "/doc.txt") == id)
            try sh("setfattr -n user.nimbus.pinned -v 1 \(q(a))/doc.txt")

            // LibreOffice-style: write a temporary file, fsync, rename it over the document.
            try sh("cd \(q(a)) && python3 -c 'import os; fd=os.open(\"lu4711.tmp\", os.O_WRONLY|os.O_CREAT, 0o644); os.write(fd, b\"v2\\n\"); os.fsync(fd); os.close(fd); os.rename(\"lu4711.tmp\", \"doc.txt\")'")
            #expect(try Self.itemid(a + "/doc.txt") == id, "the rename-over kept the item on A")
            try await eventually("v2 on B", "test \"$(cat \(q(b))/doc.txt)\" = v2")
            #expect(try Self.itemid(b + "/doc.txt") == id, "B sees an update of the same item")
            try await eventually("no temporary file on B", "! test -e \(q(b))/lu4711.tmp")
            #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.pinned \(q(a))/doc.txt") == "1")

            // vim-style (`backupcopy=no`, the system calls vim makes: rename the document to a
            // backup name, write the new text to a new file under its name, fsync, close, delete
            // the backup). The vim installed here writes in place in batch mode, so the sequence
            // is replayed directly.
            try sh("cd \(q(a)) && python3 -c 'import os; os.rename(\"doc.txt\", \"doc.txt~\"); fd=os.open(\"doc.txt\", os.O_WRONLY|os.O_CREAT|os.O_TRUNC, 0o644); os.write(fd, b\"v3\\n\"); os.fsync(fd); os.close(fd); os.unlink(\"doc.txt~\")'")
            #expect(try sh("cat \(q(a))/doc.txt") == "v3\n")
            #expect(try Self.itemid(a + "/doc.txt") == id, "vim's save kept the item on A")
            try await eventually("v3 on B", "test \"$(cat \(q(b))/doc.txt)\" = v3")
            #expect(try Self.itemid(b + "/doc.txt") == id, "B sees an update of the same item after vim's save")
            try await eventually("no backup on B", "! test -e \(q(b))/doc.txt~")
            try await eventually("three versions on the server", "test \"$(curl -s -H \"Authorization: Bearer $(cat \(q(w.base))/a.token)\" \(w.server.url)/v1/containers/docs/items/\(id)/versions | grep -o '\"version\"' | wc -l)\" -ge 3")
            #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.pinned \(q(a))/doc.txt") == "1", "the pin stayed")
            #expect(try Self.versions(w, id) >= 3)

            // The same save with the new file still open when the backup goes: the kernel sends
            // RELEASE after close(2) returns, so an editor's unlink can reach the daemon first.
            try sh("cd \(q(a)) && python3 -c 'import os; os.rename(\"doc.txt\", \"doc.txt~\"); fd=os.open(\"doc.txt\", os.O_WRONLY|os.O_CREAT|os.O_TRUNC, 0o644); os.write(fd, b\"v4\\n\"); os.fsync(fd); os.unlink(\"doc.txt~\"); os.write(fd, b\"v4 more\\n\"); os.close(fd)'")
            #expect(try Self.itemid(a + "/doc.txt") == id, "a save whose file is still open when the backup goes kept the item")
            try await eventually("v4 on B", "test \"$(cat \(q(b))/doc.txt)\" = \"$(printf 'v4\\nv4 more')\"")
            #expect(try Self.itemid(b + "/doc.txt") == id, "B sees an update of the same item after the open save")
            #expect(try sh("getfattr --absolute-names --only-values -n user.nimbus.pinned \(q(a))/doc.txt") == "1", "the pin stayed")

            // A plain `mv` of one document over another still shows the moved content under the
            // target's name on both devices, and the moved name is gone.
            try sh("printf other > \(q(a))/other.txt")
            try await eventually("other on B", "test -e \(q(b))/other.txt")
            try sh("mv \(q(a))/other.txt \(q(a))/doc.txt")
            try await eventually("mv over on B", "test \"$(cat \(q(b))/doc.txt)\" = other && ! test -e \(q(b))/other.txt")
        }
    }
}
