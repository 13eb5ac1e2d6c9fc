import Foundation
import NimbusCore

/// Hand-written JSON for the documents the server writes most: the listing's pages (`GET items`),
/// commit answers, stored item states and journal records. The same documents `JSONEncoder` makes
/// (keys in another order, which JSON does not care about), about ten times faster. With
/// `JSONEncoder` these documents take half of the server's time in a first sync of 100,000 items
/// and a third of a small commit.
/// (`FastJSONTests` decodes it with `JSONDecoder` and compares, names of every kind included.)
public enum FastJSON {
    public static func encode(_ page: ItemsResponse) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(256 + page.items.count * 300)
        out.append(contentsOf: #"{"cursor":"#.utf8)
        int(page.cursor, &out)
        if let next = page.next {
            out.append(contentsOf: #","next":"#.utf8)
            string(next.description, &out)
        }
        out.append(contentsOf: #","items":["#.utf8)
        for (i, item) in page.items.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            encode(item, &out)
        }
        out.append(contentsOf: "]}".utf8)
        return out
    }

    public static func encode(_ r: ItemRecord, _ out: inout [UInt8]) {
        out.append(contentsOf: #"{"id":"#.utf8)
        string(r.id.description, &out)
        out.append(contentsOf: #","version":"#.utf8)
        int(r.version, &out)
        out.append(contentsOf: #","kind":"#.utf8)
        string(r.kind.rawValue, &out)
        out.append(contentsOf: #","parent":"#.utf8)
        string(r.parent.description, &out)
        out.append(contentsOf: #","name":"#.utf8)
        string(r.name.value, &out)
        out.append(contentsOf: #","size":"#.utf8)
        int(r.size, &out)
        out.append(contentsOf: #","chunks":"#.utf8)
        content(r.chunks, r.symlinkTarget, &out)
        out.append(contentsOf: #","mode":"#.utf8)
        int(Int64(r.mode), &out)
        out.append(contentsOf: #","modified":"#.utf8)
        int(r.modified, &out)
        out.append(contentsOf: #","modifiedBy":"#.utf8)
        string(r.modifiedBy.description, &out)
        out.append(contentsOf: r.deleted ? #","deleted":true"#.utf8 : #","deleted":false"#.utf8)
        out.append(contentsOf: #","conflicts":"#.utf8)
        int(Int64(r.conflicts), &out)
        if let extra = r.extra {
            out.append(contentsOf: #","extra":"#.utf8)
            // Rare (and at most 16 KiB): the standard encoder.
            out.append(contentsOf: (try? JSONEncoder().encode(extra)) ?? Data("null".utf8))
        }
        out.append(UInt8(ascii: "}"))
    }

    /// A commit's answer (`POST …/commit`, `…/resolve`).
    public static func encode(_ r: CommitResponse) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(512 + r.item.chunks.count * 100)
        out.append(contentsOf: #"{"outcome":"#.utf8)
        string(r.outcome.rawValue, &out)
        if let yours = r.yours {
            out.append(contentsOf: #","yours":"#.utf8)
            string(yours, &out)
        }
        out.append(contentsOf: #","item":"#.utf8)
        encode(r.item, &out)
        out.append(contentsOf: r.renamed ? #","renamed":true"#.utf8 : #","renamed":false"#.utf8)
        out.append(contentsOf: #","restored":["#.utf8)
        for (i, id) in r.restored.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            string(id.description, &out)
        }
        out.append(contentsOf: #"],"cursor":"#.utf8)
        int(r.cursor, &out)
        out.append(UInt8(ascii: "}"))
        return out
    }

    /// A stored item state, keys sorted: the document `JSONEncoder` makes with `.sortedKeys` and
    /// `.withoutEscapingSlashes` (control characters aside, which it may escape differently).
    public static func encode(_ state: ItemState) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(256 + state.content.chunks.count * 100)
        out.append(contentsOf: #"{"content":{"chunks":"#.utf8)
        content(state.content.chunks, state.content.symlinkTarget, &out)
        out.append(contentsOf: state.deleted ? #"},"deleted":true"#.utf8 : #"},"deleted":false"#.utf8)
        if let extra = state.extra {
            out.append(contentsOf: #","extra":"#.utf8)
            string(extra, &out)
        }
        out.append(contentsOf: #","kind":"#.utf8)
        string(state.kind.rawValue, &out)
        out.append(contentsOf: #","location":{"name":"#.utf8)
        string(state.location.name.value, &out)
        out.append(contentsOf: #","parent":"#.utf8)
        string(state.location.parent.description, &out)
        out.append(contentsOf: #"},"mode":"#.utf8)
        int(Int64(state.mode), &out)
        out.append(contentsOf: #","modified":"#.utf8)
        int(state.modified, &out)
        out.append(contentsOf: #","modifiedBy":"#.utf8)
        string(state.modifiedBy.description, &out)
        out.append(UInt8(ascii: "}"))
        return String(decoding: out, as: UTF8.self)
    }

    /// An item record on its own (a journal entry's record).
    public static func encode(record r: ItemRecord) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(256 + r.chunks.count * 100)
        encode(r, &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// A chunk list and, for a symlink, `,"symlinkTarget":…` after it (the same in an item record
    /// and in a state's content).
    static func content(_ chunks: [ChunkRef], _ target: String?, _ out: inout [UInt8]) {
        out.append(UInt8(ascii: "["))
        for (i, c) in chunks.enumerated() {
            out.append(contentsOf: i == 0 ? #"{"hash":"#.utf8 : #",{"hash":"#.utf8)
            string(c.hash.hex, &out)
            out.append(contentsOf: #","size":"#.utf8)
            int(c.size, &out)
            out.append(UInt8(ascii: "}"))
        }
        out.append(UInt8(ascii: "]"))
        if let target {
            out.append(contentsOf: #","symlinkTarget":"#.utf8)
            string(target, &out)
        }
    }

    static func int(_ v: Int64, _ out: inout [UInt8]) {
        if v == 0 { out.append(UInt8(ascii: "0")); return }
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var n = v.magnitude
        var count = 0
        withUnsafeMutableBytes(of: &digits) { d in
            while n > 0 {
                d[count] = UInt8(truncatingIfNeeded: n % 10) + 48
                n /= 10
                count += 1
            }
            if v < 0 { out.append(UInt8(ascii: "-")) }
            for i in stride(from: count - 1, through: 0, by: -1) { out.append(d[i]) }
        }
    }

    /// A JSON string: `"` and `\` escaped, control characters as `\u00XX`, the rest as UTF-8.
    static func string(_ s: String, _ out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        let hex = Array("0123456789abcdef".utf8)
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "\""): out.append(contentsOf: #"\""#.utf8)
            case UInt8(ascii: "\\"): out.append(contentsOf: #"\\"#.utf8)
            case UInt8(ascii: "\n"): out.append(contentsOf: #"\n"#.utf8)
            case UInt8(ascii: "\t"): out.append(contentsOf: #"\t"#.utf8)
            case UInt8(ascii: "\r"): out.append(contentsOf: #"\r"#.utf8)
            case 0..<0x20:
                out.append(contentsOf: #"\u00"#.utf8)
                out.append(hex[Int(b >> 4)])
                out.append(hex[Int(b & 0xf)])
            default: out.append(b)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}
