import Foundation
import NimbusCore
import NimbusProtocol
import NimbusServer

/// The conformance suite every `ServerStore` engine must pass. Each case is a function of a fresh
/// store; test targets run every case on every engine (`@Test(arguments: StoreConformance.allCases)`),
/// opening the store with the case's `retention`. A failed expectation throws `ConformanceFailure`
/// with what differed.
public enum StoreConformance: String, CaseIterable, Sendable {
    case versionsAndJournalOrder
    case cursorPaging
    case staleBaseLaterMtimeWins
    case staleBaseEarlierMtimeLoses
    case sameNameCreates
    case editVsDelete
    case deleteVsEdit
    case moveCycleRejected
    case folderDeletedWhileChildChanged
    case folderDeleteSparesUnseenChildren
    case renameAndEditBothApply
    case baselessCommitKeepsTheCommittersLaterRename
    case attributesMergeNameByName
    case lostAnswersAreTheCommittersOwnBase
    case resolveAndRestore
    case missingChunksRejected
    case accountsAreIsolated
    case retriesAreIdempotent
    case pagesAreBoundedInBytes
    case revokedDevicesAreRefused
    case historyKeepsLastVersions
    case historyKeepsRecentVersions
    case historyNeverPrunesConflicts
    case historyPrunedBaseIsUnknown
    case pairingCodesWorkOnceAndExpire
    case trashEntryRestoreAndPurge
    case trashRegroupsAndExpires
    case folderListingsAreByNameAndPaged
    case webSessionsExpireWhenIdle

    /// The history retention to open the store with for this case (the default for all but the
    /// history cases, which are in StoreConformance+History.swift).
    public var retention: HistoryRetention {
        switch self {
        case .historyKeepsLastVersions: HistoryRetention(keepVersions: 2, keepDays: 0)!
        case .historyKeepsRecentVersions: HistoryRetention(keepVersions: 2, keepDays: 30)!
        case .historyNeverPrunesConflicts: HistoryRetention(keepVersions: 0, keepDays: 0)!
        case .historyPrunedBaseIsUnknown: HistoryRetention(keepVersions: 5, keepDays: 0)!
        default: .default
        }
    }

    public func run(_ store: any ServerStore) async throws {
        let f = try await StoreFixture.make(store)
        switch self {
        case .versionsAndJournalOrder: try await Self.versionsAndJournalOrder(f)
        case .cursorPaging: try await Self.cursorPaging(f)
        case .staleBaseLaterMtimeWins: try await Self.staleBase(f, laterWins: true)
        case .staleBaseEarlierMtimeLoses: try await Self.staleBase(f, laterWins: false)
        case .sameNameCreates: try await Self.sameNameCreates(f)
        case .editVsDelete: try await Self.editVsDelete(f, editFirst: true)
        case .deleteVsEdit: try await Self.editVsDelete(f, editFirst: false)
        case .moveCycleRejected: try await Self.moveCycle(f)
        case .folderDeletedWhileChildChanged: try await Self.folderDeletedWhileChildChanged(f)
        case .folderDeleteSparesUnseenChildren: try await Self.folderDeleteSparesUnseenChildren(f)
        case .renameAndEditBothApply: try await Self.renameAndEdit(f)
        case .baselessCommitKeepsTheCommittersLaterRename: try await Self.baselessCommit(f)
        case .attributesMergeNameByName: try await Self.attributesMerge(f)
        case .lostAnswersAreTheCommittersOwnBase: try await Self.lostAnswers(f)
        case .resolveAndRestore: try await Self.resolveAndRestore(f)
        case .missingChunksRejected: try await Self.missingChunks(f)
        case .accountsAreIsolated: try await Self.accountsAreIsolated(f)
        case .retriesAreIdempotent: try await Self.retries(f)
        case .pagesAreBoundedInBytes: try await Self.pagesAreBoundedInBytes(f)
        case .revokedDevicesAreRefused: try await Self.revokedDevices(f)
        case .historyKeepsLastVersions: try await Self.historyKeepsLastVersions(f)
        case .historyKeepsRecentVersions: try await Self.historyKeepsRecentVersions(f)
        case .historyNeverPrunesConflicts: try await Self.historyNeverPrunesConflicts(f)
        case .historyPrunedBaseIsUnknown: try await Self.historyPrunedBaseIsUnknown(f)
        case .pairingCodesWorkOnceAndExpire: try await Self.pairingCodes(f)
        case .trashEntryRestoreAndPurge: try await Self.trashEntryRestoreAndPurge(f)
        case .trashRegroupsAndExpires: try await Self.trashRegroupsAndExpires(f)
        case .folderListingsAreByNameAndPaged: try await Self.folderListings(f)
        case .webSessionsExpireWhenIdle: try await Self.webSessions(f)
        }
        let problems = try await store.consistencyProblems()
        try check(problems.isEmpty, "store inconsistent after \(rawValue): \(problems)")
    }

