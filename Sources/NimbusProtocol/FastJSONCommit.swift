import Foundation
import NimbusCore

/// The commit's two documents by hand: the request a device writes and the server reads, and the
/// answer the device reads (the server writes it with `encode(_: CommitResponse)`), single and in
/// batches: every change of a device travels in one. Same contract as the other readers: what
/// the fast reader is not sure of throws, and `JSONDecoder` then gives the standard value or
/// error.
extension FastJSON {
    /// A commit request: the document `JSONEncoder` makes (optional fields absent when nil, an
    /// inline chunk's bytes in base64), keys in another order.
    public static func encode(_ r: CommitRequest) -> [UInt8] {
        var out: [UInt8] = []
        let inlineBytes = r.inline?.reduce(0) { $0 + $1.bytes.count } ?? 0
        out.reserveCapacity(400 + r.state.chunks.count * 100 + inlineBytes * 4 / 3)
        out.append(contentsOf: #"{"item":"#.utf8)
        string(r.item.description, &out)
        if let base = r.baseVersion {
            out.append(contentsOf: #","baseVersion":"#.utf8)
            int(base, &out)
        }
        if let cursor = r.seenCursor {
            out.append(contentsOf: #","seenCursor":"#.utf8)
            int(cursor, &out)
        }
        if let weak = r.placeIfUnmoved {
            out.append(contentsOf: weak ? #","placeIfUnmoved":true"#.utf8 : #","placeIfUnmoved":false"#.utf8)
        }
        let d = r.state
        out.append(contentsOf: #","state":{"kind":"#.utf8)
        string(d.kind.rawValue, &out)
        out.append(contentsOf: #","parent":"#.utf8)
        string(d.parent.description, &out)
        out.append(contentsOf: #","name":"#.utf8)
        string(d.name.value, &out)
        out.append(contentsOf: #","chunks":"#.utf8)
        content(d.chunks, d.symlinkTarget, &out)
        out.append(contentsOf: #","mode":"#.utf8)
        int(Int64(d.mode), &out)
        out.append(contentsOf: #","modified":"#.utf8)
        int(d.modified, &out)
        out.append(contentsOf: d.deleted ? #","deleted":true"#.utf8 : #","deleted":false"#.utf8)
        if let extra = d.extra {
            out.append(contentsOf: #","extra":"#.utf8)
            // Rare (and at most 16 KiB): the standard encoder.
            out.append(contentsOf: (try? JSONEncoder().encode(extra)) ?? Data("null".utf8))
        }
        out.append(UInt8(ascii: "}"))
        if let inline = r.inline {
            out.append(contentsOf: #","inline":["#.utf8)
            for (i, c) in inline.enumerated() {
                out.append(contentsOf: i == 0 ? #"{"hash":"#.utf8 : #",{"hash":"#.utf8)
                string(c.hash.hex, &out)
                out.append(contentsOf: #","bytes":""#.utf8)
                out.append(contentsOf: c.bytes.base64EncodedData())
                out.append(contentsOf: #""}"#.utf8)
            }
            out.append(UInt8(ascii: "]"))
        }
        out.append(UInt8(ascii: "}"))
        return out
    }

    /// A commit request, fast when possible, else by `JSONDecoder` (its value or its error).
    public static func decodeCommitRequest(_ bytes: [UInt8]) throws -> CommitRequest {
        if let r = try? fastCommitRequest(bytes) { return r }
        return try JSONDecoder().decode(CommitRequest.self, from: Data(bytes))
    }

    /// A commit's answer, fast when possible, else by `JSONDecoder`.
    public static func decodeCommitResponse(_ bytes: [UInt8]) throws -> CommitResponse {
        if let r = try? fastCommitResponse(bytes) { return r }
        return try JSONDecoder().decode(CommitResponse.self, from: Data(bytes))
    }

    static func fastCommitRequest(_ bytes: [UInt8]) throws -> CommitRequest {
        var s = JSONScanner(bytes)
        let r = try commitRequest(&s)
        try s.end()
        return r
    }

    static func commitRequest(_ s: inout JSONScanner) throws -> CommitRequest {
        var item: ItemID?, base: Int64?, cursor: Int64?, draft: ItemDraft?, inline: [InlineChunk]?, weak: Bool?
        var seen: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
        try s.object { s, key in
            switch key {
            case "item": try first(&seen, 0); item = try itemID(&s)
            case "baseVersion": try first(&seen, 1); base = try s.isNull() ? nil : try s.int64()
            case "seenCursor": try first(&seen, 2); cursor = try s.isNull() ? nil : try s.int64()
            case "state": try first(&seen, 3); draft = try itemDraft(&s)
            case "inline":
                try first(&seen, 4)
                if try s.isNull() { break }
                var out: [InlineChunk] = []
                try s.array { s in out.append(try inlineChunk(&s)) }
                inline = out
            case "placeIfUnmoved": try first(&seen, 5); weak = try s.isNull() ? nil : try s.bool()
            default: try s.skipValue()
            }
        }
        guard let item, let draft else { throw JSONScanner.Failure() }
        return CommitRequest(item: item, baseVersion: base, state: draft, seenCursor: cursor, inline: inline, placeIfUnmoved: weak)
    }

    static func itemDraft(_ s: inout JSONScanner) throws -> ItemDraft {
        var kind: ItemKind?, parent: ItemID?, name: ItemName?, chunks: [ChunkRef]?, target: String?
        var mode: UInt32?, modified: Int64?, deleted: Bool?, extraRaw: ArraySlice<UInt8>?
        var seen: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
        try s.object { s, key in
            switch key {
            case "kind": try first(&seen, 0); kind = try itemKind(&s)
            case "parent": try first(&seen, 1); parent = try itemID(&s)
            case "name": try first(&seen, 2); name = try ItemName(s.string())
            case "chunks": try first(&seen, 3); chunks = try chunkList(&s)
            case "symlinkTarget": try first(&seen, 4); target = try s.isNull() ? nil : try s.string()
            case "mode": try first(&seen, 5); mode = try uint32(&s)
            case "modified": try first(&seen, 6); modified = try s.int64()
            case "deleted": try first(&seen, 7); deleted = try s.bool()
            case "extra": try first(&seen, 8); extraRaw = try s.isNull() ? nil : try s.rawValue()
            default: try s.skipValue()
            }
        }
        guard let kind, let parent, let name, let chunks, let mode, let modified, let deleted else { throw JSONScanner.Failure() }
        // Rare: the standard decoder for the free-form part (its depth limit included).
        let extra = try extraRaw.map { try JSONDecoder().decode(JSONValue.self, from: Data($0)) }
        return ItemDraft(kind: kind, parent: parent, name: name, chunks: chunks, symlinkTarget: target, mode: mode,
                         modified: modified, deleted: deleted, extra: extra)
    }

    static func inlineChunk(_ s: inout JSONScanner) throws -> InlineChunk {
        var hash: ContentHash?, data: Data?
        var seen: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
        try s.object { s, key in
            switch key {
            case "hash":
                try first(&seen, 0)
                guard let h = ContentHash(hex: try s.string()) else { throw JSONScanner.Failure() }
                hash = h
            case "bytes":
                try first(&seen, 1)
                guard let d = Data(base64Encoded: try s.string()) else { throw JSONScanner.Failure() }
                data = d
            default: try s.skipValue()
            }
        }
        guard let hash, let data else { throw JSONScanner.Failure() }
        return InlineChunk(hash: hash, bytes: data)
    }

    static func fastCommitResponse(_ bytes: [UInt8]) throws -> CommitResponse {
        var s = JSONScanner(bytes)
        let r = try commitResponse(&s)
        try s.end()
        return r
    }

    static func commitResponse(_ s: inout JSONScanner) throws -> CommitResponse {
        var outcome: CommitOutcome?, yours: String?, item: ItemRecord?, renamed: Bool?, restored: [ItemID]?, cursor: Int64?
        var seen: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
        try s.object { s, key in
            switch key {
            case "outcome":
                try first(&seen, 0)
                guard let o = CommitOutcome(rawValue: try s.string()) else { throw JSONScanner.Failure() }
                outcome = o
            case "yours": try first(&seen, 1); yours = try s.isNull() ? nil : try s.string()
            case "item": try first(&seen, 2); item = try itemRecord(&s)
            case "renamed": try first(&seen, 3); renamed = try s.bool()
            case "restored":
                try first(&seen, 4)
                var ids: [ItemID] = []
                try s.array { s in ids.append(try itemID(&s)) }
                restored = ids
            case "cursor": try first(&seen, 5); cursor = try s.int64()
            default: try s.skipValue()
            }
        }
        guard let outcome, let item, let renamed, let restored, let cursor else { throw JSONScanner.Failure() }
        return CommitResponse(outcome: outcome, yours: yours, item: item, renamed: renamed, restored: restored, cursor: cursor)
    }

    // MARK: batches

    /// A batch of commits: each written as `encode(_: CommitRequest)` writes it.
    public static func encode(_ b: CommitBatchRequest) -> [UInt8] {
        var out: [UInt8] = Array(#"{"commits":["#.utf8)
        for (i, c) in b.commits.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: encode(c))
        }
        out.append(contentsOf: "]}".utf8)
        return out
    }

    /// A batch's answers: each commit's answer by hand, an error (rare) by `JSONEncoder`.
    public static func encode(_ b: CommitBatchResponse) -> [UInt8] {
        var out: [UInt8] = Array(#"{"results":["#.utf8)
        for (i, r) in b.results.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            if let ok = r.ok {
                out.append(contentsOf: #"{"ok":"#.utf8)
                out.append(contentsOf: encode(ok))
                out.append(UInt8(ascii: "}"))
            } else {
                out.append(contentsOf: (try? JSONEncoder().encode(r)) ?? Data("{}".utf8))
            }
        }
        out.append(contentsOf: "]}".utf8)
        return out
    }

    public static func decodeCommitBatch(_ bytes: [UInt8]) throws -> CommitBatchRequest {
        if let b = try? fastCommitBatch(bytes) { return b }
        return try JSONDecoder().decode(CommitBatchRequest.self, from: Data(bytes))
    }

    public static func decodeCommitBatchResponse(_ bytes: [UInt8]) throws -> CommitBatchResponse {
        if let b = try? fastCommitBatchResponse(bytes) { return b }
        return try JSONDecoder().decode(CommitBatchResponse.self, from: Data(bytes))
    }

    static func fastCommitBatch(_ bytes: [UInt8]) throws -> CommitBatchRequest {
        var s = JSONScanner(bytes)
        var commits: [CommitRequest]?
        var seen: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
        try s.object { s, key in
            switch key {
            case "commits":
                try first(&seen, 0)
                var out: [CommitRequest] = []
                // (At most what the body limit holds; `check()` then refuses more than the limit.)
                try s.array { s in out.append(try commitRequest(&s)) }
                commits = out
            default: try s.skipValue()
            }
        }
        try s.end()
        guard let commits else { throw JSONScanner.Failure() }
        return CommitBatchRequest(commits: commits)
    }

    /// Answers read by hand; a batch with an error in it goes to `JSONDecoder` whole (rare).
    static func fastCommitBatchResponse(_ bytes: [UInt8]) throws -> CommitBatchResponse {
        var s = JSONScanner(bytes)
        var results: [CommitBatchResponse.Result]?
        var seen: UInt32 = 0  // (a key twice: the fallback decides, as JSONDecoder takes the first)
        try s.object { s, key in
            switch key {
            case "results":
                try first(&seen, 0)
                var out: [CommitBatchResponse.Result] = []
                try s.array { s in
                    var ok: CommitResponse?
                    var seen2: UInt32 = 0
                    try s.object { s, key in
                        switch key {
                        case "ok": try first(&seen2, 0); ok = try commitResponse(&s)
                        default: throw JSONScanner.Failure()
                        }
                    }
                    guard let ok else { throw JSONScanner.Failure() }
                    out.append(.init(ok: ok))
                }
                results = out
            default: try s.skipValue()
            }
        }
        try s.end()
        guard let results else { throw JSONScanner.Failure() }
        return CommitBatchResponse(results: results)
    }
}
