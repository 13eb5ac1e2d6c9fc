import Foundation
import NimbusCore

/// Hand-written readers for the two documents a first sync moves by the hundred thousand: the
/// listing's pages (`ItemsResponse`, read by the client) and the stored item states
/// (`ItemState`, read by the server for every listed item). `JSONDecoder` was most of the
/// client's listing time and a quarter of the server's.
///
/// They accept what `JSONDecoder` accepts for these types in the documents our encoders write,
/// and return the same values (`FastJSONTests` compares them on random records, names of every
/// kind included). Anything they are not sure of — a number with a fraction or exponent, a lone
/// surrogate escape, bytes that are not UTF-8, a missing field — throws, and the callers
/// (`decodeItemsResponse`, `decodeItemState`) then ask `JSONDecoder`, so the error (or the
/// value) is always the standard one.
extension FastJSON {
    /// A listing page, fast when possible, else by `JSONDecoder`.
    public static func decodeItemsResponse(_ bytes: [UInt8]) throws -> ItemsResponse {
        if let page = try? fastItemsResponse(bytes) { return page }
        return try JSONDecoder().decode(ItemsResponse.self, from: Data(bytes))
    }

    /// A stored item state, fast when possible, else by `JSONDecoder`.
    public static func decodeItemState(_ text: String) throws -> ItemState {
        let bytes = Array(text.utf8)
        if let s = try? fastItemState(bytes) { return s }
        return try JSONDecoder().decode(ItemState.self, from: Data(bytes))
    }

    /// A stored journal record (`encode(record:)`), fast when possible, else by `JSONDecoder`.
    public static func decodeItemRecord(_ text: String) throws -> ItemRecord {
        let bytes = Array(text.utf8)
        if let r = try? fastItemRecord(bytes) { return r }
        return try JSONDecoder().decode(ItemRecord.self, from: Data(bytes))
    }

    // MARK: the documents

    static func fastItemRecord(_ bytes: [UInt8]) throws -> ItemRecord {
        var s = JSONScanner(bytes)
        let r = try itemRecord(&s)
        try s.end()
        return r
    }

    static func fastItemsResponse(_ bytes: [UInt8]) throws -> ItemsResponse {
        var s = JSONScanner(bytes)
        var items: [ItemRecord]?
        var cursor: Int64?
        var next: ItemID?
        var seen1: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
        try s.object { s, key in
            switch key {
            case "items":
                try first(&seen1, 0)
                var out: [ItemRecord] = []
                try s.array { s in out.append(try itemRecord(&s)) }
                items = out
            case "cursor": try first(&seen1, 1); cursor = try s.int64()
            case "next": try first(&seen1, 2); next = try s.isNull() ? nil : try itemID(&s)
            default: try s.skipValue()
            }
        }
        try s.end()
        guard let items, let cursor else { throw JSONScanner.Failure() }
        return ItemsResponse(items: items, cursor: cursor, next: next)
    }

    static func itemRecord(_ s: inout JSONScanner) throws -> ItemRecord {
        var id: ItemID?, version: Int64?, kind: ItemKind?, parent: ItemID?, name: ItemName?, size: Int64?
        var chunks: [ChunkRef]?, target: String?, mode: UInt32?, modified: Int64?, by: DeviceID?, deleted: Bool?
        var conflicts: Int?, extraRaw: ArraySlice<UInt8>?
        var seen2: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
        try s.object { s, key in
            switch key {
            case "id": try first(&seen2, 0); id = try itemID(&s)
            case "version": try first(&seen2, 1); version = try s.int64()
            case "kind": try first(&seen2, 2); kind = try itemKind(&s)
            case "parent": try first(&seen2, 3); parent = try itemID(&s)
            case "name": try first(&seen2, 4); name = try ItemName(s.string())
            case "size": try first(&seen2, 5); size = try s.int64()
            case "chunks": try first(&seen2, 6); chunks = try chunkList(&s)
            case "symlinkTarget": try first(&seen2, 7); target = try s.isNull() ? nil : try s.string()
            case "mode": try first(&seen2, 8); mode = try uint32(&s)
            case "modified": try first(&seen2, 9); modified = try s.int64()
            case "modifiedBy": try first(&seen2, 10); by = try deviceID(&s)
            case "deleted": try first(&seen2, 11); deleted = try s.bool()
            case "conflicts": try first(&seen2, 12); conflicts = Int(try s.int64())
            case "extra": try first(&seen2, 13); extraRaw = try s.isNull() ? nil : try s.rawValue()
            default: try s.skipValue()
            }
        }
        guard let id, let version, let kind, let parent, let name, let size, let chunks, let mode, let modified, let by,
              let deleted, let conflicts else { throw JSONScanner.Failure() }
        let state = ItemState(kind: kind, location: ItemLocation(parent: parent, name: name),
                              content: ItemContent(chunks: chunks, symlinkTarget: target), mode: mode,
                              modified: modified, modifiedBy: by, deleted: deleted)
        var r = ItemRecord(id: id, version: version, state: state, conflicts: conflicts)
        r.size = size
        // Rare: the standard decoder for the free-form part.
        if let extraRaw { r.extra = try JSONDecoder().decode(JSONValue.self, from: Data(extraRaw)) }
        return r
    }