    static func versionsAndJournalOrder(_ f: StoreFixture) async throws {
        let (folder, _) = try await f.create(.folder, "Docs")
        let c1 = try await f.chunk("one"), c2 = try await f.chunk("two"), c3 = try await f.chunk("three")
        let (file, v1) = try await f.create(.file, "a.txt", in: folder, chunks: [c1])
        let r2 = try await f.commit(file, base: v1, f.draft(.file, "a.txt", in: folder, chunks: [c2], t: 2_000))
        let r3 = try await f.commit(file, base: r2.item.version, f.draft(.file, "a.txt", in: folder, chunks: [c2, c3], t: 3_000))
        try check(r3.outcome == .applied && r3.item.size == 200, "update applied with size 200, got \(r3)")
        let changes = try await f.allChanges()
        try check(changes.map(\.seq) == [1, 2, 3, 4], "journal seqs 1…4, got \(changes.map(\.seq))")
        try check(changes.map(\.kind) == [.create, .create, .update, .update], "journal kinds, got \(changes.map(\.kind))")
        try check(changes.last?.item.chunks == [c2, c3] && changes.last?.device == f.a.id, "last change carries the state")
        let item = try await f.item(file)
        try check(item.version == 4 && item.parent == folder, "item version 4 in its folder, got \(item)")
        let versions = try await f.store.versions(of: file, in: f.container)
        try check(versions.map(\.version) == [4, 3, 2], "versions newest first, got \(versions.map(\.version))")
        try check(versions.map(\.role) == [.current, .previous, .previous], "roles, got \(versions.map(\.role))")
        try check(versions[2].state.chunks == [c1] && versions[2].deviceName == "laptop", "first version kept with its device name")
        try check(try await f.store.cursor(of: f.container) == 4, "cursor 4")
    }

    static func cursorPaging(_ f: StoreFixture) async throws {
        for i in 0..<25 { _ = try await f.create(.folder, "f\(i)") }
        var since: Int64 = 0
        var pages: [[Int64]] = []
        while true {
            let page = try await f.store.changes(in: f.container, since: since, limit: 10)
            pages.append(page.changes.map(\.seq))
            try check(page.cursor >= since, "cursor never goes back")
            since = page.cursor
            if !page.more { break }
        }
        try check(pages == [Array(1...10), Array(11...20), Array(21...25)], "pages of 10, got \(pages)")
        let empty = try await f.store.changes(in: f.container, since: 25, limit: 10)
        try check(empty.changes.isEmpty && empty.cursor == 25 && !empty.more, "nothing after the end")
        var listed: [ItemID] = []
        var after: ItemID? = nil
        repeat {
            let page = try await f.store.items(in: f.container, after: after, limit: 7)
            listed += page.items.map(\.id)
            after = page.next
            try check(page.cursor == 25, "listing reports the cursor")
        } while after != nil
        try check(listed.count == 25 && listed == listed.sorted(), "listing pages by id, got \(listed.count)")
    }

    /// Records of the largest legal size (`maxChunksPerItem` references): a page of changes, of
    /// the listing or of versions stops at `ProtocolLimits.maxPageBytes` of records (one record
    /// alone may pass it), and paging on brings every entry exactly once, in order.
    static func pagesAreBoundedInBytes(_ f: StoreFixture) async throws {
        let c = try await f.chunk("big")
        let refs = [ChunkRef](repeating: c, count: ProtocolLimits.maxChunksPerItem)
        let (file, v1) = try await f.create(.file, "big.bin", chunks: refs)
        var base = v1
        for k in 0..<2 {
            var d = f.draft(.file, "big.bin", chunks: refs)
            d.mode = k == 0 ? 0o600 : 0o640
            base = try await f.commit(file, base: base, d).item.version
        }
        _ = try await f.create(.file, "small.txt")
        func size(_ r: ItemRecord) throws -> Int { try JSONEncoder().encode(r).count }
        func checkPage(_ records: [ItemRecord], _ what: String) throws {
            let bytes = try records.reduce(0) { $0 + (try size($1)) }
            try check(!records.isEmpty, "\(what): an empty page")
            // Stored records are compact JSON like these, within a few percent.
            try check(records.count == 1 || bytes <= ProtocolLimits.maxPageBytes * 21 / 20,
                      "\(what): \(records.count) records, \(bytes) bytes, over the page's budget")
        }
        var since: Int64 = 0
        var seqs: [Int64] = []
        var pages = 0
        while true {
            let page = try await f.store.changes(in: f.container, since: since, limit: 1000)
            try checkPage(page.changes.map(\.item), "changes after \(since)")
            seqs += page.changes.map(\.seq)
            pages += 1
            try check(page.cursor > since || !page.more, "the cursor moves on")
            since = page.cursor
            if !page.more { break }
        }
        try check(seqs == Array(1...Int64(seqs.count)) && seqs.count == 4 && pages >= 2, "every change once, in order, over several pages: \(seqs) in \(pages)")
        var before: Int64?
        var versions: [Int64] = []
        repeat {
            let page = try await f.store.versions(of: file, in: f.container, before: before)
            try checkPage(page.versions.map(\.state), "versions before \(before ?? 0)")
            versions += page.versions.map(\.version)
            before = page.next
        } while before != nil
        try check(versions == versions.sorted(by: >) && versions.count == 3, "every version once, newest first: \(versions)")
        var listed: [ItemID] = []
        var after: ItemID?
        repeat {
            let page = try await f.store.items(in: f.container, after: after, limit: 1000)
            try checkPage(page.items, "items after \(after?.description ?? "")")
            listed += page.items.map(\.id)
            after = page.next
        } while after != nil
        try check(listed.count == 2, "the listing has both items: \(listed.count)")
    }

