import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

/// The engine's one record per item: kept while the item is shown or busy, and the busy index
/// the checks after each push and pull walk.
@Suite struct ItemTableTests {
    static func record(_ id: ItemID, version: Int64 = 1, name: String = "f", deleted: Bool = false) -> ServerItem {
        var state = ItemState(kind: .file, location: ItemLocation(parent: .root, name: ItemName(trusted: name)),
                              mode: 0o644, modified: 1, modifiedBy: DeviceID(UUID()))
        state.deleted = deleted
        return ServerItem(id: id, version: version, state: state, conflicts: 0)
    }

    @Test func aRecordLivesWhileShownOrBusy() {
        var t = ItemTable()
        let a = ItemID(UUID())
        let rules = UploadPacing<ContinuousClock.Instant>.Rules(quietPeriod: .seconds(1)), now = ContinuousClock.now
        t[a, default: ItemTable.Item()].upload.on(.lockHeld, at: now, rules: rules)  // a new file waiting for a lock: no base
        #expect(t.count == 1 && t.busy == [a])
        t[a]?.base = Base.placeholder(Self.record(a))
        t[a]?.upload.on(.lockReleased, at: now, rules: rules)
        #expect(t.count == 1 && t.busy.isEmpty)
        t[a]?.base = nil  // deleted, nothing under way: forgotten
        #expect(t.count == 0 && t[a] == nil)
        t[a]?.upload.on(.lockHeld, at: now, rules: rules)  // optional chaining on a missing record creates nothing
        #expect(t.count == 0)
    }

    /// Two items can be at one name as this device last heard: one whose leaving it has not
    /// heard of yet (an older state), one that came since (a newer state). The newer holds the
    /// name; when either leaves, the other still does (`CommitPlan.nameFirst` asks the index).
    /// A delete's seen cursor stays below every state received and not shown: the table keeps
    /// which records hold one, as they gain and lose holds and are removed.
    @Test func heldVersionsFollowTheRecordsHolds() {
        var t = ItemTable()
        let a = ItemID(UUID()), b = ItemID(UUID()), c = ItemID(UUID())
        t[a, default: ItemTable.Item()].base = Base.placeholder(Self.record(a, version: 3))
        t[c, default: ItemTable.Item()].base = Base.placeholder(Self.record(c, version: 4))
        #expect(t.heldVersions.isEmpty)
        t[a]?.remote.holdForWriter(Self.record(a, version: 7))
        t[b, default: ItemTable.Item()].remote.skip(Self.record(b, version: 5))
        #expect(t.heldVersions.sorted() == [5, 7])
        _ = t[a]?.remote.holdForLock(Self.record(a, version: 9))
        #expect(t.heldVersions.sorted() == [5, 7, 9])
        _ = t[a]?.remote.takeForWriter()
        #expect(t.heldVersions.sorted() == [5, 9])
        t[a]?.remote.lockClaimed()  // no hold left: a is no longer looked at
        #expect(t.heldVersions == [5])
        t[b]?.remote.skippedShown()  // b had nothing else: its record goes with its hold
        #expect(t.heldVersions.isEmpty && t[b] == nil)
        t[c]?.remote.skip(Self.record(c, version: 6))
        t[c] = nil  // removed with its hold
        #expect(t.heldVersions.isEmpty)
    }

    @Test func aNameHeldByTwoItemsIsStillHeldWhenOneLeaves() {
        var t = ItemTable()
        let (old, new) = (ItemID(UUID()), ItemID(UUID()))
        let place = ItemTable.Place(parent: .root, name: ItemName(trusted: "d.txt"))
        t[old, default: ItemTable.Item()].base = .placeholder(Self.record(old, version: 44, name: "d.txt"))
        #expect(t.holder(of: place) == old)
        t[new, default: ItemTable.Item()].base = .placeholder(Self.record(new, version: 50, name: "d.txt"))
        #expect(t.holder(of: place) == new, "the newer state holds the name")
        // The older one's newest state is elsewhere now: the newer one still holds the name.
        t[old]?.remote.skip(Self.record(old, version: 52, name: "c.txt"))
        #expect(t.holder(of: place) == new)
        #expect(t.holder(of: ItemTable.Place(parent: .root, name: ItemName(trusted: "c.txt"))) == old)
        // Back at the name with a state newer than the other's, then deleted: the other holds it.
        t[old]?.remote.skippedShown()
        t[old]?.base = .placeholder(Self.record(old, version: 60, name: "d.txt"))
        #expect(t.holder(of: place) == old)
        t[old]?.base = nil
        #expect(t[old] == nil && t.holder(of: place) == new)
        t[new]?.base = .placeholder(Self.record(new, version: 61, name: "e.txt"))
        #expect(t.holder(of: place) == nil)
    }

