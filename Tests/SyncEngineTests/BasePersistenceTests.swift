import Foundation
import SyncCore
import LocalStore
import NimbusCore
import NimbusProtocol
import NimbusRemote
@testable import SyncEngine
import Testing

/// What a restart reads back of the bases (`sync_item`) when base writes race each other.
@Suite struct BasePersistenceTests {
    func record(version: Int64, sizes: [Int64]) -> ServerItem {
        let chunks = sizes.enumerated().map { i, s in ChunkRef(hash: ContentHash(digest: [UInt8](repeating: UInt8(i), count: 32)), size: s) }
        let state = ItemState(kind: .file, location: ItemLocation(parent: .root, name: ItemName(trusted: "f.txt")),
                              content: ItemContent(chunks: chunks), mode: 0o644, modified: 1, modifiedBy: DeviceID(UUID()))
        return ServerItem(id: ItemID(UUID()), version: version, state: state, conflicts: 0)
    }

    func withEngine(_ body: (LocalStore, URL) throws -> Void) throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-basepersist-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: dir) }
        let store = try LocalStore(directory: dir)
        defer { store.close() }
        try body(store, dir)
    }

    /// The client is never called here (port 9: discard, nothing listens).
    func engine(_ store: LocalStore) throws -> SyncEngine {
        try SyncEngine(store: store, client: NimbusClient(baseURL: "http://127.0.0.1:9", token: "unused"), container: "docs")
    }

    /// EngineSimTests seed 5: a pull showed a new item as a placeholder (in memory), a program
    /// rewrote the file with O_TRUNC before the pull wrote its bases (the write marks the base
    /// complete, in memory and on disk), then the pull wrote its older copy over it. After a
    /// crash the restarted push found "not downloaded, so not changed here" and the write was lost.
    @Test func aWriteIntoAPlaceholderStaysCompleteWhenAnOlderCopyIsWrittenAfterIt() throws {
        try withEngine { store, _ in
            let e = try engine(store)
            let item = record(version: 5, sizes: [100, 200])
            let placeholder = Base.placeholder(item)
            #expect(!placeholder.complete)
            e.state.withLock { $0.setBase(item.id, placeholder) }  // the pull's tree change
            e.localChange(.contentChanged(item.id))                // O_TRUNC + write, then close
            try e.persistBases([item.id: placeholder])             // the pull's copy, written late
            store.commitQueued()  // what a clean stop (or a crash after the writer's next commit) leaves
            let restarted = try engine(store)
            let base = restarted.state.withLock { $0.base(item.id) }
            #expect(base?.version == 5)
            #expect(base?.complete == true, "the restarted engine must know the file was written here")
        }
    }

    /// A newer version in memory is not written ahead of its own writer (which commits the tree
    /// change first): the version passed is what goes to disk.
    @Test func aNewerVersionInMemoryIsLeftToItsOwnWriter() throws {
        try withEngine { store, _ in
            let e = try engine(store)
            let v5 = record(version: 5, sizes: [100])
            let v6 = ServerItem(id: v5.id, version: 6, state: v5.state, conflicts: 0)
            e.state.withLock { $0.setBase(v5.id, Base.placeholder(v6)) }
            try e.persistBases([v5.id: Base.placeholder(v5)])
            store.commitQueued()
            #expect(try store.syncBases()[v5.id]?.version == 5)
        }
    }

    /// Downloads save only presence; a later write of the same version keeps the newest presence.
    @Test func presenceFromADownloadIsNotUndoneByAStaleCopy() throws {
        try withEngine { store, _ in
            let e = try engine(store)
            let item = record(version: 2, sizes: [10, 10, 10])
            let stale = Base.placeholder(item)
            try e.saveBase(item.id, stale)
            e.state.withLock { $0.setBase(item.id, Base(record: item, present: [true, true, false])) }
            try e.persistPresence(item.id)
            try e.persistBases([item.id: stale])
            store.commitQueued()  // what a clean stop (or a crash after the writer's next commit) leaves
            let restarted = try engine(store)
            #expect(restarted.state.withLock { $0.base(item.id)?.present } == [true, true, false])
        }
    }

    @Test func recordsSurviveTheBinaryFormAndOldJSONRowsStillRead() throws {
        var file = record(version: 9, sizes: [4_000_000, 123, 77])
        file.extra = JSONValue.parse(#"{"tags":["a","b"],"rating":4}"#)
        file.conflicts = 2
        var link = record(version: 1, sizes: [])
        link.kind = .symlink
        link.symlinkTarget = "../ü/target"
        link.name = ItemName(trusted: "läńk 🎉")
        link.size = Int64("../ü/target".utf8.count)
        var gone = record(version: 12, sizes: [])
        gone.kind = .folder
        gone.deleted = true
        for r in [file, link, gone] {
            let data = BaseCoding.encode(r)
            #expect(data.first == BaseCoding.binaryTag)
            #expect(try BaseCoding.decode(data) == r)
            // Rows written by earlier versions are JSON.
            #expect(try BaseCoding.decode(try JSONEncoder().encode(r)) == r)
        }
        // A damaged row is an error, not a wrong record.
        let data = BaseCoding.encode(file)
        #expect(throws: BaseCodingError.self) { try BaseCoding.decode(data.prefix(data.count - 3)) }
    }

    /// A content change queued before a crash, whose notice's own note (the file is whole here)
    /// never reached the disk: the next start knows the file was written here, or its push would
    /// take the placeholder's chunks as the content and the write would never leave.
    @Test func aQueuedContentChangeMakesItsPlaceholderWholeAtStart() throws {
        try withEngine { store, _ in
            let e = try engine(store)
            let item = record(version: 5, sizes: [100, 200])
            try e.saveBase(item.id, Base.placeholder(item))
            store.enqueue(.syncOp(item.id, kind: .content))
            store.commitQueued()
            let restarted = try engine(store)
            #expect(try restarted.recoverQueue() == [item.id])
            #expect(restarted.state.withLock { $0.base(item.id)?.complete } == true)
            store.commitQueued()
            #expect(try engine(store).state.withLock { $0.base(item.id)?.complete } == true, "and on disk")
        }
    }

    /// After an unclean stop every whole file is queued on disk for one push: a clean stop before
    /// that push does not forget it.
    @Test func theRecheckAfterAnUncleanStopIsQueuedOnDisk() throws {
        try withEngine { store, _ in
            let e = try engine(store)
            let item = record(version: 5, sizes: [100])
            try e.saveBase(item.id, Base(record: item, present: nil))
            #expect(try e.recheckAfterUncleanStop(size: { _ in 100 }) == [item.id])
            store.commitQueued()
            #expect(try store.syncOps().map(\.item) == [item.id])
            #expect(try e.recheckAfterUncleanStop(size: { _ in nil }).isEmpty, "files not in the tree are left alone")
        }
    }

    /// A placeholder whose size here is not its version's was written here before an unclean
    /// stop (its change's notes lost with a full disk): it is whole and pushed, not left a
    /// placeholder of the wrong size whose reads mix the version's bytes with zeros. A placeholder
    /// of its version's size stays one.
    @Test func aPlaceholderWrittenBeforeAnUncleanStopIsWholeAndPushed() throws {
        try withEngine { store, _ in
            let e = try engine(store)
            let written = record(version: 5, sizes: [26]), untouched = record(version: 6, sizes: [40])
            try e.saveBase(written.id, Base.placeholder(written))
            try e.saveBase(untouched.id, Base.placeholder(untouched))
            let queued = try e.recheckAfterUncleanStop(size: { $0 == written.id ? 27 : 40 })
            #expect(queued == [written.id])
            store.commitQueued()
            #expect(try engine(store).state.withLock { ($0.base(written.id)?.complete, $0.base(untouched.id)?.complete) } == (true, false),
                    "whole on disk; the other still a placeholder")
        }
    }
}