    static func staleBase(_ f: StoreFixture, laterWins: Bool) async throws {
        let base = try await f.chunk("base"), mine = try await f.chunk("A-edit"), theirs = try await f.chunk("B-edit")
        let (file, v1) = try await f.create(.file, "doc.txt", chunks: [base])
        // A commits first; B, still on v1, commits later with a later (or earlier) mtime.
        let ra = try await f.commit(file, base: v1, f.draft(.file, "doc.txt", chunks: [mine], t: 2_000), by: f.a)
        try check(ra.outcome == .applied, "fresh base applies")
        let rb = try await f.commit(file, base: v1, f.draft(.file, "doc.txt", chunks: [theirs], t: laterWins ? 3_000 : 1_500), by: f.b)
        try check(rb.outcome == .conflict, "stale base with a different edit is a conflict, got \(rb.outcome)")
        try check(rb.yours == (laterWins ? "current" : "conflict"), "B's version is \(laterWins ? "current" : "conflict"), got \(rb.yours ?? "nil")")
        let item = try await f.item(file)
        try check(item.chunks == (laterWins ? [theirs] : [mine]), "the later edit is current")
        try check(item.conflicts == 1, "one unresolved conflict, got \(item.conflicts)")
        let versions = try await f.store.versions(of: file, in: f.container)
        let conflict = versions.filter { $0.role == .conflict }
        try check(conflict.count == 1 && conflict[0].state.chunks == (laterWins ? [mine] : [theirs]), "the other edit is the conflict version")
        try check(conflict[0].deviceName == (laterWins ? "laptop" : "desktop"), "conflict version names its device")
        try check(versions.contains { $0.state.chunks == [base] }, "the base is history")
        let last = try await f.allChanges().last
        try check(last?.kind == .conflict && last?.item.conflicts == 1, "every device sees the conflict in the journal")
    }

    /// A web view's session (docs/web.md): used within the idle time it lives on (and is listed
    /// with its last use); the page's own asking (live refresh) keeps nothing alive; idle longer
    /// it is revoked; other devices are not touched.
    static func webSessions(_ f: StoreFixture) async throws {
        let token = UUID().uuidString
        let web = try await f.store.addDevice(account: "dora", deviceName: "browser", tokenHash: TokenHash.of(token))
        let laptop = try await f.store.addDevice(account: "dora", deviceName: "laptop", tokenHash: TokenHash.of(UUID().uuidString))
        try check(try await f.store.webSession(web.id, .start, now: 1_000, idleSeconds: 60), "a session starts")
        try check(try await f.store.webSession(web.id, .use, now: 1_060, idleSeconds: 60), "used at the idle time's end: lives")
        try check(try await f.store.webSession(web.id, .use, now: 1_100, idleSeconds: 60), "used again within it: lives")
        try check(try await f.store.webSession(web.id, .check, now: 1_150, idleSeconds: 60), "asked by the page within the idle time: lives")
        let listed = try await f.store.devices(account: "dora")
        try check(listed.first { $0.id == web.id }?.webUsed == 1_100, "the session's last use is listed: \(listed)")
        try check(listed.first { $0.id == laptop.id }?.webUsed == nil, "another device is no web session: \(listed)")
        try check(!(try await f.store.webSession(web.id, .check, now: 1_161, idleSeconds: 60)), "the page's own asking is no use: idle 61 s of 60, expired")
        try check(try await f.store.device(tokenHash: TokenHash.of(token)) == nil, "an expired session's token is refused")
        try check(try await f.store.devices(account: "dora").first { $0.id == web.id }?.revoked == 1_161, "and it is listed as revoked")
        try check(!(try await f.store.webSession(web.id, .use, now: 1_162, idleSeconds: 60)), "and stays so")
        try check(try await f.store.webSession(laptop.id, .use, now: 99_999, idleSeconds: 60), "a device's own token never expires")
        try check(try await f.store.devices(account: "dora").first { $0.id == laptop.id }?.revoked == nil, "the laptop is not revoked")
    }

    /// The web view's folder pages: live children only, ordered by the bytes of their names
    /// (whatever the database's collation), paged by the last name; the account's containers.
    static func folderListings(_ f: StoreFixture) async throws {
        let (folder, _) = try await f.create(.folder, "Inbox")
        // Bytes order: "B" < "a" < "b" < "é" (0xC3 0xA9) < "\u{202E}…" (0xE2 …).
        let names = ["b", "a", "B", "é", "\u{202E}txt.exe", "<script>"]
        for n in names { _ = try await f.create(.file, n, in: folder) }
        let (gone, vg) = try await f.create(.file, "gone", in: folder)
        try await f.commit(gone, base: vg, f.draft(.file, "gone", in: folder, deleted: true))
        _ = try await f.create(.file, "elsewhere")
        let expected = names.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
        let all = try await f.store.children(of: folder, in: f.container, after: nil, limit: 100).map(\.name.value)
        try check(all == expected, "children by bytes, live only: \(all)")
        var paged: [String] = []
        var after: String? = nil
        while true {
            let page = try await f.store.children(of: folder, in: f.container, after: after, limit: 4)
            paged += page.map(\.name.value)
            guard page.count == 4, let last = page.last else { break }
            after = last.name.value
        }
        try check(paged == expected, "pages of 4 add up to the listing: \(paged)")
        let top = try await f.store.children(of: .root, in: f.container, after: nil, limit: 10).map(\.name.value)
        try check(top == ["Inbox", "elsewhere"], "the root's children: \(top)")
        _ = try await f.store.container(account: f.a.accountID, name: "com.example.a", create: true)
        let containers = try await f.store.containers(account: f.a.accountID)
        try check(containers == ["com.example.a", "com.example.notes"], "the account's containers: \(containers)")
        let other = try await f.store.addDevice(account: "bob", deviceName: "phone", tokenHash: TokenHash.of(UUID().uuidString))
        try check(try await f.store.containers(account: other.accountID).isEmpty, "another account has none")
        let place = try await f.store.place(of: gone, in: f.container)
        try check(place == ItemPlace(kind: .file, parent: folder, name: "gone", deleted: true), "an item's place: \(String(describing: place))")
        try check(try await f.store.place(of: ItemID(UUID()), in: f.container) == nil, "no place for an unknown item")
    }

