import Foundation
import NimbusCore
@testable import NimbusProtocol
import Testing

/// `FastJSON` writes the listing pages by hand: what `JSONDecoder` reads back must be the page.
/// It also reads pages and stored states by hand: what it reads must be what `JSONDecoder` reads.
@Suite struct FastJSONTests {
    func item(name: String, chunks: Int, target: String? = nil, extra: JSONValue? = nil, deleted: Bool = false) -> ItemRecord {
        var refs: [ChunkRef] = []
        for i in 0..<chunks {
            let digest: [UInt8] = (0..<32).map { (b: Int) -> UInt8 in UInt8(truncatingIfNeeded: b * 7 + i) }
            refs.append(ChunkRef(hash: ContentHash(digest: digest), size: Int64(i * 1_000_003 + 1)))
        }
        let state = ItemState(kind: target == nil ? .file : .symlink, location: ItemLocation(parent: ItemID(UUID()), name: ItemName(trusted: name)),
                              content: ItemContent(chunks: refs, symlinkTarget: target), mode: 0o100644,
                              modified: -1_234_567_890_123, modifiedBy: DeviceID(UUID()), deleted: deleted, extra: extra?.serialized())
        return ItemRecord(id: ItemID(UUID()), version: Int64.max - Int64(chunks), state: state, conflicts: chunks % 3)
    }