    /// A create whose answer was lost may have applied: until an answer is settled, the item
    /// holds the name its commit asked for, though no state of it was heard here
    /// (`UploadState.sentPlace`), so a new item taking that name here waits for its push.
    @Test func aCreateWithoutItsAnswerHoldsTheNameItAskedFor() {
        var t = ItemTable()
        let id = ItemID(UUID())
        let place = ItemTable.Place(parent: .root, name: ItemName(trusted: "e.txt"))
        let rules = UploadPacing<ContinuousClock.Instant>.Rules(quietPeriod: .seconds(1)), now = ContinuousClock.now
        t[id, default: ItemTable.Item()].upload.on(.changed(content: true), at: now, rules: rules)
        t[id]?.upload.sentPlace = place
        #expect(t.holder(of: place) == nil, "sent, not failed yet: no answer is missing")
        t[id]?.upload.on(.failed(.transient, message: "the connection was lost", missingChunks: false), at: now, rules: rules)
        #expect(t.holder(of: place) == id, "the answer was lost: the server may have it there")
        // Sent again under another name (renamed here), that answer lost too.
        let renamed = ItemTable.Place(parent: .root, name: ItemName(trusted: "f.txt"))
        t[id]?.upload.sentPlace = renamed
        #expect(t.holder(of: place) == nil && t.holder(of: renamed) == id)
        // Its answer settled: the base says where it is.
        t[id]?.upload.on(.settling, at: now, rules: rules)
        #expect(t.holder(of: renamed) == nil)
        t[id]?.base = .placeholder(Self.record(id, version: 7, name: "f.txt"))
        #expect(t.holder(of: renamed) == id)
    }

    @Test func theQuotaLineCountsTheItemsWaitingAndShowsTheLatestFigures() {
        var t = ItemTable()
        let (a, b, c) = (ItemID(UUID()), ItemID(UUID()), ItemID(UUID()))
        let rules = UploadPacing<ContinuousClock.Instant>.Rules(quietPeriod: .seconds(1)), now = ContinuousClock.now
        #expect(t.quotaLine == nil)
        func over(_ id: ItemID, _ f: QuotaFigures?, at: ContinuousClock.Instant) {
            t[id, default: ItemTable.Item()].upload.on(.failed(.overQuota(f), message: "over", missingChunks: false), at: at, rules: rules)
        }
        over(a, QuotaFigures(usage: 90, quota: 100), at: now)
        over(b, QuotaFigures(usage: 95, quota: 100), at: now + .seconds(1))
        t[c, default: ItemTable.Item()].upload.on(.failed(.refused, message: "no", missingChunks: false), at: now, rules: rules)
        #expect(t.quotaLine == "over (uses 95 bytes of 100); 2 item(s) wait for room, retried every \(UploadState<ContinuousClock.Instant>.quotaRetrySeconds) s")
        over(a, nil, at: now + .seconds(2))
        #expect(t.quotaLine?.hasPrefix("over (no figures); 2 item(s)") == true)
    }