    static func sameNameCreates(_ f: StoreFixture) async throws {
        let (folder, _) = try await f.create(.folder, "Inbox")
        let (x, _) = try await f.create(.file, "notes.txt", in: folder, by: f.a)
        let y = ItemID(UUID())
        let ry = try await f.commit(y, base: nil, f.draft(.file, "notes.txt", in: folder), by: f.b)
        try check(ry.renamed && ry.item.name.value == "notes 2.txt", "second create renamed to 'notes 2.txt', got \(ry.item.name)")
        let z = try await f.commit(ItemID(UUID()), base: nil, f.draft(.file, "notes.txt", in: folder))
        try check(z.item.name.value == "notes 3.txt", "third create is 'notes 3.txt', got \(z.item.name)")
        try check(try await f.item(x).name.value == "notes.txt", "the first keeps its name")
        // A move onto a taken name is renamed the same way.
        let (w, vw) = try await f.create(.file, "other.txt", in: folder)
        let rw = try await f.commit(w, base: vw, f.draft(.file, "notes.txt", in: folder))
        try check(rw.item.name.value == "notes 4.txt", "move onto a taken name, got \(rw.item.name)")
    }

    static func editVsDelete(_ f: StoreFixture, editFirst: Bool) async throws {
        let c0 = try await f.chunk("v0"), c1 = try await f.chunk("v1")
        let (file, v1) = try await f.create(.file, "plan.md", chunks: [c0])
        let edit = f.draft(.file, "plan.md", chunks: [c1], t: 2_000)
        let delete = f.draft(.file, "plan.md", chunks: [c0], t: 3_000, deleted: true)
        if editFirst {
            try await f.commit(file, base: v1, edit, by: f.a)
            let r = try await f.commit(file, base: v1, delete, by: f.b)
            try check(r.outcome == .deleteIgnored, "a stale delete of an edited item is ignored, got \(r.outcome)")
        } else {
            try await f.commit(file, base: v1, delete, by: f.b)
            let r = try await f.commit(file, base: v1, edit, by: f.a)
            try check(r.outcome == .applied && !r.item.deleted, "an edit of a deleted item brings it back")
            try check(try await f.allChanges().last?.kind == .restore, "journal says restore")
        }
        let item = try await f.item(file)
        try check(!item.deleted && item.chunks == [c1], "the edit wins: item alive with the edit, got \(item)")
    }

    static func moveCycle(_ f: StoreFixture) async throws {
        let (a, va) = try await f.create(.folder, "a")
        let (b, _) = try await f.create(.folder, "b", in: a)
        let (c, _) = try await f.create(.folder, "c", in: b)
        let before = try await f.store.cursor(of: f.container)
        for target in [c, b, a] {
            do {
                try await f.commit(a, base: va, f.draft(.folder, "a", in: target))
                throw ConformanceFailure("moving a into \(target) must be rejected")
            } catch let e as APIError {
                try check(e.code == .moveCycle, "code move_cycle, got \(e.code)")
            }
        }
        try check(try await f.store.cursor(of: f.container) == before, "a rejected move writes nothing")
        try check(try await f.item(a).parent == .root, "a stays where it was")
        // The reverse move is fine.
        let rc = try await f.commit(c, base: try await f.item(c).version, f.draft(.folder, "c", in: .root))
        try check(rc.outcome == .applied && rc.item.parent == .root, "c moves to the root")
    }

    static func folderDeletedWhileChildChanged(_ f: StoreFixture) async throws {
        let c0 = try await f.chunk("x0"), c1 = try await f.chunk("x1")
        let (outer, _) = try await f.create(.folder, "Outer")
        let (folder, _) = try await f.create(.folder, "Project", in: outer)
        let (child, vc) = try await f.create(.file, "x.txt", in: folder, chunks: [c0])
        // B deletes the child, the folder and its parent, having seen everything.
        let seen = try await f.store.cursor(of: f.container)
        try await f.commit(child, base: vc, f.draft(.file, "x.txt", in: folder, chunks: [c0], deleted: true), by: f.b, seen: seen)
        try await f.commit(folder, base: try await f.item(folder).version, f.draft(.folder, "Project", in: outer, deleted: true), by: f.b, seen: seen)
        try await f.commit(outer, base: try await f.item(outer).version, f.draft(.folder, "Outer", deleted: true), by: f.b, seen: seen)
        let (o1, f1) = (try await f.item(outer).deleted, try await f.item(folder).deleted)
        try check(o1 && f1, "folders deleted")
        // A, offline meanwhile, edited the child.
        let r = try await f.commit(child, base: vc, f.draft(.file, "x.txt", in: folder, chunks: [c1], t: 9_000), by: f.a)
        try check(r.outcome == .applied && !r.item.deleted && r.item.chunks == [c1], "the changed child survives")
        try check(Set(r.restored) == [folder, outer], "its folders are restored, got \(r.restored)")
        let (o2, f2) = (try await f.item(outer).deleted, try await f.item(folder).deleted)
        try check(!o2 && !f2, "folders alive again")
    }

