import NimbusCore
import Testing

@Suite struct IgnoreRulesTests {
    /// One row: the `.nimbusignore` files by folder ("" = the root, "a/b"), the path asked about
    /// ("x/" = a folder), and the verdict: the matching rule's line and its file's folder.
    /// `git`: whether `git check-ignore`, with the same files as `.gitignore`, says the same; every
    /// row not marked `git: false` was checked with git 2.39. The rows marked false are where
    /// Nimbus means to differ: the exempt names, one Unicode scalar for `?` and a class member
    /// (git: one byte), and `**` after a name character being a `*` as gitignore(5) says.
    struct Case: Sendable, CustomTestStringConvertible {
        enum Expect: Sendable, Equatable {
            case ignored(Int, in: String)
            case included(Int, in: String)
            case none
        }

        let name: String
        let files: [String: String]
        let path: String
        let expect: Expect
        let git: Bool

        init(_ name: String, _ files: [String: String], _ path: String, _ expect: Expect, git: Bool = true) {
            self.name = name
            self.files = files
            self.path = path
            self.expect = expect
            self.git = git
        }

        var testDescription: String { name }
    }

    static let cases: [Case] = [
        Case("a name pattern matches at any depth", ["": "*.o\n"], "src/lib/a.o", .ignored(1, in: "")),
        Case("no rule matches", ["": "*.o\n"], "src/a.c", .none),
        Case("the last matching rule wins: a negation after", ["": "*.log\n!keep.log\n"], "keep.log", .included(2, in: "")),
        Case("the last matching rule wins: a negation before", ["": "!keep.log\n*.log\n"], "keep.log", .ignored(2, in: "")),
        Case("a negation leaves other matches alone", ["": "*.log\n!keep.log\n"], "logs/x.log", .ignored(1, in: "")),
        Case("a trailing slash matches a folder", ["": "build/\n"], "build/", .ignored(1, in: "")),
        Case("a trailing slash does not match a file", ["": "build/\n"], "build", .none),
        Case("a folder-only name matches at any depth, with what is inside", ["": "node_modules/\n"], "web/app/node_modules/x/y.js", .ignored(1, in: "")),
        Case("a leading slash anchors to the file's folder", ["": "/todo.txt\n"], "todo.txt", .ignored(1, in: "")),
        Case("an anchored pattern does not match deeper", ["": "/todo.txt\n"], "docs/todo.txt", .none),
        Case("a middle slash anchors", ["": "doc/frotz\n"], "doc/frotz", .ignored(1, in: "")),
        Case("a middle slash does not match deeper", ["": "doc/frotz\n"], "a/doc/frotz", .none),
        Case("an anchored folder-only pattern skips a file", ["": "/out/\n"], "out", .none),
        Case("anchored in a subfolder's file", ["src": "/gen\n"], "src/gen", .ignored(1, in: "src")),
        Case("anchored in a subfolder's file, not deeper", ["src": "/gen\n"], "src/lib/gen", .none),
        Case("a middle slash in a subfolder's file is relative to it", ["src": "lib/gen.c\n"], "src/lib/gen.c", .ignored(1, in: "src")),
        Case("a middle slash in a subfolder's file is not relative to the root", ["src": "lib/gen.c\n"], "lib/gen.c", .none),
        Case("a subfolder's file does not apply outside it", ["src": "*.tmp\n"], "other/a.tmp", .none),
        Case("a subfolder's name pattern matches at any depth below it", ["src": "*.tmp\n"], "src/a/b/c.tmp", .ignored(1, in: "src")),
        Case("leading **/ matches at the top", ["": "**/foo\n"], "foo", .ignored(1, in: "")),
        Case("leading **/ matches at any depth", ["": "**/foo\n"], "a/b/foo", .ignored(1, in: "")),
        Case("leading **/ then a path", ["": "**/foo/bar\n"], "x/y/foo/bar", .ignored(1, in: "")),
        Case("leading **/ then a path, zero folders", ["": "**/foo/bar\n"], "foo/bar", .ignored(1, in: "")),
        Case("trailing /** matches everything inside", ["": "abc/**\n"], "abc/x/y.txt", .ignored(1, in: "")),
        Case("trailing /** does not match the folder itself", ["": "abc/**\n"], "abc/", .none),
        Case("trailing /** leaves the folder open to a negation", ["": "abc/**\n!abc/keep\n"], "abc/keep", .included(2, in: "")),
        Case("middle /**/ matches zero folders", ["": "a/**/b\n"], "a/b", .ignored(1, in: "")),
        Case("middle /**/ matches several folders", ["": "a/**/b\n"], "a/x/y/b", .ignored(1, in: "")),
        Case("middle /**/ wants whole names", ["": "a/**/b\n"], "a/xb", .none),
        Case("other ** is a single *", ["": "a/**b\n"], "a/xb", .ignored(1, in: "")),
        Case("other ** does not cross a slash", ["": "a/**b\n"], "a/x/b", .none),
        Case("** in a name pattern", ["": "x**z\n"], "d/xyz", .ignored(1, in: "")),
        Case("* does not cross a slash", ["": "/*/b\n"], "x/y/b", .none),
        Case("* matches one name", ["": "/*/b\n"], "x/b", .ignored(1, in: "")),
        Case("? matches one character", ["": "a?c\n"], "abc", .ignored(1, in: "")),
        Case("? does not match a slash", ["": "/a?b\n"], "a/b", .none),
        Case("? does not match nothing", ["": "a?c\n"], "ac", .none),
        Case("a character class", ["": "[abc].txt\n"], "b.txt", .ignored(1, in: "")),
        Case("a character class, no match", ["": "[abc].txt\n"], "d.txt", .none),
        Case("a range", ["": "file[0-9]\n"], "file7", .ignored(1, in: "")),
        Case("[!...] negates", ["": "[!0-9].txt\n"], "1.txt", .none),
        Case("[^...] negates", ["": "[^0-9].txt\n"], "a.txt", .ignored(1, in: "")),
        Case("a POSIX class", ["": "[[:digit:]]x\n"], "5x", .ignored(1, in: "")),
        Case("] first in a class is a member", ["": "[]a]\n"], "]", .ignored(1, in: "")),
        Case("- last in a class is a member", ["": "x[a-]\n"], "x-", .ignored(1, in: "")),
        Case("a class never matches a slash", ["": "/a[/]b\n"], "a/b", .none),
        Case("\\* is a literal star", ["": "\\*.txt\n"], "*.txt", .ignored(1, in: "")),
        Case("\\* does not match anything else", ["": "\\*.txt\n"], "a.txt", .none),
        Case("\\# starts a pattern, not a comment", ["": "\\#note\n"], "#note", .ignored(1, in: "")),
        Case("# anywhere but first is part of the pattern", ["": "a#b\n"], "a#b", .ignored(1, in: "")),
        Case("\\! starts a pattern, not a negation", ["": "*\n\\!important\n"], "!important", .ignored(2, in: "")),
        Case("an escaped trailing space is kept", ["": "a\\ \n"], "a ", .ignored(1, in: "")),
        Case("trailing spaces are dropped", ["": "a   \n"], "a", .ignored(1, in: "")),
        Case("trailing spaces are dropped, so they do not match", ["": "a   \n"], "a ", .none),
        Case("a trailing tab is kept", ["": "a\t\n"], "a\t", .ignored(1, in: "")),
        Case("CRLF line ends", ["": "*.o\r\n!k.o\r\n"], "k.o", .included(2, in: "")),
        Case("names are case-sensitive", ["": "*.TXT\n"], "a.txt", .none),
        Case("a deeper file overrides a shallower one", ["": "*.log\n", "src": "!debug.log\n"], "src/debug.log", .included(1, in: "src")),
        Case("a deeper file ignores what the root re-includes", ["": "*.dat\n!keep.dat\n", "src": "keep.dat\n"], "src/keep.dat", .ignored(1, in: "src")),
        Case("the root's rules still apply below a subfolder's file", ["": "*.log\n", "src": "!debug.log\n"], "src/other.log", .ignored(1, in: "")),
        Case("no re-including inside an ignored folder", ["": "build/\n!build/keep.txt\n"], "build/keep.txt", .ignored(1, in: "")),
        Case("no re-including from the ignored folder's own file", ["": "build/\n", "build": "!keep.txt\n"], "build/keep.txt", .ignored(1, in: "")),
        Case("no re-including by a name pattern", ["": "tmp/\n!*.txt\n"], "a/tmp/b/n.txt", .ignored(1, in: "")),
        Case("re-including a folder, then ignoring inside it", ["": "/*\n!/src\n/src/*\n!/src/main\n"], "src/other", .ignored(3, in: "")),
        Case("re-including a folder, then one folder inside it", ["": "/*\n!/src\n/src/*\n!/src/main\n"], "src/main/", .included(4, in: "")),
        Case("everything inside a re-included folder", ["": "/*\n!/src\n/src/*\n!/src/main\n"], "src/main/a/b.c", .none),
        Case("ignore everything but folders and *.c: a file", ["": "*\n!*/\n!*.c\n"], "src/x.h", .ignored(1, in: "")),
        Case("ignore everything but folders and *.c: a .c file", ["": "*\n!*/\n!*.c\n"], "src/x.c", .included(3, in: "")),
        Case("a negated folder-only rule does not match a file", ["": "*\n!*/\n"], "a/b.txt", .ignored(1, in: "")),
        Case("**/ alone matches every folder", ["": "**/\n"], "a/", .ignored(1, in: "")),
        Case("a space inside a name", ["": "my file.txt\n"], "docs/my file.txt", .ignored(1, in: "")),
        Case("a comment line is not a rule", ["": "# *.o\n"], "a.o", .none),
        Case("precomposed \u{E9} matches precomposed \u{E9}", ["": "caf\u{E9}\n"], "caf\u{E9}", .ignored(1, in: "")),
        Case("precomposed \u{E9} does not match e + combining accent", ["": "caf\u{E9}\n"], "cafe\u{301}", .none),
        Case(".nimbusignore is never ignored", ["": "*\n"], ".nimbusignore", .none, git: false),
        Case(".nimbusignore is never ignored, even in an ignored folder", ["": "*\n"], "a/.nimbusignore", .none, git: false),
        Case(".nimbus is never ignored", ["": ".nimbus\n"], ".nimbus", .none, git: false),
        Case("a name like .nimbusignore is not exempt", ["": "*\n"], ".nimbusignore~", .ignored(1, in: "")),
        Case("? matches one Unicode scalar (git: one byte)", ["": "caf?\n"], "caf\u{E9}", .ignored(1, in: ""), git: false),
        Case("a class member can be a non-ASCII scalar (git: bytes)", ["": "[\u{E9}\u{E8}]t\u{E9}\n"], "\u{E9}t\u{E9}", .ignored(1, in: ""), git: false),
        Case("a ** after a name is a * even first in the pattern (git differs)", ["": "b**/a\n"], "ba", .none, git: false),
    ]

