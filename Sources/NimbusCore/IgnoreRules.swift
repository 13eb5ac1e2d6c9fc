// `.nimbusignore`: gitignore(5) syntax and semantics, pure (no I/O, no Foundation).
//
// Names and patterns are compared as Unicode scalars by value, which is byte-for-byte in UTF-8:
// no case folding, no normalization ("é" precomposed and "e" + combining accent are different
// names). Each pattern is compiled once, when its file is parsed, into a short token program that
// is run as an NFA — the set of pattern positions reachable so far, advanced one character at a
// time — so a match costs at most (pattern length × length of the name or path) steps: no
// backtracking, nothing exponential. Lines are bounded (`IgnoreFile.maxLineBytes`).
//
// Where this differs from git (2.39) on purpose: `?` and a `[...]` member stand for one Unicode
// scalar, not one byte (git's `?` never matches "é", nor does its `[é]`); a `**` right after a name
// character is a `*`, as gitignore(5) says, even when it is the pattern's first wildcard (git's
// `b**/a` matches "ba" and "bx/y/a"); a line with a NUL is left out (git keeps what comes before
// it); lines git would keep but that can never match ("[abc", a final lone "\", "!", "/") are
// left out with a problem; and `.nimbus` / `.nimbusignore` are never ignored.

/// The rules of one `.nimbusignore` file, which apply to the folder holding it and below.
public struct IgnoreFile: Sendable, Hashable {
    /// The rules in file order. Blank lines, comments and the lines left out are not here.
    public let rules: [IgnoreRule]
    /// One message per line left out, e.g. `line 3: "[" without a closing "]"`.
    public let problems: [String]

    /// Lines longer than this (in UTF-8 bytes, without the line end) are left out.
    static let maxLineBytes = 4096

    /// Parses the text of a `.nimbusignore` file. Never fails: a line not understood is left out
    /// and said in `problems`. Lines end with "\n" or "\r\n"; a leading byte order mark is skipped.
    public init(text: String) {
        var rules: [IgnoreRule] = []
        var problems: [String] = []
        var scalars = Substring(text).unicodeScalars
        if scalars.first == "\u{FEFF}" { scalars = scalars.dropFirst() }
        var line: [UInt32] = []
        var number = 1
        for s in scalars {
            if s == "\n" {
                Self.take(line, number: number, into: &rules, problems: &problems)
                line.removeAll(keepingCapacity: true)
                number += 1
            } else {
                line.append(s.value)
            }
        }
        if !line.isEmpty { Self.take(line, number: number, into: &rules, problems: &problems) }
        // Every rule is tried for every item looked at: a file of too many (from any device of
        // the account) would make each verdict slow. Git has no limit; ten thousand is far
        // beyond any real file.
        if rules.count > Self.maxRules {
            problems.append("line \(rules[Self.maxRules].line) and after: more than \(Self.maxRules) rules; the rest is left out")
            rules.removeSubrange(Self.maxRules...)
        }
        self.rules = rules
        self.problems = problems
    }

    /// Rules past this many in one file are left out.
    static let maxRules = 10_000

    private static func take(_ raw: [UInt32], number: Int, into rules: inout [IgnoreRule], problems: inout [String]) {
        var line = raw[...]
        if line.last == Ch.cr { line = line.dropLast() }
        // Blank, or a comment: "#" first (a "#" anywhere else, or "\#" first, is part of a pattern).
        if line.isEmpty || line.first == Ch.hash { return }
        let bytes = line.reduce(0) { $0 + utf8Length($1) }
        if bytes > maxLineBytes {
            problems.append("line \(number): longer than \(maxLineBytes) bytes")
            return
        }
        if line.contains(0) {
            problems.append("line \(number): contains a NUL character")
            return
        }
        line = trimTrailingSpaces(line)
        if line.isEmpty { return }  // only spaces
        var text = String.UnicodeScalarView()
        for v in line { if let s = Unicode.Scalar(v) { text.append(s) } }

        var body = line
        let negated = body.first == Ch.bang
        if negated { body = body.dropFirst() }
        let directoryOnly = body.last == Ch.slash
        if directoryOnly { body = body.dropLast() }
        let anchored = body.contains(Ch.slash)
        if anchored, body.first == Ch.slash { body = body.dropFirst() }
        if body.isEmpty {
            problems.append("line \(number): no pattern to match")
            return
        }
        switch Glob.compile(body, pathname: anchored) {
        case .success(let glob):
            rules.append(IgnoreRule(line: number, text: String(text), negated: negated,
                                    directoryOnly: directoryOnly, anchored: anchored, glob: glob))
        case .failure(let error):
            problems.append("line \(number): \(error.message)")
        }
    }