    /// The skipped and failed indexes follow every change of a record, so the checks after each
    /// push and pull need not look through every busy item of a burst.
    @Test func skippedAndFailedRecordsAreIndexed() {
        var t = ItemTable()
        let rules = UploadPacing<ContinuousClock.Instant>.Rules(quietPeriod: .seconds(1)), now = ContinuousClock.now
        let ids = (0..<4).map { _ in ItemID(UUID()) }
        for id in ids { t[id, default: ItemTable.Item()].upload.on(.lockHeld, at: now, rules: rules) }
        t[ids[2]]?.remote.skip(Self.record(ids[2], version: 9))
        t[ids[0]]?.remote.skip(Self.record(ids[0], version: 7))
        t[ids[3]]?.upload.on(.failed(.refused, message: "no", missingChunks: false), at: now, rules: rules)
        #expect(t.skipped == [ids[0], ids[2]] && t.failed == [ids[3]])
        #expect(t.skippedStates.map(\.version) == [7, 9], "oldest first")
        t[ids[0]]?.remote.skippedShown()
        #expect(t.skipped == [ids[2]])
        t[ids[2]] = nil
        t[ids[3]] = nil
        #expect(t.skipped.isEmpty && t.failed.isEmpty, "a removed record leaves both")
        #expect(t.busy == [ids[0], ids[1]])
    }

    @Test func generationsAreNeverReused() {
        var t = ItemTable()
        let a = ItemID(UUID())
        t[a, default: ItemTable.Item()].base = Base.placeholder(Self.record(a))
        let first = t[a]!.cache.generation
        t.newGeneration(a)
        let second = t[a]!.cache.generation
        #expect(second != first)
        t[a] = nil
        t[a, default: ItemTable.Item()].base = Base.placeholder(Self.record(a, version: 2))
        #expect(![first, second].contains(t[a]!.cache.generation), "a download started before the removal must not count")
        // Replacing the base keeps the generation: the cache file is the same until a reset.
        let third = t[a]!.cache.generation
        t[a]?.base = Base.placeholder(Self.record(a, version: 3))
        #expect(t[a]!.cache.generation == third)
    }

    @Test func itKeepsCountsOfPlaceholdersAndConflicts() {
        var t = ItemTable()
        let a = ItemID(UUID()), b = ItemID(UUID())
        var conflicted = Self.record(b, version: 2)
        conflicted.conflicts = 1
        t[a, default: ItemTable.Item()].base = Base(record: Self.record(a), present: [false])
        t[b, default: ItemTable.Item()].base = Base(record: conflicted, present: nil)
        #expect(t.placeholders == 0 && t.conflicted == 1, "a file without chunks is complete")
        var withChunk = Self.record(a, version: 2)
        withChunk.chunks = [ChunkRef(hash: ContentHash(digest: [UInt8](repeating: 1, count: 32)), size: 5)]
        t[a]?.base = Base.placeholder(withChunk)
        #expect(t.placeholders == 1)
        t[a]?.base?.present = nil
        #expect(t.placeholders == 0)
        t[a]?.base = Base.placeholder(withChunk)
        t[a] = nil
        t[b]?.base = nil
        #expect(t.placeholders == 0 && t.conflicted == 0 && t.count == 0)
    }