    static func components(_ path: Substring) -> [String] {
        path.isEmpty ? [] : path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
    }

    @Test(arguments: cases) func verdict(_ c: Case) throws {
        var files: [[String]: IgnoreFile] = [:]
        for (folder, text) in c.files {
            let file = IgnoreFile(text: text)
            #expect(file.problems.isEmpty, "\(file.problems)")
            files[Self.components(folder[...])] = file
        }
        let isFolder = c.path.hasSuffix("/")
        let path = Self.components(isFolder ? c.path.dropLast() : c.path[...])
        let verdict = IgnoreMatch.verdict(path: path, isFolder: isFolder, files: files)
        let got: Case.Expect
        switch verdict {
        case .ignored(let rule, let folder), .included(let rule, let folder):
            let line = rule.line, where_ = folder.joined(separator: "/")
            got = rule.negated ? .included(line, in: where_) : .ignored(line, in: where_)
            // The rule handed back is the file's own.
            let file = try #require(files[folder])
            #expect(file.rules.contains(rule))
            if case .included = verdict { #expect(rule.negated) } else { #expect(!rule.negated) }
        case .none:
            got = .none
        }
        #expect(got == c.expect)
    }

    @Test func theTableCoversEnough() {
        #expect(Self.cases.count >= 40)
        #expect(Set(Self.cases.map(\.name)).count == Self.cases.count, "names are unique")
    }

    @Test func theRootAndAnEmptyFileIgnoreNothing() {
        let all = IgnoreFile(text: "*\n")
        #expect(IgnoreMatch.verdict(path: [], isFolder: true, files: [[]: all]) == .none)
        #expect(IgnoreMatch.verdict(path: ["a", "b"], isFolder: false, files: [:]) == .none)
        #expect(IgnoreMatch.verdict(path: ["a", "b"], isFolder: false, files: [[]: IgnoreFile(text: "")]) == .none)
    }

    @Test func theIgnoringFolderIsTheOneOfTheMatchingFile() throws {
        let root = IgnoreFile(text: "*.o\n"), src = IgnoreFile(text: "*.o\n!keep.o\n")
        let files: [[String]: IgnoreFile] = [[]: root, ["src"]: src]
        let deep = IgnoreMatch.verdict(path: ["src", "a", "x.o"], isFolder: false, files: files)
        #expect(deep == .ignored(try #require(src.rules.first), folder: ["src"]))
        let kept = IgnoreMatch.verdict(path: ["src", "keep.o"], isFolder: false, files: files)
        #expect(kept == .included(try #require(src.rules.last), folder: ["src"]))
        let top = IgnoreMatch.verdict(path: ["x.o"], isFolder: false, files: files)
        #expect(top == .ignored(try #require(root.rules.first), folder: []))
    }

    @Test func folderNamesAreLookedUpByteForByte() {
        let nfc = "caf\u{E9}", nfd = "cafe\u{301}"
        let files: [[String]: IgnoreFile] = [[nfc]: IgnoreFile(text: "*.o\n")]
        #expect(IgnoreMatch.verdict(path: [nfc, "x.o"], isFolder: false, files: files) != .none)
        #expect(IgnoreMatch.verdict(path: [nfd, "x.o"], isFolder: false, files: files) == .none)
        let rule = IgnoreFile(text: "*.o").rules[0]
        #expect(IgnoreVerdict.ignored(rule, folder: [nfc]) != .ignored(rule, folder: [nfd]))
        #expect(IgnoreVerdict.ignored(rule, folder: [nfc]) == .ignored(rule, folder: [nfc]))
        #expect(IgnoreVerdict.ignored(rule, folder: []) != .included(rule, folder: []))
    }

    /// Patterns that make a backtracking matcher take exponential time, on 255-byte names.
    @Test func hostilePatternsFinishFast() throws {
        let name = String(repeating: "a", count: 255)
        let deep = Array(repeating: name, count: 16)
        let cases: [(pattern: String, path: [String], ignored: Bool)] = [
            ("*a*a*a*a*a*a*a*b", [name], false),
            ("*a*a*a*a*a*a*a*a", [name], true),
            ("a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", [name], false),
            ("?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*?*b", [name], false),
            ("[a-z]*[a-z]*[a-z]*[a-z]*[a-z]*[a-z]*[!a]", [name], false),
            (String(repeating: "*a", count: 2048), [name], false),  // 4,096 bytes: the longest line taken
            ("**/a*/**/a*/**/a*/**/a*/**/a*/**/a*/**/b", deep, false),
            ("/**/**/**/**/**/**/**/**/**/**/**/**/**/**/a*a*a*a*a*a*b", deep, false),
        ]
        let clock = ContinuousClock()
        let start = clock.now
        for c in cases {
            let file = IgnoreFile(text: c.pattern)
            #expect(file.rules.count == 1 && file.problems.isEmpty, "\(c.pattern.prefix(40))")
            let verdict = IgnoreMatch.verdict(path: c.path, isFolder: false, files: [[]: file])
            #expect((verdict != .none) == c.ignored, "\(c.pattern.prefix(40))")
        }
        let elapsed = clock.now - start
        #expect(elapsed < .seconds(2), "took \(elapsed)")
    }

    // MARK: - Parsing

    @Test func commentsAndBlankLinesAreNotRules() {
        let file = IgnoreFile(text: "# comment\n\n   \n*.o\n\\#hash\n  # not a comment\na#b\n#\n")
        #expect(file.rules.map(\.line) == [4, 5, 6, 7])
        #expect(file.rules.map(\.text) == ["*.o", "\\#hash", "  # not a comment", "a#b"])
        #expect(file.problems.isEmpty)
    }

    @Test func trailingSpacesAreTrimmedUnlessEscaped() {
        let file = IgnoreFile(text: "a  \nb\\ \nc\\  \nd\t\ne\\\\ \n f\n")
        #expect(file.rules.map(\.text) == ["a", "b\\ ", "c\\ ", "d\t", "e\\\\", " f"])
        #expect(file.problems.isEmpty)
    }

    @Test func theFlagsOfARule() {
        let file = IgnoreFile(text: "!/a/b/\na/\na/b\n\\!a\n/a\n**/x\n!*.c\n")
        let flags = file.rules.map { [$0.negated, $0.directoryOnly, $0.anchored] }
        #expect(flags == [
            [true, true, true],     // !/a/b/
            [false, true, false],   // a/: the final slash does not anchor
            [false, false, true],   // a/b
            [false, false, false],  // \!a
            [false, false, true],   // /a
            [false, false, true],   // **/x
            [true, false, false],   // !*.c
        ])
        #expect(file.rules.first?.text == "!/a/b/")
    }

    @Test func linesNotUnderstoodAreLeftOutWithAProblem() {
        let long = String(repeating: "x", count: 4097)
        let text = "ok\n[abc\nbad\\\n[[:nope:]]\n!\n/\n\(long)\nnul\u{0}\n! \nfine\n"
        let file = IgnoreFile(text: text)
        #expect(file.rules.map(\.text) == ["ok", "fine"])
        #expect(file.rules.map(\.line) == [1, 10])
        let lines = file.problems.map { $0.prefix { $0 != ":" } }
        #expect(lines == ["line 2", "line 3", "line 4", "line 5", "line 6", "line 7", "line 8", "line 9"])
        #expect(file.problems.allSatisfy { $0.count < 100 }, "a problem does not repeat a long line")
    }

    @Test func linesUpTo4096BytesAreTaken() {
        #expect(IgnoreFile(text: String(repeating: "a", count: 4096)).rules.count == 1)
        #expect(IgnoreFile(text: String(repeating: "a", count: 4097)).problems.count == 1)
        #expect(IgnoreFile(text: String(repeating: "\u{E9}", count: 2048)).rules.count == 1)   // 2 bytes each
        #expect(IgnoreFile(text: String(repeating: "\u{E9}", count: 2049)).problems.count == 1)
        #expect(IgnoreFile(text: "# " + String(repeating: "a", count: 5000)).problems.isEmpty, "a comment")
    }

    /// A file of more rules than any real one (from any device of the account) keeps the first
    /// 10,000 and says so: every verdict tries every rule.
    @Test func rulesPastTenThousandAreLeftOut() {
        let text = "# many\n" + (0..<10_050).map { "r\($0)\n" }.joined()
        let file = IgnoreFile(text: text)
        #expect(file.rules.count == 10_000 && file.rules.last?.text == "r9999")
        #expect(file.problems == ["line 10002 and after: more than 10000 rules; the rest is left out"])
        #expect(IgnoreFile(text: (0..<10_000).map { "r\($0)\n" }.joined()).problems.isEmpty)
    }

    @Test func crlfAndAByteOrderMark() {
        let file = IgnoreFile(text: "\u{FEFF}a\r\nb\r\n\r\nc")
        #expect(file.rules.map(\.text) == ["a", "b", "c"])
        #expect(file.rules.map(\.line) == [1, 2, 4])
        let verdict = IgnoreMatch.verdict(path: ["a"], isFolder: false, files: [[]: file])
        #expect(verdict != .none)
    }

    @Test func equalTextsMakeEqualFiles() {
        let a = IgnoreFile(text: "*.o\n!keep.o\nbuild/\n[x\n"), b = IgnoreFile(text: "*.o\n!keep.o\nbuild/\n[x\n")
        #expect(a == b)
        #expect(Set([a, b]).count == 1)
        #expect(a != IgnoreFile(text: "*.o\n"))
        // Byte-for-byte: the same name in two Unicode forms makes two different rules.
        #expect(IgnoreFile(text: "caf\u{E9}") != IgnoreFile(text: "cafe\u{301}"))
    }
}