    /// git's trim_trailing_spaces: trailing " " go, unless escaped with "\" (the "\" stays, so the
    /// pattern matches the space). Tabs stay.
    private static func trimTrailingSpaces(_ line: ArraySlice<UInt32>) -> ArraySlice<UInt32> {
        var firstTrailingSpace: Int? = nil
        var i = line.startIndex
        while i < line.endIndex {
            switch line[i] {
            case Ch.space:
                if firstTrailingSpace == nil { firstTrailingSpace = i }
            case Ch.backslash:
                i += 1
                if i == line.endIndex { return line }
                firstTrailingSpace = nil
            default:
                firstTrailingSpace = nil
            }
            i += 1
        }
        if let cut = firstTrailingSpace { return line[..<cut] }
        return line
    }

    private static func utf8Length(_ v: UInt32) -> Int {
        v < 0x80 ? 1 : v < 0x800 ? 2 : v < 0x1_0000 ? 3 : 4
    }

    public static func == (a: IgnoreFile, b: IgnoreFile) -> Bool {
        a.rules == b.rules && a.problems.count == b.problems.count
            && zip(a.problems, b.problems).allSatisfy { $0.utf8.elementsEqual($1.utf8) }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(rules)
        for p in problems { hasher.combine(p.utf8.count); for b in p.utf8 { hasher.combine(b) } }
    }
}

/// One pattern line of a `.nimbusignore` file.
public struct IgnoreRule: Sendable, Hashable {
    /// The 1-based line number in its file.
    public let line: Int
    /// The line as written, trimmed of trailing unescaped spaces (with its "!" and final "/").
    public let text: String
    /// Starts with "!": a match re-includes what a rule before it, or a file above, ignored.
    public let negated: Bool
    /// Ends with "/": matches folders only.
    public let directoryOnly: Bool
    /// Has a "/" at the start or in the middle: matched against the path from the file's folder;
    /// otherwise against the name alone, at any depth below the file's folder.
    public let anchored: Bool

    fileprivate let glob: Glob

    fileprivate init(line: Int, text: String, negated: Bool, directoryOnly: Bool, anchored: Bool, glob: Glob) {
        self.line = line
        self.text = text
        self.negated = negated
        self.directoryOnly = directoryOnly
        self.anchored = anchored
        self.glob = glob
    }

    // The compiled pattern follows from `text`; texts compare byte-for-byte, like names.
    public static func == (a: IgnoreRule, b: IgnoreRule) -> Bool {
        a.line == b.line && a.negated == b.negated && a.directoryOnly == b.directoryOnly
            && a.anchored == b.anchored && a.text.utf8.elementsEqual(b.text.utf8)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(line)
        hasher.combine(negated)
        hasher.combine(directoryOnly)
        hasher.combine(anchored)
        hasher.combine(text.utf8.count)
        for b in text.utf8 { hasher.combine(b) }
    }
}

/// What the `.nimbusignore` files say about one item.
public enum IgnoreVerdict: Sendable, Hashable {
    /// Ignored by `rule` of the file in `folder` (path components from the root; [] = root). For
    /// an item inside an ignored folder, the rule is the one that ignored that folder.
    case ignored(IgnoreRule, folder: [String])
    /// A negated rule matched last: not ignored, though a rule before it or a file above matched.
    case included(IgnoreRule, folder: [String])
    /// No rule matched.
    case none

    // Folder names compare byte-for-byte, like everything else here.
    public static func == (a: IgnoreVerdict, b: IgnoreVerdict) -> Bool {
        switch (a, b) {
        case (.ignored(let r, let f), .ignored(let s, let g)), (.included(let r, let f), .included(let s, let g)):
            return r == s && f.count == g.count && zip(f, g).allSatisfy { $0.utf8.elementsEqual($1.utf8) }
        case (.none, .none):
            return true
        default:
            return false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .ignored(let rule, let folder), .included(let rule, let folder):
            if case .ignored = self { hasher.combine(1) } else { hasher.combine(2) }
            hasher.combine(rule)
            hasher.combine(folder.count)
            for name in folder { hasher.combine(name.utf8.count); for b in name.utf8 { hasher.combine(b) } }
        case .none:
            hasher.combine(0)
        }
    }
}

public enum IgnoreMatch {
    /// The name of a rules file.
    public static let fileName = ".nimbusignore"