    static func fastItemState(_ bytes: [UInt8]) throws -> ItemState {
        var s = JSONScanner(bytes)
        var kind: ItemKind?, location: ItemLocation?, content: ItemContent?, mode: UInt32?, modified: Int64?
        var by: DeviceID?, deleted: Bool?, extra: String?
        var seen3: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
        try s.object { s, key in
            switch key {
            case "kind": try first(&seen3, 0); kind = try itemKind(&s)
            case "location":
                try first(&seen3, 1)
                var parent: ItemID?, name: ItemName?
                var seen4: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
                try s.object { s, key in
                    switch key {
                    case "parent": try first(&seen4, 0); parent = try itemID(&s)
                    case "name": try first(&seen4, 1); name = try ItemName(s.string())
                    default: try s.skipValue()
                    }
                }
                guard let parent, let name else { throw JSONScanner.Failure() }
                location = ItemLocation(parent: parent, name: name)
            case "content":
                try first(&seen3, 2)
                var chunks: [ChunkRef]?, target: String?
                var seen5: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
                try s.object { s, key in
                    switch key {
                    case "chunks": try first(&seen5, 0); chunks = try chunkList(&s)
                    case "symlinkTarget": try first(&seen5, 1); target = try s.isNull() ? nil : try s.string()
                    default: try s.skipValue()
                    }
                }
                guard let chunks else { throw JSONScanner.Failure() }
                content = ItemContent(chunks: chunks, symlinkTarget: target)
            case "mode": try first(&seen3, 3); mode = try uint32(&s)
            case "modified": try first(&seen3, 4); modified = try s.int64()
            case "modifiedBy": try first(&seen3, 5); by = try deviceID(&s)
            case "deleted": try first(&seen3, 6); deleted = try s.bool()
            case "extra": try first(&seen3, 7); extra = try s.isNull() ? nil : try s.string()
            default: try s.skipValue()
            }
        }
        try s.end()
        guard let kind, let location, let content, let mode, let modified, let by, let deleted else { throw JSONScanner.Failure() }
        return ItemState(kind: kind, location: location, content: content, mode: mode, modified: modified,
                         modifiedBy: by, deleted: deleted, extra: extra)
    }

    // MARK: fields

    /// Marks field `bit` as read; a field read twice throws.
    static func first(_ seen: inout UInt32, _ bit: UInt32) throws {
        guard seen & (1 << bit) == 0 else { throw JSONScanner.Failure() }
        seen |= 1 << bit
    }

    static func chunkList(_ s: inout JSONScanner) throws -> [ChunkRef] {
        var out: [ChunkRef] = []
        try s.array { s in
            var hash: ContentHash?, size: Int64?
            var seen6: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
            try s.object { s, key in
                switch key {
                case "hash": try first(&seen6, 0); hash = ContentHash(hex: try s.string())
                case "size": try first(&seen6, 1); size = try s.int64()
                default: try s.skipValue()
                }
            }
            guard let hash, let size else { throw JSONScanner.Failure() }
            out.append(ChunkRef(hash: hash, size: size))
        }
        return out
    }

