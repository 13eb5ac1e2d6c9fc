import Foundation
import NimbusCore
import Testing

/// Ids are formatted, parsed and compared by hand (`UUIDText`): the same answers as Foundation's
/// text and the order of that text.
@Suite struct IdentifierTests {
    /// New item ids come from `FastUUID`: version 4, RFC 4122 variant, no repeats, also from
    /// several threads at once and across refills of its pool.
    @Test func fastUUIDsAreVersion4AndDistinct() async {
        let ids = await withTaskGroup(of: [UUID].self) { g in
            for _ in 0..<4 { g.addTask { (0..<3_000).map { _ in FastUUID.make() } } }
            return await g.reduce(into: [UUID]()) { $0 += $1 }
        }
        #expect(Set(ids).count == 12_000)
        for u in ids.prefix(500) {
            let text = u.uuidString
            #expect(Array(text)[14] == "4", "version 4: \(text)")
            #expect("89AB".contains(Array(text)[19]), "RFC 4122 variant: \(text)")
        }
    }

    @Test func textIsFoundationsText() {
        for _ in 0..<2_000 {
            let u = UUID()
            let id = ItemID(u)
            #expect(id.description == u.uuidString.lowercased())
            #expect(DeviceID(u).description == u.uuidString.lowercased())
            #expect(ItemID(u.uuidString) == id)
            #expect(ItemID(u.uuidString.lowercased()) == id)
            #expect(DeviceID(u.uuidString)?.uuid == u)
        }
        #expect(ItemID.root.description == "00000000-0000-0000-0000-000000000000")
        #expect(ItemID("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF")?.description == "ffffffff-ffff-ffff-ffff-ffffffffffff")
    }

    @Test func onlyCanonicalTextIsParsed() {
        let good = "0b7a3c2e-5f7e-4c52-9a47-0e1a2b3c4d5e"
        var odd = ["", "x", good + "0", String(good.dropLast()), "{" + good + "}", " " + good.dropFirst(),
                   good.replacingOccurrences(of: "-", with: ""), good.replacingOccurrences(of: "-", with: "_"),
                   "0b7a3c2e5-f7e-4c52-9a47-0e1a2b3c4d5e", "0b7a3c2g-5f7e-4c52-9a47-0e1a2b3c4d5e", "0b7a3c2é-5f7e-4c52-9a47-0e1a2b3c4d5",
                   "0b7a3c2e-5f7e-4c52-9a47-0e1a2b3c4d5\u{0}", "+b7a3c2e-5f7e-4c52-9a47-0e1a2b3c4d5e"]
        // Every position replaced by every kind of character.
        for (k, _) in good.enumerated() {
            for c in ["-", "g", "G", "0", "F", " ", "\u{0}"] {
                var chars = Array(good)
                chars[k] = Character(c)
                odd.append(String(chars))
            }
        }
        // Foundation's parser on Linux (sscanf) also takes spaces and signs inside the digits
        // (" b7a…", "0b-a…"): such text is no id here. Canonical text parses as Foundation parses it.
        let canonical = try! Regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
        var accepted = 0
        for s in odd {
            if s.wholeMatch(of: canonical) != nil {
                accepted += 1
                #expect(ItemID(s)?.uuid == UUID(uuidString: s), "\(s.debugDescription)")
                #expect(DeviceID(s)?.uuid == UUID(uuidString: s), "\(s.debugDescription)")
            } else {
                #expect(ItemID(s) == nil, "\(s.debugDescription)")
                #expect(DeviceID(s) == nil, "\(s.debugDescription)")
            }
        }
        #expect(accepted > 36)
    }

    @Test func orderIsTheTextsOrder() {
        var ids = (0..<500).map { _ in ItemID(UUID()) }
        // Pairs that share long prefixes.
        let base = UUID().uuid
        for k in 0..<16 {
            var u = base
            withUnsafeMutableBytes(of: &u) { $0[k] = $0[k] &+ 1 }
            ids.append(ItemID(UUID(uuid: u)))
        }
        ids.append(ItemID(UUID(uuid: base)))
        ids.append(.root)
        for a in ids.prefix(60) {
            for b in ids {
                #expect((a < b) == (a.description < b.description))
                #expect((DeviceID(a.uuid) < DeviceID(b.uuid)) == (a.description < b.description))
            }
        }
        #expect(ids.sorted().map(\.description) == ids.map(\.description).sorted())
    }
}
