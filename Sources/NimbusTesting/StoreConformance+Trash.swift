import Foundation
import NimbusCore
import NimbusProtocol
import NimbusServer

// Recently Deleted on every engine (docs/trash.md). Times are server times in ns; the fixture's
// commits default to 5_000.

extension StoreConformance {
    static let minute: Int64 = 60 * 1_000_000_000

    /// A tree removed the way `rm -r` removes it (each file, then each folder, each its own
    /// commit) is one entry with everything in it; a file deleted long before stays its own
    /// entry; restore brings the tree back with its ids, history and conflict versions, under
    /// `NAME 2` when the name was taken; purge frees it.
    static func trashEntryRestoreAndPurge(_ f: StoreFixture) async throws {
        let c1 = try await f.chunk("t1", size: 10), c2 = try await f.chunk("t2", size: 20), c3 = try await f.chunk("t3", size: 30)
        let (dir, _) = try await f.create(.folder, "dir")
        let (sub, _) = try await f.create(.folder, "sub", in: dir)
        let (a, va) = try await f.create(.file, "a.txt", in: dir, chunks: [c1])
        let (b, _) = try await f.create(.file, "b.txt", in: sub, chunks: [c2])
        let (old, vold) = try await f.create(.file, "old.txt", in: dir, chunks: [c3])
        // a.txt gets a second version and an unresolved conflict version.
        _ = try await f.commit(a, base: va, f.draft(.file, "a.txt", in: dir, chunks: [c2], t: 2_000), by: f.a)
        _ = try await f.commit(a, base: va, f.draft(.file, "a.txt", in: dir, chunks: [c3], t: 3_000), by: f.b)
        try check(try await f.item(a).conflicts == 1, "a.txt has a conflict version")
        // old.txt is deleted an hour before the rest.
        let t0: Int64 = 100 * minute
        try await f.commit(old, base: vold, f.draft(.file, "old.txt", in: dir, chunks: [c3], deleted: true), by: f.b, now: t0)
        // rm -r dir on B, a second later: files, then sub, then dir.
        let t1 = t0 + 60 * minute
        var seen = try await f.store.cursor(of: f.container)
        for (id, d) in [(a, f.draft(.file, "a.txt", in: dir, chunks: [c2], deleted: true)),
                        (b, f.draft(.file, "b.txt", in: sub, chunks: [c2], deleted: true)),
                        (sub, f.draft(.folder, "sub", in: dir, deleted: true)),
                        (dir, f.draft(.folder, "dir", deleted: true))] {
            let r = try await f.commit(id, base: try await f.item(id).version, d, by: f.b, seen: seen, now: t1)
            try check(r.outcome == .applied && r.item.deleted, "deleted \(d.name), got \(r.outcome)")
            seen = r.cursor
        }
        var listed = try await f.store.trash(in: f.container, after: nil, limit: 10)
        try check(listed.map(\.row.item.id) == [dir, old], "two entries, newest first: dir then old.txt, got \(listed.map(\.path))")
        try check(listed[0].row.items == 4 && listed[0].row.bytes == 40 && listed[0].path == "/dir", "dir holds 4 items, 40 bytes, got \(listed[0].row)")
        try check(listed[0].row.deletedAt == t1 && listed[0].row.deletedBy == f.b.id, "when and by whom, got \(listed[0].row)")
        try check(listed[1].path == "/dir/old.txt" && listed[1].row.items == 1 && listed[1].row.bytes == 30, "old.txt on its own, got \(listed[1])")
        let totals = try await f.store.trashTotals(in: f.container)
        try check(totals == TrashTotals(entries: 2, items: 5, bytes: 70), "totals: 2 entries of 5 items, 70 bytes, got \(totals)")
        guard let entry = try await f.store.trashEntry(dir, in: f.container) else { throw ConformanceFailure("dir is an entry") }
        try check(Set(entry.items?.map(\.id) ?? []) == [dir, sub, a, b], "the entry's items, got \(entry.items?.map(\.state.location.name) ?? [])")
        try check(try await f.store.trashEntry(a, in: f.container) == nil, "a.txt went with dir: not an entry of its own")

        // Paging.
        let first = try await f.store.trash(in: f.container, after: nil, limit: 1)
        let rest = try await f.store.trash(in: f.container, after: TrashCursor(deletedAt: first[0].row.deletedAt, id: first[0].row.item.id), limit: 10)
        try check(first.map(\.row.item.id) == [dir] && rest.map(\.row.item.id) == [old], "pages, got \(first.map(\.path)) \(rest.map(\.path))")

        // A new dir takes the name; the restore goes to "dir 2" with the same ids.
        let (newDir, _) = try await f.create(.folder, "dir", by: f.a)
        let r = try await f.store.restoreTrash(dir, to: nil, in: f.container, by: f.a, now: t1 + minute)
        try check(r.item.id == dir && r.item.name.value == "dir 2" && r.renamed && r.restored == 4, "restored as dir 2, got \(r)")
        for id in [dir, sub, a, b] { try check(!(try await f.item(id).deleted), "\(id) is back") }
        let (pa, pb) = (try await f.item(a).parent, try await f.item(b).parent)
        try check(pa == dir && pb == sub, "the tree is as it was")
        try check(try await f.item(a).conflicts == 1, "a.txt keeps its conflict version")
        let versions = try await f.versions(a)
        try check(versions.contains { $0.role == .conflict } && versions.filter { $0.role == .previous }.count >= 2, "a.txt keeps its history, got \(versions.map(\.role))")
        try check(try await f.item(newDir).name.value == "dir", "the new dir keeps its name")
        try check(try await f.allChanges().suffix(4).allSatisfy { $0.kind == .restore }, "every restored item is a journal restore")
        listed = try await f.store.trash(in: f.container, after: nil, limit: 10)
        try check(listed.map(\.row.item.id) == [old], "only old.txt is left, got \(listed.map(\.path))")
        let left = try await f.store.trashTotals(in: f.container)
        try check(left == TrashTotals(entries: 1, items: 1, bytes: 30), "totals after the restore, got \(left)")

        // Not an entry: a live item, an unknown one.
        for id in [dir, ItemID(UUID())] {
            do {
                _ = try await f.store.restoreTrash(id, to: nil, in: f.container, by: f.a, now: t1 + 2 * minute)
                throw ConformanceFailure("restoring \(id) must fail")
            } catch let e as APIError { try check(e.code == .notInTrash, "not_in_trash, got \(e.code)") }
        }

        // old.txt into another folder; its old folder stays as it is.
        let (archive, _) = try await f.create(.folder, "archive")
        let r2 = try await f.store.restoreTrash(old, to: archive, in: f.container, by: f.a, now: t1 + 3 * minute)
        try check(r2.item.parent == archive && r2.item.name.value == "old.txt" && !r2.item.deleted, "old.txt in archive, got \(r2.item)")

        // Delete again and purge: the items and their versions go.
        let t2 = t1 + 10 * minute
        seen = try await f.store.cursor(of: f.container)
        let rd = try await f.commit(dir, base: try await f.item(dir).version, f.draft(.folder, "dir 2", deleted: true), by: f.a, seen: seen, now: t2)
        try check(rd.item.deleted, "dir 2 deleted with everything in it")
        listed = try await f.store.trash(in: f.container, after: nil, limit: 10)
        try check(listed.count == 1 && listed[0].row.items == 4, "one entry of 4 items (the server deleted what the folder held), got \(listed.map(\.row))")
        let p = try await f.store.purgeTrash([dir, archive], in: f.container)
        try check(p.entries == 1 && p.items == 4 && p.bytes == 40, "purged one entry (archive is live: skipped), got \(p)")
        for id in [dir, sub, a, b] { try check(try await f.store.item(id, in: f.container) == nil, "\(id) is gone") }
        try check(try await f.versions(a).isEmpty, "a.txt's versions are gone")
        try check(try await f.store.trash(in: f.container, after: nil, limit: 10).isEmpty, "nothing left")
    }