    static func itemID(_ s: inout JSONScanner) throws -> ItemID {
        guard let id = ItemID(try s.string()) else { throw JSONScanner.Failure() }
        return id
    }

    static func deviceID(_ s: inout JSONScanner) throws -> DeviceID {
        guard let id = DeviceID(try s.string()) else { throw JSONScanner.Failure() }
        return id
    }

    static func itemKind(_ s: inout JSONScanner) throws -> ItemKind {
        guard let k = ItemKind(rawValue: try s.string()) else { throw JSONScanner.Failure() }
        return k
    }

    static func uint32(_ s: inout JSONScanner) throws -> UInt32 {
        guard let v = UInt32(exactly: try s.int64()) else { throw JSONScanner.Failure() }
        return v
    }
}

/// A forward-only JSON reader over bytes: exactly what the readers above need, strict where
/// strictness is cheap, and throwing (the caller falls back to `JSONDecoder`) where not.
struct JSONScanner {
    struct Failure: Error {}

    let b: [UInt8]
    var i = 0
    /// Objects and arrays open around the reader: a hostile document nested deeper than
    /// `maxDepth` throws (the standard decoder then refuses it) instead of overflowing the stack.
    var depth = 0
    static let maxDepth = 64

    init(_ bytes: [UInt8]) { b = bytes }

    private mutating func enter() throws {
        depth += 1
        guard depth <= Self.maxDepth else { throw Failure() }
    }

    mutating func ws() {
        while i < b.count, b[i] == 0x20 || b[i] == 0x0A || b[i] == 0x0D || b[i] == 0x09 { i += 1 }
    }

    mutating func take(_ c: UInt8) throws {
        ws()
        guard i < b.count, b[i] == c else { throw Failure() }
        i += 1
    }

    /// Only whitespace is left.
    mutating func end() throws {
        ws()
        guard i == b.count else { throw Failure() }
    }

    /// `{ "key": value, … }`: `body` reads each value (and must consume it).
    mutating func object(_ body: (inout JSONScanner, String) throws -> Void) throws {
        try take(UInt8(ascii: "{"))
        try enter()
        defer { depth -= 1 }
        ws()
        if i < b.count, b[i] == UInt8(ascii: "}") { i += 1; return }
        while true {
            let key = try string()
            try take(UInt8(ascii: ":"))
            try body(&self, key)
            ws()
            guard i < b.count else { throw Failure() }
            if b[i] == UInt8(ascii: ",") { i += 1; continue }
            if b[i] == UInt8(ascii: "}") { i += 1; return }
            throw Failure()
        }
    }

    /// `[ value, … ]`: `body` reads each element.
    mutating func array(_ body: (inout JSONScanner) throws -> Void) throws {
        try take(UInt8(ascii: "["))
        try enter()
        defer { depth -= 1 }
        ws()
        if i < b.count, b[i] == UInt8(ascii: "]") { i += 1; return }
        while true {
            try body(&self)
            ws()
            guard i < b.count else { throw Failure() }
            if b[i] == UInt8(ascii: ",") { i += 1; continue }
            if b[i] == UInt8(ascii: "]") { i += 1; return }
            throw Failure()
        }
    }

    /// Consumes `null` when it is next.
    mutating func isNull() throws -> Bool {
        ws()
        guard i + 4 <= b.count, b[i] == UInt8(ascii: "n") else { return false }
        guard b[i + 1] == UInt8(ascii: "u"), b[i + 2] == UInt8(ascii: "l"), b[i + 3] == UInt8(ascii: "l") else { throw Failure() }
        i += 4
        return true
    }

    mutating func bool() throws -> Bool {
        ws()
        if i + 4 <= b.count, b[i ..< i + 4].elementsEqual("true".utf8) { i += 4; return true }
        if i + 5 <= b.count, b[i ..< i + 5].elementsEqual("false".utf8) { i += 5; return false }
        throw Failure()
    }

