import Foundation

/// The identity of an item (file, folder or symlink). It never changes: renames and moves keep it,
/// and the path is derived from the parent chain.
public struct ItemID: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    public let uuid: UUID

    public init(_ uuid: UUID) { self.uuid = uuid }

    /// Parses the canonical textual form (any case); `nil` if it is not a UUID.
    public init?(_ string: String) {
        guard let uuid = UUIDText.parse(string) else { return nil }
        self.uuid = uuid
    }

    /// The root folder of every container. It is never stored as an item and never changes.
    public static let root = ItemID(UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))

    public var isRoot: Bool { self == .root }
    /// Lower-case canonical form, the one used on the wire and in databases.
    public var description: String { UUIDText.format(uuid) }

    public static func < (a: ItemID, b: ItemID) -> Bool { UUIDText.less(a.uuid, b.uuid) }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let id = ItemID(text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not an item id (UUID): \(text.prefix(64))"))
        }
        self = id
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(description)
    }
}

/// The identity of one client install. Stable for the life of the install; used to break ties
/// in the conflict rule, so it must be comparable.
public struct DeviceID: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    public let uuid: UUID
    public init(_ uuid: UUID) { self.uuid = uuid }
    public init?(_ string: String) {
        guard let uuid = UUIDText.parse(string) else { return nil }
        self.uuid = uuid
    }
    public var description: String { UUIDText.format(uuid) }
    public static func < (a: DeviceID, b: DeviceID) -> Bool { UUIDText.less(a.uuid, b.uuid) }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let id = DeviceID(text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not a device id (UUID)"))
        }
        self = id
    }
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(description)
    }
}

/// A SHA-256 digest in lower-case hex: the address of a chunk.
public struct ContentHash: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    public let hex: String

    /// Accepts exactly 64 hex digits (any case); anything else is `nil`.
    public init?(hex: String) {
        let lower = hex.lowercased()
        guard lower.utf8.count == 64, lower.utf8.allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) }) else {
            return nil
        }
        self.hex = lower
    }

    /// Builds the hash from a raw 32-byte digest.
    public init(digest: some Sequence<UInt8>) {
        let table = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(64)
        for b in digest {
            out.append(table[Int(b >> 4)])
            out.append(table[Int(b & 0x0f)])
        }
        self.hex = String(decoding: out, as: UTF8.self)
    }

    public var description: String { hex }
    public static func < (a: ContentHash, b: ContentHash) -> Bool { a.hex < b.hex }

    public init(from decoder: any Decoder) throws {
        let text = try decoder.singleValueContainer().decode(String.self)
        guard let h = ContentHash(hex: text) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "not a SHA-256 hex digest"))
        }
        self = h
    }
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        try c.encode(hex)
    }
}

/// The textual form of UUIDs, by hand: Foundation formats with `snprintf` and parses with
/// `sscanf`, and ids are formatted and parsed for every row, page and comparison — a few percent
/// of a first sync of 100,000 items. Same results: `format` gives `uuidString.lowercased()`,
/// `parse` accepts what `UUID(uuidString:)` accepts (`IdentifierTests`).
enum UUIDText {
    static func format(_ u: UUID) -> String {
        let digits: StaticString = "0123456789abcdef"
        return withUnsafeBytes(of: u.uuid) { raw in
            String(unsafeUninitializedCapacity: 36) { out in
                digits.withUTF8Buffer { hex in
                    var o = 0
                    for (k, byte) in raw.enumerated() {
                        if k == 4 || k == 6 || k == 8 || k == 10 { out[o] = UInt8(ascii: "-"); o += 1 }
                        out[o] = hex[Int(byte >> 4)]
                        out[o + 1] = hex[Int(byte & 0x0f)]
                        o += 2
                    }
                    return o
                }
            }
        }
    }

    /// The 36-character form with dashes, hex digits of any case (what `uuid_parse` takes).
    static func parse(_ s: String) -> UUID? {
        var s = s
        return s.withUTF8 { b -> UUID? in
            guard b.count == 36 else { return nil }
            var u = ItemID.root.uuid.uuid  // (zeros; overwritten)
            let ok = withUnsafeMutableBytes(of: &u) { out -> Bool in
                var o = 0, k = 0
                while k < 36 {
                    if k == 8 || k == 13 || k == 18 || k == 23 {
                        guard b[k] == UInt8(ascii: "-") else { return false }
                        k += 1
                        continue
                    }
                    guard let hi = nibble(b[k]), let lo = nibble(b[k + 1]) else { return false }
                    out[o] = hi << 4 | lo
                    o += 1
                    k += 2
                }
                return true
            }
            return ok ? UUID(uuid: u) : nil
        }
    }

    /// The order of the lower-case text (fixed width, digits before letters): the bytes' order.
    static func less(_ a: UUID, _ b: UUID) -> Bool {
        withUnsafeBytes(of: a.uuid) { x in withUnsafeBytes(of: b.uuid) { y in x.lexicographicallyPrecedes(y) } }
    }

    private static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case 48...57: return c - 48
        case 97...102: return c - 87
        case 65...70: return c - 55
        default: return nil
        }
    }
}

/// A position in a container's journal. Versions are numbered by the same sequence.
public typealias Sequence64 = Int64