    /// Whether the item at `path` (components from the container root, e.g. ["src","build","a.o"]),
    /// a folder or not, is ignored by the `.nimbusignore` files of its ancestor folders: `files`
    /// maps a folder's path components ([] = root) to its parsed file. Git's semantics: files
    /// deeper override shallower ones, within one file the last matching rule wins; a path inside
    /// an ignored folder is ignored and cannot be re-included by a negation (the files inside an
    /// ignored folder are not read). Folder names in `files` are looked up byte-for-byte.
    ///
    /// `.nimbus` and `.nimbusignore` themselves are never ignored: `.none` for a path whose last
    /// component is one of them, wherever it is. So is the root itself (`path == []`).
    public static func verdict(path: [String], isFolder: Bool, files: [[String]: IgnoreFile]) -> IgnoreVerdict {
        guard let last = path.last else { return .none }
        if last.utf8.elementsEqual(".nimbusignore".utf8) || last.utf8.elementsEqual(".nimbus".utf8) {
            return .none
        }
        let names = path.map { name in name.unicodeScalars.map(\.value) }
        // The files of the folders above the item being looked at, shallowest first, with their depth.
        var chain: [(depth: Int, file: IgnoreFile)] = []
        // Git's walk: each folder on the way down is checked with the files above it; the first
        // one ignored decides for everything inside it.
        for k in path.indices {
            if let file = fileExactly(at: Array(path[..<k]), in: files), !file.rules.isEmpty {
                chain.append((k, file))
            }
            let isLast = k == path.count - 1
            guard let (rule, depth) = lastMatch(names: names, upTo: k, isFolder: isLast ? isFolder : true, chain: chain)
            else { continue }
            let folder = Array(path[..<depth])
            if !rule.negated { return .ignored(rule, folder: folder) }
            if isLast { return .included(rule, folder: folder) }
        }
        return .none
    }

    /// The last rule of the deepest file that matches the item `names[0...k]`, with its file's depth.
    private static func lastMatch(names: [[UInt32]], upTo k: Int, isFolder: Bool,
                                  chain: [(depth: Int, file: IgnoreFile)]) -> (IgnoreRule, Int)? {
        for (depth, file) in chain.reversed() {
            var relative: [UInt32]? = nil  // names[depth...k] joined by separators, made when needed
            for rule in file.rules.reversed() {
                if rule.directoryOnly && !isFolder { continue }
                let hit: Bool
                if rule.anchored {
                    if relative == nil {
                        var joined: [UInt32] = []
                        for j in depth...k {
                            if j > depth { joined.append(Glob.separator) }
                            joined.append(contentsOf: names[j])
                        }
                        relative = joined
                    }
                    hit = rule.glob.matches(relative![...])
                } else {
                    hit = rule.glob.matches(names[k][...])
                }
                if hit { return (rule, depth) }
            }
        }
        return nil
    }

    /// `files[key]`, but only for a key equal byte-for-byte (a `[String]` key is found by
    /// canonical equivalence; keys are unique under it, so at most one can be the one).
    private static func fileExactly(at key: [String], in files: [[String]: IgnoreFile]) -> IgnoreFile? {
        guard let index = files.index(forKey: key) else { return nil }
        let (found, file) = files[index]
        guard found.count == key.count, zip(found, key).allSatisfy({ $0.utf8.elementsEqual($1.utf8) }) else {
            return nil
        }
        return file
    }
}

// MARK: - Patterns

private enum Ch {
    static let cr: UInt32 = 0x0D, space: UInt32 = 0x20, bang: UInt32 = 0x21, hash: UInt32 = 0x23
    static let star: UInt32 = 0x2A, dash: UInt32 = 0x2D, slash: UInt32 = 0x2F, colon: UInt32 = 0x3A
    static let question: UInt32 = 0x3F, open: UInt32 = 0x5B, backslash: UInt32 = 0x5C, close: UInt32 = 0x5D
    static let caret: UInt32 = 0x5E
}

/// A compiled pattern. In a path to match, folders are separated by `separator`, a value no
/// scalar has, so a "/" of the pattern matches only between names.
private struct Glob: Sendable, Hashable {
    static let separator: UInt32 = 0x11_0000

    enum Token: Sendable, Hashable {
        case literal(UInt32)
        case one                // ?
        case set(CharSet)       // [...]
        case star               // * (never the separator)
        case starAny            // the ** of "**/", "/**/" and "/**": anything, separators too
        case fork(Int)          // either go on, or jump to the token at this index (ahead)
    }