    static func folderDeleteSparesUnseenChildren(_ f: StoreFixture) async throws {
        let (folder, _) = try await f.create(.folder, "Shared")
        let (old, _) = try await f.create(.file, "old.txt", in: folder)
        let (sub, _) = try await f.create(.folder, "sub", in: folder)
        let seen = try await f.store.cursor(of: f.container)
        // A adds a file after B's view; B deletes the whole folder in one commit.
        let (fresh, _) = try await f.create(.file, "fresh.txt", in: sub, by: f.a)
        let r = try await f.commit(folder, base: try await f.item(folder).version, f.draft(.folder, "Shared", deleted: true), by: f.b, seen: seen)
        try check(r.outcome == .deleteIgnored && !r.item.deleted, "the folder survives because of an unseen child, got \(r.outcome)")
        try check(try await f.item(old).deleted, "a seen child is deleted")
        let (fr, sb) = (try await f.item(fresh).deleted, try await f.item(sub).deleted)
        try check(!fr && !sb, "the unseen child and its folder survive")
        // Seen everything: the whole tree goes.
        let all = try await f.store.cursor(of: f.container)
        let r2 = try await f.commit(folder, base: try await f.item(folder).version, f.draft(.folder, "Shared", deleted: true), by: f.b, seen: all)
        try check(r2.outcome == .applied && r2.item.deleted, "folder deleted")
        let (fr2, sb2) = (try await f.item(fresh).deleted, try await f.item(sub).deleted)
        try check(fr2 && sb2, "descendants deleted with it")
    }

    static func renameAndEdit(_ f: StoreFixture) async throws {
        let c0 = try await f.chunk("r0"), c1 = try await f.chunk("r1")
        let (dest, _) = try await f.create(.folder, "Archive")
        let (file, v1) = try await f.create(.file, "draft.txt", chunks: [c0])
        try await f.commit(file, base: v1, f.draft(.file, "final.txt", in: dest, chunks: [c0]), by: f.a)
        let r = try await f.commit(file, base: v1, f.draft(.file, "draft.txt", chunks: [c1], t: 5_000), by: f.b)
        try check(r.outcome == .applied, "no conflict, got \(r.outcome)")
        try check(r.item.name.value == "final.txt" && r.item.parent == dest && r.item.chunks == [c1], "the edit follows the renamed item, got \(r.item)")
    }

    /// A device that lost the record of its own commits (its store could not save, or the answer
    /// was lost) sends its item again with no base: what it had before its own later rename must
    /// not move the item back, nor become a conflict. Another device's base-less commit of the
    /// item is still decided against an unknown base.
    static func baselessCommit(_ f: StoreFixture) async throws {
        let c0 = try await f.chunk("bl0"), c1 = try await f.chunk("bl1")
        let (file, v1) = try await f.create(.file, "c.txt", chunks: [c0], by: f.a)
        try await f.commit(file, base: v1, f.draft(.file, "a.txt", chunks: [c0]), by: f.a)
        var r = try await f.commit(file, base: nil, f.draft(.file, "c.txt", chunks: [c0]), by: f.a)
        try check(r.outcome == .unchanged && r.item.name.value == "a.txt", "an old copy moved the item back: \(r.outcome) \(r.item.name.value)")
        // Changed since its first state (an edit made before the answer came): that applies.
        r = try await f.commit(file, base: nil, f.draft(.file, "c.txt", chunks: [c1], t: 3_000), by: f.a)
        try check(r.outcome == .applied && r.item.name.value == "a.txt" && r.item.chunks == [c1] && r.item.conflicts == 0,
                  "the edit applies where the item is, got \(r.outcome) \(r.item)")
        // Another device never made it: unknown base, its place applies.
        r = try await f.commit(file, base: nil, f.draft(.file, "b.txt", chunks: [c1], t: 3_000), by: f.b)
        try check(r.item.name.value == "b.txt", "another device's base-less commit: its place, got \(r.item.name.value)")
        // Its create was given the name beside a taken one (`b 2.txt`), which it never heard of;
        // another device moved it into a folder. Sent again as it was, it stays there.
        let (folder, _) = try await f.create(.folder, "inbox", by: f.b)
        let other = ItemID(UUID())
        let made = try await f.commit(other, base: nil, f.draft(.file, "b.txt", chunks: [c0]), by: f.a)
        try check(made.item.name.value == "b 2.txt", "the server's name for a taken one, got \(made.item.name.value)")
        try await f.commit(other, base: made.item.version, f.draft(.file, "kept.txt", in: folder, chunks: [c0]), by: f.b)
        r = try await f.commit(other, base: nil, f.draft(.file, "b.txt", chunks: [c0]), by: f.a)
        try check(r.item.parent == folder && r.item.name.value == "kept.txt", "the old copy moved it back: \(r.item.parent) \(r.item.name.value)")
    }

    /// `d` with these user attributes in its `extra` (and another field when `other`).
    private static func with(_ d: ItemDraft, _ xattrs: [String: String], other: Bool = false) -> ItemDraft {
        var d = d
        var fields: [String: JSONValue] = ["xattrs": .object(xattrs.mapValues { .string(Data($0.utf8).base64EncodedString()) })]
        if other { fields["note"] = .string("kept") }
        d.extra = .object(fields)
        return d
    }

    /// The user attributes of an answer's item.
    private static func names(_ r: CommitResponse) -> [String: String] {
        guard case .object(let o)? = r.item.extra, case .object(let x)? = o["xattrs"] else { return [:] }
        return x.compactMapValues { if case .string(let b) = $0 { Data(base64Encoded: b).map { String(decoding: $0, as: UTF8.self) } } else { nil } }
    }