    /// An edit made elsewhere wins over a delete: the item leaves its entry and the rest of the
    /// entry stays restorable; expiry purges by age only, on every container.
    static func trashRegroupsAndExpires(_ f: StoreFixture) async throws {
        let c1 = try await f.chunk("e1", size: 5), c2 = try await f.chunk("e2", size: 7)
        let (dir, _) = try await f.create(.folder, "dir")
        let (x, vx) = try await f.create(.file, "x.txt", in: dir, chunks: [c1])
        let (y, _) = try await f.create(.file, "y.txt", in: dir, chunks: [c1])
        let seen = try await f.store.cursor(of: f.container)
        let t1: Int64 = 1_000 * minute
        // B deletes the folder in one commit (the server deletes what B had seen).
        let rd = try await f.commit(dir, base: try await f.item(dir).version, f.draft(.folder, "dir", deleted: true), by: f.b, seen: seen, now: t1)
        try check(rd.item.deleted, "dir deleted")
        try check(try await f.store.trash(in: f.container, after: nil, limit: 10).map(\.row.items) == [3], "one entry of 3")
        // A, offline, had edited x.txt: the edit wins, x.txt and dir come back; y.txt stays deleted.
        let r = try await f.commit(x, base: vx, f.draft(.file, "x.txt", in: dir, chunks: [c2], t: 9_000), by: f.a, now: t1 + minute)
        try check(!r.item.deleted && r.restored == [dir], "x.txt and dir come back, got \(r)")
        let listed = try await f.store.trash(in: f.container, after: nil, limit: 10)
        try check(listed.map(\.row.item.id) == [y] && listed[0].path == "/dir/y.txt", "y.txt is an entry of its own now, got \(listed.map(\.path))")
        // Expiry: nothing younger than the cutoff goes.
        var e = try await f.store.expireTrash(deletedBefore: t1)
        try check(e.entries == 0, "nothing older than t1, got \(e)")
        e = try await f.store.expireTrash(deletedBefore: t1 + 1)
        try check(e.entries == 1 && e.items == 1 && e.bytes == 5, "y.txt expired, got \(e)")
        try check(try await f.store.item(y, in: f.container) == nil, "y.txt purged")
        // Oldest first to make room: two entries, the older one goes for 1 byte; its chunks come back.
        let (p1, vp1) = try await f.create(.file, "p1.txt", chunks: [c1])
        let (p2, vp2) = try await f.create(.file, "p2.txt", chunks: [c2])
        try await f.commit(p2, base: vp2, f.draft(.file, "p2.txt", chunks: [c2], deleted: true), by: f.a, now: t1 + 3 * minute)
        try await f.commit(p1, base: vp1, f.draft(.file, "p1.txt", chunks: [c1], deleted: true), by: f.a, now: t1 + 4 * minute)
        let room = try await f.store.purgeOldestTrash(account: f.a.accountID, bytes: 1)
        try check(room.response.entries == 1 && room.response.bytes == 7 && room.chunks == [c2.hash], "p2.txt (older) purged with its chunk, got \(room)")
        try check(try await f.store.trash(in: f.container, after: nil, limit: 10).map(\.row.item.id) == [p1], "p1.txt stays")
        let more = try await f.store.purgeOldestTrash(account: f.a.accountID, bytes: 1_000)
        try check(more.response.entries == 1 && more.chunks == [c1.hash], "then p1.txt, got \(more)")
        let none = try await f.store.purgeOldestTrash(account: f.a.accountID, bytes: 1)
        try check(none.response.entries == 0 && none.chunks.isEmpty, "nothing left, got \(none)")
        // A purge of everything.
        let (z, vz) = try await f.create(.file, "z.txt", chunks: [c2])
        try await f.commit(z, base: vz, f.draft(.file, "z.txt", chunks: [c2], deleted: true), by: f.a, now: t1 + 2 * minute)
        let all = try await f.store.purgeTrash(nil, in: f.container)
        try check(all.entries == 1 && all.bytes == 7, "purge all, got \(all)")
        try check(try await f.store.item(z, in: f.container) == nil, "z.txt purged")
    }
}
