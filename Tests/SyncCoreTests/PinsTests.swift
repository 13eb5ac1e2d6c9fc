import Foundation
import NimbusCore
import SyncCore
import Testing

/// A pinned folder pins everything below it; the tree is asked only when something is pinned.
@Suite struct PinsTests {
    let folder = ItemID(UUID()), sub = ItemID(UUID()), file = ItemID(UUID()), other = ItemID(UUID())

    func above(_ id: ItemID) -> [ItemID] { id == file ? [sub, folder, .root] : id == sub ? [folder, .root] : [.root] }
    func below(_ id: ItemID) -> [ItemID] { id == folder ? [sub, file] : id == sub ? [file] : [] }

    @Test func aPinnedFolderCoversWhatIsBelowIt() {
        var p = Pins()
        var asked = 0
        #expect(!p.covers(file, ancestors: { asked += 1; return self.above($0) }) && asked == 0, "nothing pinned: the tree is not asked")
        p.set(folder, true)
        #expect(p.covers(file, ancestors: above) && p.covers(folder, ancestors: above) && !p.covers(other, ancestors: above))
        #expect(p.contains(folder) && !p.contains(file) && p.count == 1)
        #expect(p.covered([file, other, sub], ancestors: above) == [file, sub])
        #expect(Set(p.everything(descendants: below)) == [folder, sub, file])
        #expect(p.kept(descendants: below, also: other) == [folder, sub, file, other])
        p.set(folder, false)
        #expect(p.covered([file], ancestors: above).isEmpty && p.kept(descendants: below).isEmpty)
        p.set(file, true); p.set(file, true)
        #expect(p.count == 1 && p.covers(file, ancestors: [folder]) && !p.covers(sub, ancestors: [folder]))
    }
}