    @Test func pagesDecodeToWhatWasWritten() throws {
        var rng = SystemRandomNumberGenerator()
        // Every control character, quotes, backslashes (slashes in the link targets), multi-byte and astral characters.
        let alphabet: [String] = (1..<0x20).map { String(UnicodeScalar(UInt8($0))) } + ["\"", "\\", "a", "Z", "é", "ß", "日", "🎉", "\u{7f}", "\u{2028}", " "]
        var items: [ItemRecord] = []
        for n in 0..<200 {
            let name = (0..<Int.random(in: 1...24, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
            items.append(item(name: name, chunks: n % 4, target: n % 5 == 0 ? "../" + name : nil,
                              extra: n % 7 == 0 ? JSONValue.parse(#"{"tags":["x","y\n"],"n":1.5}"#) : nil, deleted: n % 11 == 0))
        }
        for page in [ItemsResponse(items: items, cursor: 0, next: items.last?.id),
                     ItemsResponse(items: [], cursor: 42, next: nil),
                     ItemsResponse(items: [item(name: "x", chunks: 0)], cursor: -7, next: nil)] {
            let bytes = FastJSON.encode(page)
            let back = try JSONDecoder().decode(ItemsResponse.self, from: Data(bytes))
            #expect(back == page)
            // And it is JSON to any parser, not just to ours.
            #expect(try JSONSerialization.jsonObject(with: Data(bytes)) is [String: Any])
        }
    }

    static let alphabet: [String] = (1..<0x20).map { String(UnicodeScalar(UInt8($0))) }
        + ["\"", "\\", "/", "a", "Z", "é", "ß", "日", "🎉", "\u{7f}", "\u{2028}", " ", "\u{FFFD}"]

    func randomItems(_ count: Int) -> [ItemRecord] {
        var rng = SystemRandomNumberGenerator()
        return (0..<count).map { n in
            let name = (0..<Int.random(in: 1...24, using: &rng)).map { _ in Self.alphabet.randomElement(using: &rng)! }.joined()
                .replacingOccurrences(of: "/", with: "∕")
            return item(name: name, chunks: n % 4, target: n % 5 == 0 ? "../" + name : nil,
                        extra: n % 7 == 0 ? JSONValue.parse(#"{"tags":["x","y\n"],"n":1.5}"#) : nil, deleted: n % 11 == 0)
        }
    }

    /// Pages written by `FastJSON` and by `JSONEncoder` (any formatting) are read by the fast
    /// reader itself — no fallback — into what `JSONDecoder` reads.
    @Test func pagesReadByHandAsJSONDecoderReadsThem() throws {
        let items = randomItems(300)
        let pages = [ItemsResponse(items: items, cursor: 9_007_199_254_740_993, next: items.last?.id),
                     ItemsResponse(items: [], cursor: 0, next: nil),
                     ItemsResponse(items: [item(name: "x", chunks: 0)], cursor: -7, next: nil)]
        for page in pages {
            var docs = [FastJSON.encode(page)]
            for f: JSONEncoder.OutputFormatting in [[], [.sortedKeys], [.prettyPrinted, .sortedKeys], [.withoutEscapingSlashes]] {
                let e = JSONEncoder()
                e.outputFormatting = f
                docs.append(Array(try e.encode(page)))
            }
            for doc in docs {
                let standard = try JSONDecoder().decode(ItemsResponse.self, from: Data(doc))
                #expect(try FastJSON.fastItemsResponse(doc) == standard)
                #expect(standard == page)
            }
        }
    }

    /// Stored states (written as the server's `Codec` writes them) are read by hand into what
    /// `JSONDecoder` reads.
    @Test func statesReadByHandAsJSONDecoderReadsThem() throws {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        for r in randomItems(300) {
            let text = String(decoding: try e.encode(r.state), as: UTF8.self)
            let standard = try JSONDecoder().decode(ItemState.self, from: Data(text.utf8))
            #expect(try FastJSON.fastItemState(Array(text.utf8)) == standard)
            #expect(try FastJSON.decodeItemState(text) == r.state)
        }
    }

    /// Odd and hostile documents: the public readers give exactly what `JSONDecoder` gives —
    /// the same value, or an error.
    /// Stored states, journal records and commit answers written by hand read back as what was
    /// written, with `JSONDecoder` and with the fast reader; a state without control characters
    /// is the very text `JSONEncoder` writes with sorted keys (what rows held before).
    @Test func statesRecordsAndCommitAnswersDecodeToWhatWasWritten() throws {
        let standard = JSONEncoder()
        standard.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        for (n, record) in randomItems(300).enumerated() {
            let state = ItemState(kind: record.kind, location: ItemLocation(parent: record.parent, name: record.name),
                                  content: ItemContent(chunks: record.chunks, symlinkTarget: record.symlinkTarget), mode: record.mode,
                                  modified: record.modified, modifiedBy: record.modifiedBy, deleted: record.deleted,
                                  extra: record.extra?.serialized())
            let text = FastJSON.encode(state)
            #expect(try JSONDecoder().decode(ItemState.self, from: Data(text.utf8)) == state)
            #expect(try FastJSON.fastItemState(Array(text.utf8)) == state)
            if !state.location.name.value.utf8.contains(where: { $0 < 0x20 }), !(state.content.symlinkTarget ?? "").utf8.contains(where: { $0 < 0x20 }) {
                #expect(text == String(decoding: try standard.encode(state), as: UTF8.self))
            }
            let recordText = FastJSON.encode(record: record)
            #expect(try JSONDecoder().decode(ItemRecord.self, from: Data(recordText.utf8)) == record)
            #expect(try FastJSON.fastItemRecord(Array(recordText.utf8)) == record)
            #expect(try FastJSON.decodeItemRecord(String(decoding: try standard.encode(record), as: UTF8.self)) == record)
            let outcomes: [CommitOutcome] = [.applied, .unchanged, .conflict]
            let answer = CommitResponse(outcome: outcomes[n % 3], yours: n % 3 == 2 ? "conflict" : nil, item: record, renamed: n % 2 == 0,
                                        restored: (0..<(n % 3)).map { _ in ItemID(UUID()) }, cursor: Int64(n) * 1_000_000_007)
            let bytes = FastJSON.encode(answer)
            #expect(try JSONDecoder().decode(CommitResponse.self, from: Data(bytes)) == answer)
            #expect(try JSONSerialization.jsonObject(with: Data(bytes)) is [String: Any])
        }
    }

    @Test func oddDocumentsGetTheStandardAnswer() throws {
        let id = "0b7a3c2e-5f7e-4c52-9a47-0e1a2b3c4d5e", dev = "9d6f1e2a-0000-4000-8000-000000000001"
        let hash = String(repeating: "ab", count: 32)
        func state(_ fields: String) -> String {
            #"{"content":{"chunks":[{"hash":"\#(hash)","size":5}]},"deleted":false,"kind":"file","location":{"name":"n","parent":"\#(id)"},"mode":420,"modified":1,"modifiedBy":"\#(dev)"\#(fields)}"#
        }
        let states: [String] = [
            state(""), state(#","extra":"{\"a\":1}""#), state(#","unknown":[1,{"x":null},-2.5e3,true]"#),
            state(#","mode":420.0"#), state(#","modified":-0"#), state(#","modified":01"#), state(#","modified":99999999999999999999"#),
            state(#","extra":null"#), state("  ") + "  ", state("") + "x", "", "{}", "[]", "null",
            #"{"kind":"file"}"#,
            state("").replacingOccurrences(of: #""name":"n""#, with: #""name":"\ud83c\udf89 \u00e9\u0041\/\b""#),
            state("").replacingOccurrences(of: #""name":"n""#, with: #""name":"\ud800""#),
            state("").replacingOccurrences(of: #""name":"n""#, with: #""name":"\udc00x""#),
            state("").replacingOccurrences(of: #""name":"n""#, with: #""name":"a/b""#),
            state("").replacingOccurrences(of: #""name":"n""#, with: #""name":"""#),
            state("").replacingOccurrences(of: #""name":"n""#, with: #""name":"\u0000""#),
            state("").replacingOccurrences(of: #""name":"n""#, with: #""name":"\x""#),
            state("").replacingOccurrences(of: #""mode":420"#, with: #""mode":-1"#),
            state("").replacingOccurrences(of: #""mode":420"#, with: #""mode":4294967296"#),
            state("").replacingOccurrences(of: #""kind":"file""#, with: #""kind":"FILE""#),
            state("").replacingOccurrences(of: #""deleted":false"#, with: #""deleted":null"#),
            state("").replacingOccurrences(of: "\(hash)", with: String(repeating: "AB", count: 32)),
            state("").replacingOccurrences(of: "\(hash)", with: "abc"),
            state("").replacingOccurrences(of: #""modified":1"#, with: #""modified":1,"modified":2"#),
            state("").replacingOccurrences(of: #""kind""#, with: #""\u006bind""#),
        ]
        func same<T: Equatable>(_ a: () throws -> T, _ b: () throws -> T, _ doc: String) {
            switch (Result(catching: a), Result(catching: b)) {
            case (.success(let x), .success(let y)): #expect(x == y, "\(doc)")
            case (.failure, .failure): break
            case (let x, let y): Issue.record("\(doc): fast \(x), standard \(y)")
            }
        }
        for doc in states {
            same({ try FastJSON.decodeItemState(doc) }, { try JSONDecoder().decode(ItemState.self, from: Data(doc.utf8)) }, doc)
        }
        // Bytes that are not UTF-8 inside a string.
        var bad = Array(state("").utf8)
        if let at = bad.firstIndex(of: UInt8(ascii: "n")) { bad[at] = 0xFF }
        same({ try FastJSON.decodeItemState(String(decoding: bad, as: UTF8.self)) },
             { try JSONDecoder().decode(ItemState.self, from: Data(String(decoding: bad, as: UTF8.self).utf8)) }, "not UTF-8")
        #expect(throws: (any Error).self) { try FastJSON.fastItemsResponse(bad) }

        let page = Array(FastJSON.encode(ItemsResponse(items: randomItems(3), cursor: 5, next: nil)))
        let pages: [[UInt8]] = [page, Array(page.dropLast()), page + Array(" x".utf8), Array(#"{"items":[],"cursor":1.5}"#.utf8),
                                Array(#"{"items":[],"cursor":3,"next":null}"#.utf8), Array(#"{"items":[]}"#.utf8),
                                Array(#"{"items":[],"cursor":3,"next":"not-a-uuid"}"#.utf8)]
        for doc in pages {
            same({ try FastJSON.decodeItemsResponse(doc) }, { try JSONDecoder().decode(ItemsResponse.self, from: Data(doc)) },
                 String(decoding: doc.prefix(200), as: UTF8.self))
        }
    }

    /// Commit requests (what a device sends per change) and their answers: written by hand, read
    /// by `JSONDecoder` as what was written; written by `JSONEncoder` in any formatting, read by
    /// the fast readers themselves (no fallback) as `JSONDecoder` reads them.
    @Test func commitsAndTheirAnswersReadByHandAsJSONDecoderReadsThem() throws {
        var rng = SystemRandomNumberGenerator()
        for (n, record) in randomItems(300).enumerated() {
            var draft = ItemDraft(record)
            draft.extra = n % 7 == 0 ? JSONValue.parse(#"{"tags":["x","y\n"],"n":1.5,"deep":{"a":[null,true]}}"#) : nil
            let bytes = Data((0..<(n % 4 == 0 ? 0 : Int.random(in: 1...3000, using: &rng))).map { _ in UInt8.random(in: 0...255, using: &rng) })
            let inline: [InlineChunk]? = n % 3 == 0 ? nil : [InlineChunk(hash: ContentHash(digest: (0..<32).map { _ in UInt8.random(in: 0...255, using: &rng) }), bytes: bytes)]
            let request = CommitRequest(item: ItemID(UUID()), baseVersion: n % 2 == 0 ? nil : Int64(n) * 1_000_003 - 5, state: draft,
                                        seenCursor: n % 5 == 0 ? nil : Int64.max - Int64(n), inline: inline,
                                        placeIfUnmoved: [nil, true, false][n % 3])
            var docs = [FastJSON.encode(request)]
            #expect(try JSONDecoder().decode(CommitRequest.self, from: Data(docs[0])) == request)
            for f: JSONEncoder.OutputFormatting in [[], [.sortedKeys], [.prettyPrinted, .sortedKeys], [.withoutEscapingSlashes]] {
                let e = JSONEncoder()
                e.outputFormatting = f
                docs.append(Array(try e.encode(request)))
            }
            for doc in docs {
                #expect(try FastJSON.fastCommitRequest(doc) == request)
                #expect(try CommitRequest.decodeBody(doc) == request)
            }

            let outcomes: [CommitOutcome] = [.applied, .unchanged, .conflict, .deleteIgnored]
            let answer = CommitResponse(outcome: outcomes[n % 4], yours: n % 4 == 2 ? "conflict" : nil, item: record, renamed: n % 2 == 0,
                                        restored: (0..<(n % 3)).map { _ in ItemID(UUID()) }, cursor: Int64(n) * 1_000_000_007)
            var answers = [FastJSON.encode(answer)]
            for f: JSONEncoder.OutputFormatting in [[], [.prettyPrinted, .sortedKeys]] {
                let e = JSONEncoder()
                e.outputFormatting = f
                answers.append(Array(try e.encode(answer)))
            }
            for doc in answers { #expect(try FastJSON.fastCommitResponse(doc) == answer) }
        }
    }

    /// Odd and hostile commit requests and answers: the public readers give exactly what
    /// `JSONDecoder` gives — the same value, or an error.
    @Test func oddCommitsGetTheStandardAnswer() throws {
        let id = "0b7a3c2e-5f7e-4c52-9a47-0e1a2b3c4d5e", parent = "9d6f1e2a-0000-4000-8000-000000000001"
        let hash = String(repeating: "ab", count: 32)
        let good = #"{"item":"\#(id)","baseVersion":3,"seenCursor":9,"state":{"kind":"file","parent":"\#(parent)","name":"n","chunks":[{"hash":"\#(hash)","size":5}],"mode":420,"modified":1,"deleted":false},"inline":[{"hash":"\#(hash)","bytes":"aGVsbG8="}]}"#
        func with(_ old: String, _ new: String) -> String { good.replacingOccurrences(of: old, with: new) }
        let requests: [String] = [
            good, with(#""baseVersion":3,"#, ""), with(#""baseVersion":3"#, #""baseVersion":null"#),
            with(#","inline":[{"hash":"\#(hash)","bytes":"aGVsbG8="}]"#, ""), with(#""inline":["#, #""inline":null,"x":["#),
            with("aGVsbG8=", "aGVsbG8"), with("aGVsbG8=", "!!!!"), with("aGVsbG8=", ""), with("aGVsbG8=", #"aGVs\/bG8="#),
            with(#""bytes":"aGVsbG8=""#, #""bytes":null"#), with(#""bytes":"aGVsbG8=""#, #""bytes":[104]"#),
            with(#""hash":"\#(hash)","bytes""#, #""hash":"abc","bytes""#),
            with(#""name":"n""#, #""name":"a/b""#), with(#""name":"n""#, #""name":"..""#), with(#""name":"n""#, #""name":"\u0000""#),
            with(#""name":"n""#, #""name":"\ud800""#), with(#""mode":420"#, #""mode":-1"#), with(#""mode":420"#, #""mode":4294967296"#),
            with(#""deleted":false"#, #""deleted":false,"extra":{"a":[1,2,{"b":null}]}"#),
            with(#""deleted":false"#, #""deleted":false,"extra":\#(String(repeating: "[", count: 500))\#(String(repeating: "]", count: 500))"#),
            with(#""deleted":false"#, #""deleted":0"#), with(#","deleted":false"#, ""), with(#""kind":"file""#, #""kind":"folder""#),
            with(#""item":"\#(id)""#, #""item":"\#(id)","item":"\#(parent)""#), with(#""item":"\#(id)","#, ""),
            with(#""seenCursor":9"#, #""seenCursor":9.5"#), with(#""seenCursor":9"#, #""seenCursor":99999999999999999999"#),
            good + " ", good + "x", "", "{}", "[]", "null",
        ]
        func same<T: Equatable>(_ a: () throws -> T, _ b: () throws -> T, _ doc: String) {
            switch (Result(catching: a), Result(catching: b)) {
            case (.success(let x), .success(let y)): #expect(x == y, "\(doc)")
            case (.failure, .failure): break
            case (let x, let y): Issue.record("\(doc): fast \(x), standard \(y)")
            }
        }
        // Nested far deeper than any stack frame budget: refused as JSONDecoder refuses it, no crash.
        let deep = String(repeating: "[", count: 200_000) + String(repeating: "]", count: 200_000)
        let deepObject = String(repeating: #"{"a":"#, count: 100_000) + "1" + String(repeating: "}", count: 100_000)
        let hostile = [with(#""deleted":false"#, #""deleted":false,"extra":\#(deep)"#), with(#""deleted":false"#, #""deleted":false,"extra":\#(deepObject)"#),
                       with(#""item":"#, #""unknown":\#(deep),"item":"#), #"{"commits":\#(deep)}"#, deep]
        for doc in hostile {
            #expect(throws: (any Error).self) { try CommitRequest.decodeBody(Array(doc.utf8)) }
            #expect(throws: (any Error).self) { try FastJSON.decodeCommitBatch(Array(doc.utf8)) }
            #expect(throws: (any Error).self) { try FastJSON.decodeCommitResponse(Array(doc.utf8)) }
        }
        for doc in requests {
            same({ try CommitRequest.decodeBody(Array(doc.utf8)) }, { try JSONDecoder().decode(CommitRequest.self, from: Data(doc.utf8)) }, doc)
        }
        let record = randomItems(1)[0]
        let answer = String(decoding: FastJSON.encode(CommitResponse(outcome: .applied, item: record, cursor: 7)), as: UTF8.self)
        let answers: [String] = [
            answer, answer.replacingOccurrences(of: #""outcome":"applied""#, with: #""outcome":"merged""#),
            answer.replacingOccurrences(of: #""renamed":false"#, with: #""renamed":null"#),
            answer.replacingOccurrences(of: #""restored":[]"#, with: #""restored":["x"]"#),
            answer.replacingOccurrences(of: #""cursor":7"#, with: #""cursor":7,"cursor":8"#), String(answer.dropLast()),
        ]
        let records: [String] = [FastJSON.encode(record: record)] + answers.map { doc in
            // The record inside each answer, and the odd ones.
            String(doc.drop(while: { $0 != "{" }).dropFirst().drop(while: { $0 != "{" }))
        } + [FastJSON.encode(record: record) + "x", "{}", String(FastJSON.encode(record: record).dropLast())]
        for doc in records {
            same({ try FastJSON.decodeItemRecord(doc) }, { try JSONDecoder().decode(ItemRecord.self, from: Data(doc.utf8)) }, doc)
        }
        for doc in answers {
            same({ try FastJSON.decodeCommitResponse(Array(doc.utf8)) }, { try JSONDecoder().decode(CommitResponse.self, from: Data(doc.utf8)) }, doc)
        }
    }
}
