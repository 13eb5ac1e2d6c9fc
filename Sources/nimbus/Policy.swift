#if canImport(CFuse3)
import ArgumentParser
import ContainerFS
import Foundation
import Glibc

/// `nimbus policy list|allow|deny|default` (docs/mount.md "Indexers, thumbnailers and
/// scanners"): which programs may download file content by reading placeholders. The user's own
/// lists are kept per state directory (`STATE/programs`); a running mount follows a change
/// within a second.
struct Policy: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Which programs may download file content by reading placeholders (indexers and thumbnailers may not by default).",
        subcommands: [List.self, Allow.self, Deny.self, Default.self])

    /// Whose lists: `--state DIR`, or the mount a path is in (default: the current folder).
    struct Where: ParsableArguments {
        @Option(help: "The state directory of the mount.") var state: String?
        @Option(help: "The Nimbus mount (default: the one holding the current folder).") var mount: String?

        /// The state directory, and the mount root when known.
        func resolve() throws -> (state: URL, root: String?) {
            if let state { return (URL(fileURLWithPath: state).standardizedFileURL, nil) }
            let inside = mount ?? FileManager.default.currentDirectoryPath
            guard let root = try? MountSurface.root(of: inside) else {
                throw CLIFailure(.usage, "\(inside) is not in a Nimbus mount: give --state DIR or --mount PATH")
            }
            let status = Dictionary(try MountSurface.statusFile(root), uniquingKeysWith: { a, _ in a })
            guard let dir = status["state-dir"], !dir.isEmpty else { throw CLIFailure(.usage, "the mount at \(root) does not say its state directory: give --state DIR") }
            return (URL(fileURLWithPath: dir), root)
        }
    }

    static func read(_ file: URL) throws -> DownloadPolicy.Lists {
        guard FileManager.default.fileExists(atPath: file.path) else { return DownloadPolicy.Lists() }
        guard let data = FileManager.default.contents(atPath: file.path) else {
            throw CLIFailure(.storage, "cannot read \(file.path): \(String(cString: strerror(errno)))")
        }
        let (lists, problems) = DownloadPolicy.Lists.parse(String(decoding: data, as: UTF8.self))
        for p in problems { FileHandle.standardError.write(Data("nimbus policy: a line of \(file.path) is not understood and is left out: \(p)\n".utf8)) }
        return lists
    }

    /// Writes the lists whole (a temporary file renamed over the old one: a crash leaves either).
    static func write(_ lists: DownloadPolicy.Lists, to file: URL) throws {
        let tmp = file.deletingLastPathComponent().appendingPathComponent(".programs.tmp")
        do {
            try Data(lists.text.utf8).write(to: tmp)
            guard rename(tmp.path, file.path) == 0 else { throw CLIFailure(.storage, "cannot rename \(tmp.path): \(String(cString: strerror(errno)))") }
        } catch let e as CLIFailure { throw e } catch {
            throw CLIFailure(.storage, "cannot write \(file.path): \(error.localizedDescription) (is the state directory writable, the disk full?)")
        }
    }

    static func change(_ program: String, at w: Where, _ edit: (inout DownloadPolicy.Lists) -> Void) throws {
        if let problem = DownloadPolicy.problem(inName: program) { throw CLIFailure(.usage, "\(program): \(problem)") }
        let (state, _) = try w.resolve()
        var isDir: ObjCBool = false
        guard FileManager.default.fileExists(atPath: state.path, isDirectory: &isDir), isDir.boolValue else {
            throw CLIFailure(.usage, "\(state.path) is not a state directory")
        }
        let file = DownloadPolicy.file(inState: state)
        var lists = try read(file)
        lists.allow.removeAll { $0 == program }
        lists.deny.removeAll { $0 == program }
        edit(&lists)
        try write(lists, to: file)
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show the programs denied and allowed, and those refused by the mount so far.")
        @OptionGroup var at: Where
        func run() throws {
            let (state, root) = try at.resolve()
            let lists = try Policy.read(DownloadPolicy.file(inState: state))
            print("denied (shipped): \(DownloadPolicy.shippedDeny.joined(separator: " "))")
            print("denied (yours):   \(lists.deny.isEmpty ? "none" : lists.deny.joined(separator: " "))")
            print("allowed (yours):  \(lists.allow.isEmpty ? "none" : lists.allow.joined(separator: " "))")
            if let root {
                let status = Dictionary(try MountSurface.statusFile(root), uniquingKeysWith: { a, _ in a })
                let refused = status["refused-programs"] ?? "none"
                print("refused so far:   \(refused)")
                if refused != "none" { print("  (allow one: nimbus policy allow PROGRAM)") }
            }
        }
    }

    /// Puts `program` on the user's allow list (`allow`) or deny list, off the other.
    static func choose(_ program: String, allow: Bool, at w: Where) throws {
        try change(program, at: w) { allow ? $0.allow.append(program) : $0.deny.append(program) }
        print("\(program) may\(allow ? "" : " not") download content now")
    }

    struct Allow: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Let PROGRAM download content by reading placeholders (even if it is on the shipped deny list).")
        @Argument(help: "The program's name (its executable's file name; `*` matches any characters).") var program: String
        @OptionGroup var at: Where
        func run() throws { try Policy.choose(program, allow: true, at: at) }
    }

    struct Deny: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Refuse PROGRAM's reads that would download content (EACCES; what is downloaded already reads as usual).")
        @Argument(help: "The program's name (its executable's file name; `*` matches any characters).") var program: String
        @OptionGroup var at: Where
        func run() throws { try Policy.choose(program, allow: false, at: at) }
    }

    struct Default: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Forget your own choice for PROGRAM (the shipped list decides again).")
        @Argument(help: "The program's name.") var program: String
        @OptionGroup var at: Where
        func run() throws {
            try Policy.change(program, at: at) { _ in }
            let shipped = DownloadPolicy.refusal(of: DownloadPolicy.Program(executable: program), lists: DownloadPolicy.Lists()) != nil
            print("\(program) \(shipped ? "may not" : "may") download content (the shipped list)")
        }
    }
}
#endif