    /// A commit whose base is older than states its own device made since (their answers were
    /// lost) is decided on the last of them: what it undid since is undone (an attribute set and
    /// removed again), an edit is no conflict with its own, a delete is a delete; what another
    /// device changed after those states stays. Another device on the same old base is still
    /// decided against that base.
    static func lostAnswers(_ f: StoreFixture) async throws {
        let c0 = try await f.chunk("la0"), c1 = try await f.chunk("la1"), c2 = try await f.chunk("la2"), c3 = try await f.chunk("la3")
        let (file, v1) = try await f.create(.file, "l.txt", chunks: [c0], by: f.a)
        // A sets user.a (the answer is lost), then removes it and sends on v1 again.
        try await f.commit(file, base: v1, with(f.draft(.file, "l.txt", chunks: [c0]), ["user.a": "1"]), by: f.a)
        var r = try await f.commit(file, base: v1, f.draft(.file, "l.txt", chunks: [c0]), by: f.a)
        try check(r.outcome == .applied && names(r).isEmpty, "the attribute A removed stays removed, got \(r.outcome) \(names(r))")
        // A edits (the answer is lost) and edits again on the same base: its own, no conflict.
        let v2 = r.item.version
        try await f.commit(file, base: v2, f.draft(.file, "l.txt", chunks: [c1], t: 2_000), by: f.a)
        r = try await f.commit(file, base: v2, f.draft(.file, "l.txt", chunks: [c2], t: 3_000), by: f.a)
        try check(r.outcome == .applied && r.item.chunks == [c2] && r.item.conflicts == 0, "A's later edit, no conflict, got \(r.outcome) \(r.item)")
        // A sets user.t (lost); B, which saw it, edits the content; A removes user.t on its old base:
        // B's edit stays, user.t goes.
        let v3 = r.item.version
        let sent = try await f.commit(file, base: v3, with(f.draft(.file, "l.txt", chunks: [c2], t: 3_000), ["user.t": "1"]), by: f.a)
        r = try await f.commit(file, base: sent.item.version, with(f.draft(.file, "l.txt", chunks: [c3], t: 4_000), ["user.t": "1"]), by: f.b)
        r = try await f.commit(file, base: v3, f.draft(.file, "l.txt", chunks: [c2], t: 3_000), by: f.a)
        try check(r.item.chunks == [c3] && names(r).isEmpty && r.item.conflicts == 0, "B's edit kept, user.t removed, got \(r.outcome) \(r.item) \(names(r))")
        // B, on v3 (older than A's states), edits: decided against v3, a conflict with A's state.
        r = try await f.commit(file, base: v3, f.draft(.file, "l.txt", chunks: [c1], t: 1_500), by: f.b)
        try check(r.outcome == .conflict, "another device's old base is merged against it, got \(r.outcome)")
        // A edits (lost), then deletes on its old base: deleted.
        let v4 = r.item.version
        try await f.commit(file, base: v4, f.draft(.file, "l.txt", chunks: [c0], t: 5_000), by: f.a)
        r = try await f.commit(file, base: v4, f.draft(.file, "l.txt", chunks: [c0], t: 5_000, deleted: true), by: f.a)
        try check(r.item.deleted, "A's delete after its own edit deletes, got \(r.outcome) \(r.item)")
    }

    /// `extra` merges field by field and user attribute by attribute against the committer's base:
    /// two devices that set different attributes keep both; an attribute and a content edit both
    /// apply; an edit that brings a deleted item back keeps the attributes it did not touch.
    static func attributesMerge(_ f: StoreFixture) async throws {
        let c0 = try await f.chunk("am0"), c1 = try await f.chunk("am1")
        let (file, v1) = try await f.create(.file, "x.txt", chunks: [c0])
        var r = try await f.commit(file, base: v1, with(f.draft(.file, "x.txt", chunks: [c0]), ["user.a": "1"], other: true), by: f.a)
        let v2 = r.item.version
        // B, on v2, edits the content and sets user.b; A, on v2 too, sets user.c.
        r = try await f.commit(file, base: v2, with(f.draft(.file, "x.txt", chunks: [c1], t: 4_000), ["user.a": "1", "user.b": "2"], other: true), by: f.b)
        r = try await f.commit(file, base: v2, with(f.draft(.file, "x.txt", chunks: [c0]), ["user.a": "1", "user.c": "3"], other: true), by: f.a)
        try check(r.outcome == .applied && r.item.conflicts == 0 && r.item.chunks == [c1], "merged, no conflict, B's content: \(r.outcome) \(r.item)")
        try check(names(r) == ["user.a": "1", "user.b": "2", "user.c": "3"], "every attribute kept, got \(names(r))")
        guard case .object(let o)? = r.item.extra, o["note"] == .string("kept") else { throw ConformanceFailure("other fields kept, got \(String(describing: r.item.extra))") }
        // A removes user.a on a stale base: only user.a goes.
        r = try await f.commit(file, base: v2, with(f.draft(.file, "x.txt", chunks: [c0]), ["user.c": "3"], other: true), by: f.a)
        try check(names(r) == ["user.b": "2", "user.c": "3"], "only user.a removed, got \(names(r))")
        // Deleted, then edited on an old base: it comes back with the attributes it had.
        let live = r.item.version
        // (A device's delete sends the state it had, `extra` and all.)
        try await f.commit(file, base: live, with(f.draft(.file, "x.txt", chunks: [c1], deleted: true), ["user.b": "2", "user.c": "3"], other: true), by: f.a)
        r = try await f.commit(file, base: live, with(f.draft(.file, "x.txt", chunks: [c0], t: 9_000), ["user.b": "2", "user.c": "3"], other: true), by: f.b)
        try check(!r.item.deleted && names(r) == ["user.b": "2", "user.c": "3"], "revived with its attributes, got \(r.item.deleted) \(names(r))")
    }

