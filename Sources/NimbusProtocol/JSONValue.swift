/// Any JSON value, kept verbatim. Used for the `extra` object of an item, where fields that this
/// build does not know (written by newer clients) travel and are preserved (docs/protocol.md "Items and versions").
public enum JSONValue: Hashable, Sendable, Codable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// The deepest coding path a value is decoded at. Each failed guess below costs an error that
    /// carries the whole path, so an unbounded depth would cost quadratic time; `extra` itself is
    /// held to `WireRange.extraDepth` levels, and sits at most four levels into any document.
    public static let maxDecodingPath = 64

    public init(from decoder: any Decoder) throws {
        if decoder.codingPath.count > Self.maxDecodingPath {
            throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "JSON nested deeper than \(Self.maxDecodingPath) levels"))
        }
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let n = try? c.decode(Double.self) { self = .number(n) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([JSONValue].self) { self = .array(a) }
        else { self = .object(try c.decode([String: JSONValue].self)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .number(let n): try c.encode(n)
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }
}
