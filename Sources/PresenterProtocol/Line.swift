import Foundation

/// Framing: one JSON object per line, UTF-8, `\n`-terminated (docs/presenters.md "Framing").
public enum PresenterLine {
    /// The longest line either side reads; a peer that sends more without a newline is dropped.
    public static let maxLength = 1 << 20

    /// `message` as one line: compact JSON (a newline inside a string is escaped, so the only
    /// newline is the terminator), keys sorted so equal messages are equal bytes, `/` unescaped.
    /// Nil only if the encoder fails, which these messages cannot make it do.
    public static func encode(_ message: some Encodable) -> [UInt8]? {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        guard var bytes = try? [UInt8](encoder.encode(message)) else { return nil }
        bytes.append(UInt8(ascii: "\n"))
        return bytes
    }
}

/// What is wrong with one field of a line: missing, or not of the type the protocol says.
public struct FieldError: Error, Equatable, Sendable, CustomStringConvertible {
    public let field: String
    /// "an integer", "a string", …; nil: the field is missing.
    public let expected: String?

    public var description: String {
        if let expected { return "\(field) must be \(expected)" }
        return "\(field) is missing"
    }
}

/// A type that can stand in a field, with the words an error uses for it.
public protocol WireField: Decodable {
    static var expected: String { get }
}
extension Int: WireField { public static var expected: String { "an integer" } }
extension UInt64: WireField { public static var expected: String { "a non-negative integer" } }
extension String: WireField { public static var expected: String { "a string" } }
extension Bool: WireField { public static var expected: String { "true or false" } }
extension Token: WireField { public static var expected: String { "an integer" } }
extension AskID: WireField { public static var expected: String { "an integer" } }

extension KeyedDecodingContainer {
    /// A required field; a missing, `null` or wrongly typed one throws a `FieldError` naming it.
    /// A number that does not fit the type (1e300, 2^63) counts as wrongly typed.
    func field<T: WireField>(_ key: Key) throws -> T {
        guard contains(key) else { throw FieldError(field: key.stringValue, expected: nil) }
        do {
            return try decode(T.self, forKey: key)
        } catch {  // a DecodingError, or the parser's own error for a number that does not fit
            throw FieldError(field: key.stringValue, expected: T.expected)
        }
    }

    /// An optional field: nil when missing or `null`; a wrongly typed one throws a `FieldError`.
    func optionalField<T: WireField>(_ key: Key) throws -> T? {
        do {
            return try decodeIfPresent(T.self, forKey: key)
        } catch {  // a DecodingError, or the parser's own error for a number that does not fit
            throw FieldError(field: key.stringValue, expected: T.expected)
        }
    }

    /// An optional field that is nil when it is of the wrong type too: for what a newer peer may
    /// send differently, where ignoring is the right answer.
    func lenientField<T: WireField>(_ key: Key) -> T? {
        (try? decodeIfPresent(T.self, forKey: key)) ?? nil
    }
}

/// The keys of every message, requests and the daemon's lines alike.
enum WireKey: String, CodingKey {
    case op, version, pid, name, token, path, ask, error
    case re, ok, late
    case kind, reason
    case event, origin, to, seq
}
