import ContainerFS
import Foundation
import Glibc
import Testing

/// Which programs may download by reading placeholders (DownloadPolicy.swift): names, cut
/// names, patterns, the user's lists and their file, and a real process known from /proc.
@Suite struct DownloadPolicyTests {
    typealias P = DownloadPolicy.Program

    @Test func theShippedListRefusesIndexersByAnyOfTheirNames() {
        let none = DownloadPolicy.Lists()
        // The executable's name, or only a `comm` cut to 15 bytes (a python program that named itself).
        #expect(DownloadPolicy.refusal(of: P(executable: "tracker-extract-3"), lists: none) == "tracker-extract-3")
        #expect(DownloadPolicy.refusal(of: P(executable: "python3.11", process: "tracker-extract", thread: "pool-0"), lists: none) == "tracker-extract-3")
        #expect(DownloadPolicy.refusal(of: P(executable: "x", process: "x", thread: "localsearch-ext"), lists: none) == "localsearch-extractor-3")
        // Patterns report the program by its executable's name.
        #expect(DownloadPolicy.refusal(of: P(executable: "gdk-pixbuf-thumbnailer", process: "gdk-pixbuf-thum"), lists: none) == "gdk-pixbuf-thumbnailer")
        #expect(DownloadPolicy.refusal(of: P(executable: "updatedb.plocate", process: "updatedb"), lists: none) == "updatedb")
        // Interactive programs, and names that only look alike.
        for p in [P(executable: "cat", process: "cat"), P(executable: "nautilus", process: "nautilus", thread: "pool-spawner"),
                  P(executable: "tracker", process: "tracker"), P(executable: "thumbnailer-x"), P(executable: "updatedb-helper-tool", process: "updatedb-helper")] {
            #expect(DownloadPolicy.refusal(of: p, lists: none) == nil, "\(p) refused")
        }
        // A cut name is only a cut name when it is 15 bytes long.
        #expect(DownloadPolicy.refusal(of: P(process: "tracker-extrac"), lists: none) == nil)
    }

    @Test func theUsersListsComeFirst() {
        let lists = DownloadPolicy.Lists(allow: ["tracker-extract-3"], deny: ["my-scanner", "*-indexer"])
        #expect(DownloadPolicy.refusal(of: P(executable: "python3", process: "tracker-extract"), lists: lists) == nil)
        #expect(DownloadPolicy.refusal(of: P(executable: "my-scanner"), lists: lists) == "my-scanner")
        #expect(DownloadPolicy.refusal(of: P(executable: "photo-indexer"), lists: lists) == "photo-indexer")
        #expect(DownloadPolicy.refusal(of: P(executable: "baloo_file"), lists: lists) == "baloo_file")
        // An allow wins over every deny, the user's own too.
        let both = DownloadPolicy.Lists(allow: ["clamscan"], deny: ["clamscan"])
        #expect(DownloadPolicy.refusal(of: P(executable: "clamscan"), lists: both) == nil)
    }

    @Test func theFileIsReadLineByLineAndABadLineIsLeftOut() {
        let text = "# comment\nallow a\ndeny b\n\n  deny c  \nforbid d\ndeny e/f\ndeny\nallow g h\n"
        let (lists, problems) = DownloadPolicy.Lists.parse(text)
        #expect(lists == DownloadPolicy.Lists(allow: ["a"], deny: ["b", "c"]))
        #expect(problems == ["forbid d", "deny e/f", "deny", "allow g h"])
        #expect(DownloadPolicy.Lists.parse(lists.text).lists == lists)
        #expect(DownloadPolicy.problem(inName: "") != nil)
        #expect(DownloadPolicy.problem(inName: "a/b") != nil)
        #expect(DownloadPolicy.problem(inName: "a\nallow b") != nil)
        #expect(DownloadPolicy.problem(inName: String(repeating: "x", count: 256)) != nil)
        #expect(DownloadPolicy.problem(inName: "*-thumbnailer") == nil)
    }

    /// A real process, known from /proc by its executable's name; refused once as "first"; the
    /// user's file read at start; the mount's own process never refused.
    @Test func aRealProcessIsKnownByItsExecutable() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("policy-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let exe = dir.appendingPathComponent("clamscan").path
        try FileManager.default.copyItem(atPath: "/bin/sleep", toPath: exe)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: exe)
        p.arguments = ["30"]
        try p.run()
        defer { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() }
        let pid = p.processIdentifier
        let policy = DownloadPolicy(file: DownloadPolicy.file(inState: dir))
        #expect(policy.refusal(pid: pid).map { "\($0.program) \($0.first)" } == "clamscan true")
        #expect(policy.refusal(pid: pid).map { "\($0.program) \($0.first)" } == "clamscan false")
        #expect(policy.refusedPrograms == ["clamscan"])
        #expect(policy.refusal(pid: getpid()) == nil)
        #expect(policy.refusal(pid: 0) == nil)
        try DownloadPolicy.Lists(allow: ["clamscan"]).text.write(to: DownloadPolicy.file(inState: dir), atomically: true, encoding: .utf8)
        #expect(DownloadPolicy(file: DownloadPolicy.file(inState: dir)).refusal(pid: pid) == nil)
    }
}