    /// The tick reads the table's indexes instead of looking through every record: files being
    /// written, records waiting for an instant, the bytes of content held here, and the records
    /// only time will make idle. Random changes to a dozen records on a stepped clock: after each,
    /// every index is what a look through all records finds, and each settle (the rules changed
    /// once on the way) leaves every record as settling it alone would.
    @Test func theTicksIndexesFollowTheRecords() {
        var t = ItemTable()
        // A fixed linear congruential sequence (high bits): the run repeats exactly.
        var seed: UInt64 = 0x5EED
        func next() -> UInt64 {
            seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return seed >> 33
        }
        let ids = (0..<12).map { _ in ItemID(UUID()) }
        var rules = UploadPacing<ContinuousClock.Instant>.Rules(quietPeriod: .seconds(1))
        var now = ContinuousClock.now
        var settles = 0, settledByTime = 0
        func withChunks(_ id: ItemID, version: Int64) -> ServerItem {
            var r = Self.record(id, version: version)
            r.chunks = (1...2).map { ChunkRef(hash: ContentHash(digest: [UInt8](repeating: UInt8($0), count: 32)), size: 100 * $0) }
            return r
        }
        for step in 0..<4000 {
            let id = ids[Int(next() % UInt64(ids.count))]
            let version = Int64(step + 1)
            switch next() % 14 {
            case 12:
                // Idle but for a note that time does not clear: settled at the next tick.
                t[id, default: ItemTable.Item()].upload.sentPlace = ItemTable.Place(parent: ids[0], name: ItemName(trusted: "n"))
            case 0: t[id, default: ItemTable.Item()].upload.on(.changed(content: true), at: now, rules: rules)
            case 1: t[id, default: ItemTable.Item()].upload.on(.wrote, at: now, rules: rules)
            case 2: t[id]?.upload.on(.writersGone, at: now, rules: rules)
            case 3: t[id, default: ItemTable.Item()].upload.on(.paced(until: now + .seconds(Int(next() % 4))), at: now, rules: rules)
            case 4: t[id]?.upload.on(.committing(snapshot: false), at: now, rules: rules)
            case 5: t[id]?.upload.on(.pushEnded(closed: true), at: now, rules: rules)
            case 6: t[id]?.upload.on(.uploaded(sent: 10, written: 0), at: now, rules: rules)
            case 7:
                let r = withChunks(id, version: version)
                let present: [[Bool]?] = [nil, [false, false], [true, false], [false, true]]
                t[id, default: ItemTable.Item()].base = Base(record: r, present: present[Int(next() % 4)])
            case 8: t[id]?.base = nil
            case 9: t[id, default: ItemTable.Item()].remote.skip(Self.record(id, version: version))
            case 10: t[id]?.remote = RemoteHolds()
            case 11: t[id, default: ItemTable.Item()].upload.on(next() % 2 == 0 ? .lockHeld : .lockReleased, at: now, rules: rules)
            default:
                now = now + .milliseconds(Int(next() % 3000))
                if step == 2000 { rules = UploadPacing.Rules(quietPeriod: .seconds(2), burst: 2) }
                var expected: [ItemID: (busy: Bool, kept: Bool)] = [:]
                for (id, item) in t.all {
                    var alone = item
                    alone.settle(at: now, rules: rules)
                    expected[id] = (alone.busy, alone.base != nil || alone.busy)
                    if item.busy && !alone.busy { settledByTime += 1 }
                }
                t.settle(at: now, rules: rules)
                settles += 1
                for (id, e) in expected {
                    #expect(t[id]?.busy ?? false == e.busy, "step \(step): settled as alone")
                    #expect((t[id] != nil) == e.kept, "step \(step): kept as alone")
                }
            }
            let writing = t.all.filter { $0.value.busy && $0.value.upload.writing }.map(\.key).sorted()
            let paced = t.all.filter { $0.value.busy && $0.value.upload.notBefore != nil }.map(\.key).sorted()
            let bytes = t.all.values.reduce(Int64(0)) { $0 + ($1.base.map { $0.record.kind == .file ? $0.presentBytes : 0 } ?? 0) }
            #expect(t.writingIDs == writing, "step \(step): files being written")
            #expect(t.pacedIDs == paced, "step \(step): records waiting for an instant")
            #expect(t.contentBytes == bytes, "step \(step): content bytes")
        }
        #expect(settles > 200 && settledByTime > 50, "the run settled records by time: \(settles) settles, \(settledByTime) records")
    }

    @Test func settlingDropsIdleRecordsWithoutABase() {
        var t = ItemTable()
        let rules = UploadPacing<ContinuousClock.Instant>.Rules(quietPeriod: .seconds(1))
        let now = ContinuousClock.now
        let shown = ItemID(UUID()), fresh = ItemID(UUID()), held = ItemID(UUID())
        t[shown, default: ItemTable.Item()].base = Base.placeholder(Self.record(shown))
        t[shown]?.upload.on(.changed(content: true), at: now, rules: rules)
        t[fresh, default: ItemTable.Item()].upload.on(.changed(content: true), at: now, rules: rules)
        t[held, default: ItemTable.Item()].remote.skip(Self.record(held))
        #expect(t.busy == [shown, fresh, held])
        t.settle(at: now + .seconds(7200), rules: rules)
        #expect(t.busy == [held])
        #expect(t[shown]?.base != nil && t[fresh] == nil && t.count == 2)
        #expect(t.bases.map(\.key) == [shown])
    }
}