    /// An integer without fraction or exponent (those throw: the fallback decides).
    mutating func int64() throws -> Int64 {
        ws()
        var negative = false
        if i < b.count, b[i] == UInt8(ascii: "-") { negative = true; i += 1 }
        let start = i
        var v: Int64 = 0
        while i < b.count, b[i] >= 48, b[i] <= 57 {
            let (m, o1) = v.multipliedReportingOverflow(by: 10)
            let (a, o2) = negative ? m.subtractingReportingOverflow(Int64(b[i] - 48)) : m.addingReportingOverflow(Int64(b[i] - 48))
            guard !o1, !o2 else { throw Failure() }
            v = a
            i += 1
        }
        guard i > start, i - start == 1 || b[start] != 48 else { throw Failure() }  // no leading zeros
        if i < b.count, b[i] == UInt8(ascii: ".") || b[i] == UInt8(ascii: "e") || b[i] == UInt8(ascii: "E") { throw Failure() }
        return v
    }

    /// A string; escapes decoded. Lone surrogates, control characters and bytes that are not
    /// UTF-8 throw.
    mutating func string() throws -> String {
        try take(UInt8(ascii: "\""))
        let start = i
        // The common case: no escape, straight to a String.
        while i < b.count, b[i] != UInt8(ascii: "\""), b[i] != UInt8(ascii: "\\") {
            guard b[i] >= 0x20 else { throw Failure() }
            i += 1
        }
        guard i < b.count else { throw Failure() }
        if b[i] == UInt8(ascii: "\"") {
            defer { i += 1 }
            guard let s = String(validating: b[start ..< i], as: UTF8.self) else { throw Failure() }
            return s
        }
        var out = Array(b[start ..< i])
        while true {
            guard i < b.count else { throw Failure() }
            let c = b[i]
            if c == UInt8(ascii: "\"") { i += 1; break }
            if c < 0x20 { throw Failure() }
            if c != UInt8(ascii: "\\") { out.append(c); i += 1; continue }
            guard i + 1 < b.count else { throw Failure() }
            let e = b[i + 1]
            i += 2
            switch e {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): out.append(e)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = try hex4()
                if scalar >= 0xD800, scalar < 0xDC00 {
                    // A high surrogate must be followed by an escaped low one.
                    guard i + 1 < b.count, b[i] == UInt8(ascii: "\\"), b[i + 1] == UInt8(ascii: "u") else { throw Failure() }
                    i += 2
                    let low = try hex4()
                    guard low >= 0xDC00, low < 0xE000 else { throw Failure() }
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                } else if scalar >= 0xDC00, scalar < 0xE000 {
                    throw Failure()
                }
                guard let u = Unicode.Scalar(scalar) else { throw Failure() }
                out.append(contentsOf: Array(String(Character(u)).utf8))
            default: throw Failure()
            }
        }
        guard let s = String(validating: out, as: UTF8.self) else { throw Failure() }
        return s
    }

    private mutating func hex4() throws -> UInt32 {
        guard i + 4 <= b.count else { throw Failure() }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let c = b[i]
            let d: UInt32
            switch c {
            case 48...57: d = UInt32(c - 48)
            case 97...102: d = UInt32(c - 87)
            case 65...70: d = UInt32(c - 55)
            default: throw Failure()
            }
            v = v << 4 | d
            i += 1
        }
        return v
    }

    /// Skips one value of any kind.
    mutating func skipValue() throws {
        _ = try rawValue()
    }

    /// The bytes of one value of any kind (checked only as far as finding its end).
    mutating func rawValue() throws -> ArraySlice<UInt8> {
        ws()
        guard i < b.count else { throw Failure() }
        let start = i
        switch b[i] {
        case UInt8(ascii: "\""): _ = try string()
        case UInt8(ascii: "{"): try object { s, _ in try s.skipValue() }
        case UInt8(ascii: "["): try array { s in try s.skipValue() }
        case UInt8(ascii: "t"), UInt8(ascii: "f"): _ = try bool()
        case UInt8(ascii: "n"): guard try isNull() else { throw Failure() }
        default:
            // A number of any form.
            while i < b.count, b[i] == UInt8(ascii: "-") || b[i] == UInt8(ascii: "+") || b[i] == UInt8(ascii: ".")
                    || b[i] == UInt8(ascii: "e") || b[i] == UInt8(ascii: "E") || (b[i] >= 48 && b[i] <= 57) { i += 1 }
            guard i > start else { throw Failure() }
        }
        return b[start ..< i]
    }
}