    struct CharSet: Sendable, Hashable {
        var negated: Bool
        var items: [Item]
        enum Item: Sendable, Hashable {
            case char(UInt32)
            case range(UInt32, UInt32)
            case posix(Posix)
        }

        func contains(_ c: UInt32) -> Bool {
            if c == Glob.separator { return false }
            var found = false
            for item in items {
                switch item {
                case .char(let x): found = c == x
                case .range(let lo, let hi): found = lo <= c && c <= hi
                case .posix(let p): found = p.contains(c)
                }
                if found { break }
            }
            return found != negated
        }
    }

    /// git's wildmatch classes, ASCII only.
    enum Posix: String, Sendable, Hashable {
        case alnum, alpha, blank, cntrl, digit, graph, lower, print, punct, space, upper, xdigit

        func contains(_ c: UInt32) -> Bool {
            guard c < 0x80 else { return false }
            let digit = (0x30...0x39).contains(c), lower = (0x61...0x7A).contains(c), upper = (0x41...0x5A).contains(c)
            switch self {
            case .alnum: return digit || lower || upper
            case .alpha: return lower || upper
            case .blank: return c == 0x20 || c == 0x09
            case .cntrl: return c < 0x20 || c == 0x7F
            case .digit: return digit
            case .graph: return (0x21...0x7E).contains(c)
            case .lower: return lower
            case .print: return (0x20...0x7E).contains(c)
            case .punct: return (0x21...0x7E).contains(c) && !(digit || lower || upper)
            case .space: return c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D  // git's isspace: no \v, \f
            case .upper: return upper
            case .xdigit: return digit || (0x41...0x46).contains(c) || (0x61...0x66).contains(c)
            }
        }
    }

    enum Failure: Error {
        case trailingBackslash, unclosedSet, unknownClass(String)
        var message: String {
            switch self {
            case .trailingBackslash: return #"ends with a "\" that escapes nothing"#
            case .unclosedSet: return #""[" without a closing "]""#
            case .unknownClass(let name): return #"unknown character class "[:\#(name):]""#
            }
        }
    }

    private enum Program: Sendable, Hashable {
        case exact([UInt32])       // no wildcard
        case suffix([UInt32])      // "*" then no wildcard, in a name
        case tokens([Token])
    }

    private let program: Program

    /// Compiles a pattern without its "!", its final "/" and (if anchored) its first "/".
    /// `pathname`: matched against a path (a "/" matches the separator, `**` is special),
    /// otherwise against one name.
    static func compile(_ p: ArraySlice<UInt32>, pathname: Bool) -> Result<Glob, Failure> {
        let p = Array(p)
        var tokens: [Token] = []
        var i = 0
        while i < p.count {
            let c = p[i]
            switch c {
            case Ch.backslash:
                guard i + 1 < p.count else { return .failure(.trailingBackslash) }
                tokens.append(.literal(p[i + 1] == Ch.slash ? separator : p[i + 1]))
                i += 2
            case Ch.question:
                tokens.append(.one)
                i += 1
            case Ch.star:
                var j = i
                while j < p.count, p[j] == Ch.star { j += 1 }
                // "**" is special at the start or after a "/", and at the end or before a "/".
                if pathname, j - i >= 2, i == 0 || p[i - 1] == Ch.slash {
                    if j == p.count {
                        tokens.append(.starAny)  // "/**": everything inside
                        i = j
                        continue
                    }
                    if p[j] == Ch.slash {
                        // "**/": zero folders (jump past the "/"), or any run of names then a "/".
                        tokens.append(.fork(tokens.count + 3))
                        tokens.append(.starAny)
                        tokens.append(.literal(separator))
                        i = j + 1
                        continue
                    }
                    if p[j] == Ch.backslash, j + 1 < p.count, p[j + 1] == Ch.slash {
                        tokens.append(.starAny)  // "**\/": git does not try zero folders here
                        i = j
                        continue
                    }
                }
                tokens.append(.star)  // other runs of "*" are one "*"
                i = j
            case Ch.open:
                switch parseSet(p, at: i) {
                case .success(let (set, end)):
                    tokens.append(.set(set))
                    i = end
                case .failure(let f):
                    return .failure(f)
                }
            default:
                tokens.append(.literal(c == Ch.slash ? separator : c))
                i += 1
            }
        }
        var literals: [UInt32] = []
        for token in tokens { if case .literal(let x) = token { literals.append(x) } }
        if literals.count == tokens.count {
            return .success(Glob(program: .exact(literals)))
        }
        if !pathname, tokens.first == .star, literals.count == tokens.count - 1 {
            return .success(Glob(program: .suffix(literals)))
        }
        return .success(Glob(program: .tokens(tokens)))
    }