/// The cache keeper's plans on the item table.
@Suite struct EvictionTests {
    @Test func leastRecentlyReadFirstAndOnlyWhatMayGo() {
        var t = ItemTable()
        let ids = (0..<3).map { _ in ItemID(UUID()) }
        for (k, id) in ids.enumerated() {
            t[id, default: ItemTable.Item()].base = Base(record: ContentPlanTests.file([10], id: id), present: nil)
            t.withCache(id) { $0.lastUse = UInt64(10 - k) }
        }
        #expect(t.evictionOrder(keep: []) == [ids[2], ids[1], ids[0]])
        #expect(t.evictionOrder(keep: [ids[2]]) == [ids[1], ids[0]], "kept ones are left out")
        #expect(t.evict(ids[1], unsent: true, downloading: false) == nil, "changes not uploaded yet")
        #expect(t.evict(ids[1], unsent: false, downloading: true) == nil, "a download under way")
        let evicted = t.evict(ids[1], unsent: false, downloading: false)
        #expect(evicted?.base.present == [false] && t[ids[1]]?.cache.lastUse == 0)
        #expect(t.evictionOrder(keep: []) == [ids[2], ids[0]], "nothing of it is here any more")
    }
}

/// What a finished chunk download does to the item's content.
@Suite struct ChunkArrivalTests {
    @Test func aChunkIsMarkedOnlyForTheContentItWasFetchedFor() {
        var t = ItemTable()
        let r = ApplyGatherTests.withChunks(5, [1, 2]), id = r.id
        let rules = UploadPacing<ContinuousClock.Instant>.Rules(quietPeriod: .seconds(1)), now = ContinuousClock.now
        t[id, default: ItemTable.Item()].base = Base.placeholder(r)
        t.newGeneration(id)
        let gen = t[id]!.cache.generation
        let h0 = r.chunks[0].hash, h1 = r.chunks[1].hash
        func arrive(_ i: Int, _ h: ContentHash, at offset: Int64, gen g: UInt64?, truncated: Bool = false) -> ChunkArrival {
            t.chunkArrived(id, index: i, hash: h, offset: offset, generation: g, truncated: truncated, use: 7, at: now, rules: rules)
        }
        #expect(arrive(0, h0, at: 0, gen: nil) == .replaced, "no file of this content was open")
        #expect(arrive(0, h0, at: 0, gen: gen, truncated: true) == .overwritten)
        #expect(arrive(0, h0, at: 0, gen: gen &+ 1) == .replaced, "another content's file")
        #expect(arrive(0, h1, at: 0, gen: gen) == .replaced, "not this content's chunk")
        #expect(arrive(1, h1, at: 3, gen: gen) == .replaced, "not at this offset")
        #expect(t[id]?.base?.present == [false, false])
        #expect(arrive(0, h0, at: 0, gen: gen) == .present(Base(record: r, present: [true, false])))
        #expect(t[id]?.cache.lastUse == 7)
        #expect(arrive(1, h1, at: 4, gen: gen) == .whole(Base(record: r, present: nil)))
        #expect(t[id]?.base?.complete == true)
        #expect(arrive(1, h1, at: 4, gen: gen) == .overwritten, "whole already: nothing to mark")
    }
}

extension ItemTableTests {
    /// The table knows which item the server has at each place (the live bases), as bases come,
    /// move and go.
    @Test func theItemAtEachPlaceFollowsTheBases() {
        var t = ItemTable()
        let a = ItemID(UUID()), b = ItemID(UUID())
        func at(_ name: String) -> ItemID? { t.holder(of: .init(parent: .root, name: ItemName(trusted: name))) }
        t[a, default: ItemTable.Item()].base = Base.placeholder(Self.record(a))
        #expect(at("f") == a && at("g") == nil)
        t[a]?.base = Base.placeholder(Self.record(a, version: 2, name: "g"))
        #expect(at("f") == nil && at("g") == a)
        t[b, default: ItemTable.Item()].base = Base.placeholder(Self.record(b))
        #expect(at("f") == b, "a new item at the name it left")
        #expect(t.holder(of: .init(parent: .root, name: ItemName(trusted: "f\u{301}"))) == nil, "names are bytes")
        t[a]?.base = Base.placeholder(Self.record(a, version: 3, name: "g", deleted: true))
        #expect(at("g") == nil, "a deleted item holds no name")
        t[b] = nil
        #expect(at("f") == nil)
    }
}