    static func resolveAndRestore(_ f: StoreFixture) async throws {
        let c0 = try await f.chunk("s0"), ca = try await f.chunk("sa"), cb = try await f.chunk("sb"), cc = try await f.chunk("sc")
        let (file, v1) = try await f.create(.file, "s.txt", chunks: [c0])
        try await f.commit(file, base: v1, f.draft(.file, "s.txt", chunks: [ca], t: 2_000), by: f.a)
        try await f.commit(file, base: v1, f.draft(.file, "s.txt", chunks: [cb], t: 1_000), by: f.b)
        try await f.commit(file, base: v1, f.draft(.file, "s.txt", chunks: [cc], t: 1_500), by: f.b)
        var item = try await f.item(file)
        try check(item.conflicts == 2 && item.chunks == [ca], "two conflicts, A current")
        let conflicts = try await f.store.versions(of: file, in: f.container).filter { $0.role == .conflict }
        let vb = conflicts.first { $0.state.chunks == [cb] }!.version
        let vc = conflicts.first { $0.state.chunks == [cc] }!.version
        // Discard one.
        var r = try await f.store.resolve(ResolveRequest(action: .discard, versions: [vc]), item: file, in: f.container, by: f.a, now: 10_000)
        try check(r.item.conflicts == 1 && r.item.chunks == [ca], "one conflict left")
        // Discarding something that is not a conflict is refused.
        do {
            _ = try await f.store.resolve(ResolveRequest(action: .discard, versions: [vc]), item: file, in: f.container, by: f.a, now: 10_000)
            throw ConformanceFailure("discarding a discarded version must fail")
        } catch let e as APIError { try check(e.code == .notAConflict, "not_a_conflict, got \(e.code)") }
        // Keep the conflict version: it becomes current, no conflicts remain.
        r = try await f.store.resolve(ResolveRequest(action: .keepVersion, version: vb), item: file, in: f.container, by: f.b, now: 10_000)
        item = try await f.item(file)
        try check(item.chunks == [cb] && item.conflicts == 0 && r.outcome == .applied, "kept version current, no conflicts, got \(item)")
        try check(try await f.allChanges().last?.item.conflicts == 0, "journal shows the resolution")
        // Restore the very first version from history.
        let first = try await f.store.versions(of: file, in: f.container).first { $0.state.chunks == [c0] }!.version
        r = try await f.store.resolve(ResolveRequest(action: .restore, version: first), item: file, in: f.container, by: f.a, now: 20_000)
        try check(r.item.chunks == [c0] && r.item.name.value == "s.txt", "old version restored")
        // keep_current with no conflicts changes nothing.
        r = try await f.store.resolve(ResolveRequest(action: .keepCurrent), item: file, in: f.container, by: f.a, now: 20_000)
        try check(r.outcome == .unchanged, "nothing to resolve")
    }

    static func missingChunks(_ f: StoreFixture) async throws {
        let known = try await f.chunk("known")
        let unknown = ChunkRef(hash: ContentHash(hex: String(repeating: "e", count: 64))!, size: 10)
        do {
            _ = try await f.create(.file, "m.bin", chunks: [known, unknown])
            throw ConformanceFailure("a commit with an unknown chunk must fail")
        } catch let e as APIError {
            try check(e.code == .missingChunks && e.missing == [unknown.hash], "missing_chunks names the chunk, got \(e)")
        }
        do {
            _ = try await f.create(.file, "m.bin", chunks: [ChunkRef(hash: known.hash, size: 99)])
            throw ConformanceFailure("a wrong chunk size must fail")
        } catch let e as APIError { try check(e.code == .chunkSizeMismatch, "chunk_size_mismatch, got \(e.code)") }
        try check(try await f.store.cursor(of: f.container) == 0, "nothing committed")
    }

    static func accountsAreIsolated(_ f: StoreFixture) async throws {
        let bob = try await f.store.addDevice(account: "bob", deviceName: "phone", tokenHash: TokenHash.of(UUID().uuidString))
        try check(bob.accountID != f.a.accountID, "a new account")
        try check(try await f.store.container(account: bob.accountID, name: f.container.name, create: false) == nil,
                  "bob does not see alice's container")
        let chunk = try await f.chunk("alice-secret")
        try check(try await f.store.ownedChunks(account: bob.accountID, hashes: [chunk.hash]).isEmpty, "bob does not own alice's chunks")
        let bobs = try await f.store.container(account: bob.accountID, name: f.container.name, create: true)
        try check(bobs != nil && bobs?.id != f.container.id, "bob's container of the same name is his own")
    }

    static func retries(_ f: StoreFixture) async throws {
        let c1 = try await f.chunk("retry")
        let id = ItemID(UUID())
        let d = f.draft(.file, "r.txt", chunks: [c1])
        let first = try await f.commit(id, base: nil, d)
        let again = try await f.commit(id, base: nil, d)
        try check(again.outcome == .unchanged && again.item.version == first.item.version, "a repeated create changes nothing")
        let c2 = try await f.chunk("retry2")
        let up = f.draft(.file, "r.txt", chunks: [c2], t: 2_000)
        let u1 = try await f.commit(id, base: first.item.version, up)
        let u2 = try await f.commit(id, base: first.item.version, up)
        try check(u2.outcome == .unchanged && u2.item.version == u1.item.version, "a repeated update changes nothing")
    }
}

