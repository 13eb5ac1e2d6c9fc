import Foundation
import NimbusCore
import NimbusProtocol
import Testing

/// `FastJSON` writes the listing pages by hand: what `JSONDecoder` reads back must be the page.
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
}
