/// A validated name of an item inside its folder.
///
/// Rules: not empty, not `.` or `..`, no `/`, no NUL, at most 255 bytes of
/// UTF-8. Swift strings are always valid Unicode, so invalid UTF-8 is rejected where bytes become a
/// string (the JSON decoder, the FUSE layer), never here.
///
/// Names compare by their bytes, as Linux filesystems do: `é` written precomposed (NFC) and as `e`
/// plus a combining accent (NFD) are two names, two items (Swift's `String ==` would call them
/// one). Use `ItemName.same` where two names as `String`s are compared.
public struct ItemName: Hashable, Sendable, Codable, CustomStringConvertible {
    public let value: String
    public static let maxBytes = 255
    /// The name every mount shows at the top of a container for its control folder: no item
    /// there may have it (the server refuses it; a mount does not show one).
    public static let controlFolder = ".nimbus"

    public static func == (a: ItemName, b: ItemName) -> Bool { same(a.value, b.value) }
    public func hash(into h: inout Hasher) { Self.hashBytes(value, into: &h) }

    /// Whether two names are the same bytes.
    @inlinable public static func same(_ a: String, _ b: String) -> Bool { a.utf8.elementsEqual(b.utf8) }

    /// Hashes the bytes of `s` (for keys compared with `same`).
    public static func hashBytes(_ s: String, into h: inout Hasher) {
        var s = s
        s.withUTF8 { h.combine(bytes: UnsafeRawBufferPointer($0)) }
    }

    public enum Problem: Error, Equatable, Sendable, CustomStringConvertible {
        case empty, dot, dotDot, slash, nul, tooLong(bytes: Int)
        public var description: String {
            switch self {
            case .empty: return "a name cannot be empty"
            case .dot: return "a name cannot be \".\""
            case .dotDot: return "a name cannot be \"..\""
            case .slash: return "a name cannot contain \"/\""
            case .nul: return "a name cannot contain a NUL byte"
            case .tooLong(let n): return "a name can be at most 255 bytes of UTF-8 (this one has \(n))"
            }
        }
    }

    public static func validate(_ s: String) -> Problem? {
        let bytes = s.utf8
        if bytes.isEmpty { return .empty }
        if s == "." { return .dot }
        if s == ".." { return .dotDot }
        if bytes.contains(UInt8(ascii: "/")) { return .slash }
        if bytes.contains(0) { return .nul }
        if bytes.count > maxBytes { return .tooLong(bytes: bytes.count) }
        return nil
    }

    public init(_ s: String) throws(Problem) {
        if let p = ItemName.validate(s) { throw p }
        value = s
    }

    /// For names already validated (read back from our own database).
    public init(trusted s: String) { value = s }

    public var description: String { value }

    public init(from decoder: any Decoder) throws {
        let s = try decoder.singleValueContainer().decode(String.self)
        if let p = ItemName.validate(s) {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "invalid name: \(p)"))
        }
        value = s
    }
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(value)
    }

    /// The name to use when `self` is taken in the folder: `report.txt` → `report 2.txt`, then
    /// `report 3.txt`… The extension is the part after the last dot that is not the first
    /// character (`.bashrc` has none). The stem is shortened so the result stays within 255 bytes.
    public func deduplicated(isTaken: (String) throws -> Bool) rethrows -> ItemName {
        if try !isTaken(value) { return self }
        let (stem, ext) = ItemName.split(value)
        var n = 2
        while true {
            let suffix = " \(n)" + ext
            var s = stem
            while s.utf8.count + suffix.utf8.count > ItemName.maxBytes, !s.isEmpty { s.removeLast() }
            let candidate = s + suffix
            if try !isTaken(candidate), ItemName.validate(candidate) == nil { return ItemName(trusted: candidate) }
            n += 1
        }
    }

    /// Whether `name` is what `deduplicated` makes of `asked` (`a.txt` → `a 2.txt`, `a 3.txt`…,
    /// the stem cut to fit 255 bytes).
    public static func isTakenName(_ name: String, of asked: String) -> Bool {
        let (stem, ext) = split(asked)
        guard name.hasSuffix(ext) else { return false }
        let body = name.dropLast(ext.count)
        guard let space = body.lastIndex(of: " "), let n = Int(body[body.index(after: space)...]), n >= 2,
              String(n) == body[body.index(after: space)...] else { return false }
        let s = String(body[..<space])
        return s == stem || (!s.isEmpty && stem.hasPrefix(s) && name.utf8.count > maxBytes - 16)
    }

    static func split(_ name: String) -> (stem: String, ext: String) {
        guard let dot = name.lastIndex(of: "."), dot != name.startIndex else { return (name, "") }
        let ext = String(name[dot...])
        // Long "extensions" are not extensions (e.g. "notes.final version of the draft").
        if ext.utf8.count > 16 || ext.contains(" ") { return (name, "") }
        return (String(name[..<dot]), ext)
    }
}
