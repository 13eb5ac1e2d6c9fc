import Foundation
import Glibc
import NimbusKit
import NimbusTesting
import Synchronization
import Testing

/// Presenters over the daemon's socket, through NimbusKit (docs/presenters.md): asked to save
/// before an upload, to relinquish before a remote version replaces the file; the seed's
/// deadlock completes; a presenter that never answers costs at most the bound.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct PresenterTests {
    /// Records what it is told; optionally reads the file under a coordinated read on every
    /// change (the seed's deadlock), or saves text it holds "unsaved" when asked to.
    final class Recorder: FilePresenter {
        let presentedItemURL: URL?
        let readsOnChange: Bool
        let log = Mutex<[String]>([])
        let reads = Mutex<[String]>([])
        let unsaved = Mutex<String?>(nil)

        init(_ path: String, readsOnChange: Bool = false) {
            presentedItemURL = URL(fileURLWithPath: path)
            self.readsOnChange = readsOnChange
        }

        func note(_ s: String) { log.withLock { $0.append(s) } }
        var notes: [String] { log.withLock { $0 } }
        var readTexts: [String] { reads.withLock { $0 } }

        func presentedItemDidChange() {
            note("changed")
            guard readsOnChange, let url = presentedItemURL else { return }
            do {
                let text = try FileCoordinator(filePresenter: self).coordinate(readingItemAt: url, timeout: .seconds(10)) {
                    try String(contentsOf: $0, encoding: .utf8)
                }
                reads.withLock { $0.append(text) }
            } catch {
                reads.withLock { $0.append("ERROR \(error)") }
            }
        }

        func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
            note("relinquish")
            writer { [self] in note("reacquire") }
        }

        func savePresentedItemChanges() throws {
            guard let text = unsaved.withLock({ s -> String? in defer { s = nil }; return s }), let url = presentedItemURL else {
                note("save (nothing)")
                return
            }
            try FileCoordinator(filePresenter: self).coordinate(writingItemAt: url, timeout: .seconds(10)) {
                try text.write(to: $0, atomically: false, encoding: .utf8)
            }
            note("save")
        }

        func presentedItemDidGain(version: Int) { note("version") }
    }

    /// Waits (bounded) until `condition` holds.
    static func until(_ what: String, seconds: Double = 15, _ state: () -> String = { "" }, _ condition: () -> Bool) async throws {
        let deadline = Date().addingTimeInterval(seconds)
        while !condition() {
            if Date() > deadline { throw ShellFailed(description: "\(what): not within \(seconds) s \(state())") }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    @Test func theSeedsDeadlockCompletes() async throws {
        try await SyncWorld.run("presenters") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf v1 > \(q(a))/doc.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/doc.txt)\" = v1")
            // Two presenters of one file that each react to a change by reading it under a claim.
            let p1 = Recorder(b + "/doc.txt", readsOnChange: true), p2 = Recorder(b + "/doc.txt", readsOnChange: true)
            try FileCoordinator.addFilePresenter(p1)
            try FileCoordinator.addFilePresenter(p2)
            defer { FileCoordinator.removeFilePresenter(p1); FileCoordinator.removeFilePresenter(p2) }
            try await eventually("both presenting", "grep -q '^presenters: 2' \(q(b))/.nimbus/status")
            #expect(try sh("cat \(q(b))/.nimbus/claims").contains("presenting /doc.txt by pid \(getpid())"))

            // A remote version: both relinquish, the file is replaced, both reacquire and read it.
            try sh("printf v2 > \(q(a))/doc.txt")
            try await Self.until("both presenters read v2", { "p1 \(p1.notes) read \(p1.readTexts); p2 \(p2.notes) read \(p2.readTexts)" }) {
                p1.readTexts.contains("v2") && p2.readTexts.contains("v2")
            }
            for p in [p1, p2] {
                let n = p.notes
                #expect(n.contains("relinquish") && n.contains("reacquire") && n.contains("version"), "\(n)")
                #expect(!p.readTexts.contains { $0.hasPrefix("ERROR") }, "\(p.readTexts)")
            }

            // A coordinated write by one presenter: the other relinquishes, then reads the result;
            // the writer is not told of its own change.
            let before = p1.readTexts.count
            try FileCoordinator(filePresenter: p1).coordinate(writingItemAt: URL(fileURLWithPath: b + "/doc.txt"), timeout: .seconds(10)) {
                try "v3 from B".write(to: $0, atomically: false, encoding: .utf8)
            }
            try await Self.until("the other presenter read B's write", { "p2 \(p2.notes) read \(p2.readTexts)" }) { p2.readTexts.contains("v3 from B") }
            #expect(p2.notes.filter { $0 == "relinquish" }.count >= 2, "\(p2.notes)")
            try await eventually("B's write on A", "test \"$(cat \(q(a))/doc.txt)\" = 'v3 from B'")
            #expect(!p1.readTexts.dropFirst(before).contains("v3 from B"), "the writer heard of its own write: \(p1.readTexts)")
            #expect(try sh("grep '^presenter-timeouts' \(q(b))/.nimbus/status") == "presenter-timeouts: 0\n")
        }
    }

    @Test func aPresenterIsAskedToSaveBeforeItsFileIsUploaded() async throws {
        try await SyncWorld.run("presenter-save") { w in
            let a = try await w.mount("a"), b = try await w.mount("b")
            try sh("printf 'draft 0' > \(q(a))/notes.txt")
            try await eventually("draft 0 on B", "test \"$(cat \(q(b))/notes.txt)\" = 'draft 0'")
            let editor = Recorder(a + "/notes.txt")
            try FileCoordinator.addFilePresenter(editor)
            defer { FileCoordinator.removeFilePresenter(editor) }
            try await eventually("presenting", "grep -q '^presenters: 1' \(q(a))/.nimbus/status")
            // The editor autosaved "draft 1" and holds "draft 2" unsaved: the upload that the
            // autosave causes asks it to save first, so the server gets draft 2, never draft 1.
            editor.unsaved.withLock { $0 = "draft 2" }
            // (One open, write, close: a shell redirect's extra flush would start the upload
            // before its own write.)
            try sh("python3 -c 'import sys; open(sys.argv[1], \"w\").write(\"draft 1\")' \(q(a))/notes.txt")
            try await eventually("draft 2 on B", "test \"$(cat \(q(b))/notes.txt)\" = 'draft 2'")
            #expect(editor.notes.contains("save"), "\(editor.notes)")
            let id = try sh("getfattr --absolute-names --only-values -n user.nimbus.itemid \(q(a))/notes.txt")
            var contents: [String] = []
            for v in try IntegrityTests.versions(w, id) {
                contents.append(String(decoding: try IntegrityTests.content(w, v), as: UTF8.self))
            }
            #expect(!contents.contains("draft 1"), "the server received the unsaved state: \(contents)")
            #expect(contents.contains("draft 2"), "\(contents)")
        }
    }

    @Test func aPresenterThatNeverAnswersDelaysSyncByAtMostTheBound() async throws {
        try await SyncWorld.run("presenter-silent") { w in
            let a = try await w.mount("a"), b = try await w.mount("b", options: ["--presenter-timeout", "1"])
            try sh("printf v1 > \(q(a))/doc.txt")
            try await eventually("v1 on B", "test \"$(cat \(q(b))/doc.txt)\" = v1")
            // A raw client in another language: says hello, presents, logs asks, never answers.
            let socket = try sh("sed -n 's/^presenter-socket: //p' \(q(b))/.nimbus/status").trimmingCharacters(in: .whitespacesAndNewlines)
            let silent = try Background("""
                exec python3 -u -c '
                import json, socket, sys
                s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rwb", buffering=0)
                for m in ({"op": "hello", "version": 1, "pid": 1, "name": "silent"}, {"op": "present", "token": 7, "path": "/doc.txt"}):
                    f.write((json.dumps(m) + "\\n").encode()); print(f.readline().decode().strip())
                for line in f: print(line.decode().strip())
                ' \(q(socket))
                """)
            defer { silent.stop() }
            let polite = Recorder(b + "/doc.txt")
            try FileCoordinator.addFilePresenter(polite)
            defer { FileCoordinator.removeFilePresenter(polite) }
            try await eventually("both presenting", "grep -q '^presenters: 2' \(q(b))/.nimbus/status")

            try sh("printf v2 > \(q(a))/doc.txt")
            // The version is applied after the bound, not never; the polite presenter was asked
            // and told to reacquire as usual.
            try await eventually("v2 on B despite the silent presenter", "test \"$(cat \(q(b))/doc.txt)\" = v2")
            #expect(try sh("grep '^presenter-timeouts' \(q(b))/.nimbus/status") == "presenter-timeouts: 1\n")
            try await Self.until("the polite presenter reacquired") { polite.notes.contains("reacquire") }
            let heard = silent.output
            #expect(heard.contains("\"kind\":\"relinquish\"") && heard.contains("\"reason\":\"replace\""), "\(heard)")
            #expect(heard.contains("\"event\":\"version\"") && heard.contains("\"event\":\"changed\""), "\(heard)")
        }
    }

    @Test func aHostileClientGetsErrorRepliesAndKeepsItsConnection() async throws {
        try await SyncWorld.run("presenter-hostile") { w in
            let a = try await w.mount("a")
            try sh("printf v1 > \(q(a))/doc.txt")
            let socket = try sh("sed -n 's/^presenter-socket: //p' \(q(a))/.nimbus/status").trimmingCharacters(in: .whitespacesAndNewlines)
            // A raw client: one line at a time, each answered before the next; then it prints
            // whatever else the daemon says.
            let script = w.base + "/hostile.py"
            try #"""
            import socket, sys
            s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.settimeout(30)
            f = s.makefile("rwb", buffering=0)
            deep = "[" * 500 + "]" * 500
            for line in [
                '{"op":"present","token":7,"path":"/doc.txt"}',
                '{"op":"hello","version":1,"pid":1,"name":"hostile"}',
                'not json',
                '{"op":"present","token":"x","path":"/doc.txt"}',
                '{"op":"present","token":1e300,"path":"/doc.txt"}',
                '{"op":"unpresent","token":9223372036854775807,"x":' + deep + '}',
                '{"op":"rename","token":7}',
                '{"op":"ack","ask":"x"}',
                '{"op":"present","token":7,"path":"/doc.txt"}',
                '{"op":"present","token":8,"path":"/a\\nfake line"}',
            ]:
                f.write((line + "\n").encode()); print(f.readline().decode().strip())
            for line in f: print(line.decode().strip())
            """#.write(toFile: script, atomically: true, encoding: .utf8)
            let client = try Background("exec python3 -u \(q(script)) \(q(socket))")
            defer { client.stop() }
            let replies = [
                #"{"error":"send hello first","ok":false,"re":"present"}"#,
                #"{"ok":true,"re":"hello","version":1}"#,
                #"{"error":"not a JSON object on one line (docs/presenters.md)","ok":false,"re":"error"}"#,
                #"{"error":"token must be an integer","ok":false,"re":"present"}"#,
                #"{"error":"token must be an integer","ok":false,"re":"present"}"#,
                #"{"ok":true,"re":"unpresent","token":9223372036854775807}"#,
                #"{"error":"unknown op rename (docs/presenters.md)","ok":false,"re":"rename"}"#,
                #"{"error":"ask must be an integer","ok":false,"re":"ack"}"#,
                #"{"ok":true,"re":"present","token":7}"#,
                #"{"ok":true,"re":"present","token":8}"#,
            ]
            try await Self.until("every line answered", { client.output }) { client.output.split(separator: "\n").count >= replies.count }
            #expect(client.output.split(separator: "\n").prefix(replies.count).map(String.init) == replies, "\(client.output)")
            try await eventually("presenting", "grep -q '^presenters: 2' \(q(a))/.nimbus/status")
            let claims = try sh("cat \(q(a))/.nimbus/claims")
            #expect(claims.contains("presenting /doc.txt by pid 1 (hostile)"))
            // A presented path with a newline stays on its line (escaped as in .nimbus/events).
            #expect(claims.contains(#"presenting /a\nfake line by pid 1 (hostile)"#), "\(claims)")
            #expect(!claims.split(separator: "\n").contains { $0.hasPrefix("fake") }, "\(claims)")
            // The connection still carries events.
            try sh("printf v2 > \(q(a))/doc.txt")
            try await Self.until("the hostile client heard of the change", { client.output }) {
                client.output.contains(#""event":"changed""#) && client.output.contains(#""origin":"local""#)
            }
        }
    }
}