extension StoreConformance {
    static func revokedDevices(_ f: StoreFixture) async throws {
        let tokenA = UUID().uuidString, tokenB = UUID().uuidString, tokenC = UUID().uuidString
        let laptop = try await f.store.addDevice(account: "carol", deviceName: "laptop", tokenHash: TokenHash.of(tokenA))
        _ = try await f.store.addDevice(account: "carol", deviceName: "phone", tokenHash: TokenHash.of(tokenB))
        _ = try await f.store.addDevice(account: "carol", deviceName: "phone", tokenHash: TokenHash.of(tokenC))
        let listed = try await f.store.devices(account: "carol")
        try check(listed.map(\.name) == ["laptop", "phone", "phone"] && listed.allSatisfy { $0.revoked == nil && $0.account == "carol" },
                  "carol's devices are listed: \(listed)")
        try check(try await f.store.devices(account: nil).count >= 3 + 2, "all accounts' devices are listed")
        let markBefore = try await f.store.revocationMark()
        let revoked = try await f.store.revokeDevice(account: "carol", device: "laptop", now: 1_000)
        try check(revoked.id == laptop.id && revoked.revoked == 1_000, "the laptop is revoked")
        let markAfter = try await f.store.revocationMark()
        try check(markAfter != markBefore, "a revocation moves the revocation mark: \(markBefore) then \(markAfter)")
        try check(try await f.store.device(tokenHash: TokenHash.of(tokenA)) == nil, "a revoked token finds no device")
        try check(try await f.store.device(tokenHash: TokenHash.of(tokenB)) != nil, "the other devices still work")
        let again = try await f.store.revokeDevice(account: "carol", device: laptop.id.description, now: 2_000)
        try check(again.revoked == 1_000, "revoking again keeps the first time")
        try check(try await f.store.revocationMark() == markAfter, "nothing newly revoked: the mark stays")
        do {
            _ = try await f.store.revokeDevice(account: "carol", device: "phone", now: 3_000)
            throw ConformanceFailure("a name shared by two devices must be refused")
        } catch let e as APIError { try check(e.code == .badRequest, "shared name: \(e)") }
        do {
            _ = try await f.store.revokeDevice(account: "bob", device: "laptop", now: 3_000)
            throw ConformanceFailure("another account's device must not be found")
        } catch let e as APIError { try check(e.code == .deviceNotFound, "other account: \(e)") }
        try check(try await f.store.devices(account: "carol").filter { $0.revoked != nil }.map(\.id) == [laptop.id], "only the laptop is revoked")
    }
}

extension StoreConformance {
    /// A pairing code makes one device in the code's account, once, before it expires; ten
    /// redeems of one code at once make exactly one device.
    static func pairingCodes(_ f: StoreFixture) async throws {
        let dana = try await f.store.addDevice(account: "dana", deviceName: "desktop", tokenHash: TokenHash.of(UUID().uuidString))
        let code = TokenHash.of("CODE-\(UUID().uuidString)")
        try await f.store.addPairing(account: dana.accountID, codeHash: code, deviceName: "laptop", createdBy: dana.id, expires: 10_000)
        try check(try await f.store.redeemPairing(codeHash: code, deviceName: nil, tokenHash: TokenHash.of("late"), now: 10_001) == nil,
                  "an expired code makes no device")
        try check(try await f.store.redeemPairing(codeHash: TokenHash.of("never issued"), deviceName: nil, tokenHash: TokenHash.of("x"), now: 5_000) == nil,
                  "an unknown code makes no device")
        let token = UUID().uuidString
        let made = try await f.store.redeemPairing(codeHash: code, deviceName: nil, tokenHash: TokenHash.of(token), now: 10_000)
        try check(made?.name == "laptop" && made?.accountName == "dana" && made?.accountID == dana.accountID, "the code's device: \(String(describing: made))")
        try check(try await f.store.device(tokenHash: TokenHash.of(token))?.id == made?.id, "its token works")
        try check(try await f.store.redeemPairing(codeHash: code, deviceName: "again", tokenHash: TokenHash.of("again"), now: 9_000) == nil,
                  "a used code makes no second device")

        let shared = TokenHash.of("CODE-\(UUID().uuidString)")
        try await f.store.addPairing(account: dana.accountID, codeHash: shared, deviceName: "phone", createdBy: dana.id, expires: 20_000)
        let winners = try await withThrowingTaskGroup(of: DeviceRecord?.self) { group in
            for i in 0..<10 {
                group.addTask { try await f.store.redeemPairing(codeHash: shared, deviceName: "phone-\(i)", tokenHash: TokenHash.of("race-\(i)"), now: 15_000) }
            }
            return try await group.reduce(into: [DeviceRecord]()) { if let d = $1 { $0.append(d) } }
        }
        try check(winners.count == 1, "one code, ten redeems at once: \(winners.count) devices")
        let names = try await f.store.devices(account: "dana").map(\.name)
        try check(names.filter { $0.hasPrefix("phone") }.count == 1 && names.contains("laptop") && names.contains("desktop"), "dana's devices: \(names)")
        // Another account's code never adds to dana.
        let erin = try await f.store.addDevice(account: "erin", deviceName: "pc", tokenHash: TokenHash.of(UUID().uuidString))
        let erinCode = TokenHash.of("CODE-\(UUID().uuidString)")
        try await f.store.addPairing(account: erin.accountID, codeHash: erinCode, deviceName: "tablet", createdBy: erin.id, expires: 20_000)
        let tablet = try await f.store.redeemPairing(codeHash: erinCode, deviceName: nil, tokenHash: TokenHash.of("tablet"), now: 1)
        try check(tablet?.accountName == "erin", "erin's code makes erin's device")
    }
}

public struct ConformanceFailure: Error, CustomStringConvertible {
    public let description: String
    public init(_ d: String) { description = d }
}

@inline(__always)
func check(_ condition: Bool, _ message: @autoclosure () -> String) throws {
    if !condition { throw ConformanceFailure(message()) }
}