    /// A bracket expression at `p[start] == "["`, as git's wildmatch reads it: "!" or "^" first
    /// negates; a "]" first is a member; "a-z" ranges; "\" escapes; "[:alpha:]" and the other
    /// POSIX classes. Returns the set and the index after its "]".
    private static func parseSet(_ p: [UInt32], at start: Int) -> Result<(CharSet, Int), Failure> {
        var j = start + 1
        guard j < p.count else { return .failure(.unclosedSet) }
        var set = CharSet(negated: false, items: [])
        if p[j] == Ch.bang || p[j] == Ch.caret {
            set.negated = true
            j += 1
        }
        var previous: UInt32? = nil  // the last single member, which a "-" can start a range from
        while true {
            guard j < p.count else { return .failure(.unclosedSet) }
            let c = p[j]
            if c == Ch.backslash {
                j += 1
                guard j < p.count else { return .failure(.unclosedSet) }
                set.items.append(.char(p[j]))
                previous = p[j]
            } else if c == Ch.dash, let low = previous, j + 1 < p.count, p[j + 1] != Ch.close {
                j += 1
                var high = p[j]
                if high == Ch.backslash {
                    j += 1
                    guard j < p.count else { return .failure(.unclosedSet) }
                    high = p[j]
                }
                set.items.append(.range(low, high))
                previous = nil
            } else if c == Ch.open, j + 1 < p.count, p[j + 1] == Ch.colon {
                let nameStart = j + 2
                var k = nameStart
                while k < p.count, p[k] != Ch.close { k += 1 }
                guard k < p.count else { return .failure(.unclosedSet) }
                if k == nameStart || p[k - 1] != Ch.colon {
                    set.items.append(.char(Ch.open))  // no ":]": the "[" is a member
                    previous = Ch.open
                } else {
                    var name = String.UnicodeScalarView()
                    for v in p[nameStart..<(k - 1)] { if let s = Unicode.Scalar(v) { name.append(s) } }
                    guard let posix = Posix(rawValue: String(name)) else {
                        return .failure(.unknownClass(String(name)))
                    }
                    set.items.append(.posix(posix))
                    previous = nil
                    j = k
                }
            } else {
                set.items.append(.char(c))
                previous = c
            }
            j += 1
            guard j < p.count else { return .failure(.unclosedSet) }
            if p[j] == Ch.close { return .success((set, j + 1)) }
        }
    }

    /// Whether the whole of `text` matches.
    func matches(_ text: ArraySlice<UInt32>) -> Bool {
        switch program {
        case .exact(let literal):
            return text.elementsEqual(literal)
        case .suffix(let literal):
            return text.count >= literal.count && text.suffix(literal.count).elementsEqual(literal)
        case .tokens(let tokens):
            return Self.run(tokens, on: text)
        }
    }

    /// The NFA: `current[i]` says the text so far can bring the pattern to token i
    /// (`tokens.count` = the end). Every transition goes forward or stays, so the set can be
    /// closed over its empty moves in one pass, and its lowest member never goes back.
    private static func run(_ tokens: [Token], on text: ArraySlice<UInt32>) -> Bool {
        let end = tokens.count
        var current = [Bool](repeating: false, count: end + 1)
        var next = current
        current[0] = true
        close(&current, tokens, from: 0)
        var low = 0
        for c in text {
            var nextLow = end + 1
            for i in low..<end where current[i] {
                current[i] = false
                var to = -1
                switch tokens[i] {
                case .literal(let x): if c == x { to = i + 1 }
                case .one: if c != separator { to = i + 1 }
                case .set(let set): if set.contains(c) { to = i + 1 }
                case .star: if c != separator { to = i }
                case .starAny: to = i
                case .fork: break
                }
                if to >= 0 {
                    next[to] = true
                    if to < nextLow { nextLow = to }
                }
            }
            current[end] = false
            if nextLow > end { return false }
            close(&next, tokens, from: nextLow)
            swap(&current, &next)
            low = nextLow
        }
        return current[end]
    }

    private static func close(_ states: inout [Bool], _ tokens: [Token], from low: Int) {
        for i in low..<tokens.count where states[i] {
            switch tokens[i] {
            case .star, .starAny: states[i + 1] = true
            case .fork(let target):
                states[i + 1] = true
                states[target] = true
            default: break
            }
        }
    }
}
