import Foundation
import NimbusCore
import NimbusProtocol
import NimbusServer

/// History retention (`HistoryRetention`, docs/deploy.md): each case runs on a store opened with
/// the case's `retention`; time is the `now` passed with each commit, so "old" needs no sleeping.
extension StoreConformance {
    static let day: Int64 = 86_400 * 1_000_000_000

    /// A pruned version is gone for good: restore and keep_version answer `version_not_found`.
    static func expectVersionNotFound(_ f: StoreFixture, _ id: ItemID, _ request: ResolveRequest) async throws {
        do {
            _ = try await f.resolve(id, request)
            throw ConformanceFailure("\(request.action.rawValue) of pruned version \(request.version ?? 0) must fail")
        } catch let e as APIError {
            try check(e.code == .versionNotFound, "version_not_found for a pruned version, got \(e.code): \(e.message)")
        }
    }

    /// keep-versions 2, keep-days 0: five commits leave the current version and the two newest
    /// earlier ones, whatever their age.
    static func historyKeepsLastVersions(_ f: StoreFixture) async throws {
        var chunks: [ChunkRef] = []
        for i in 0..<5 { chunks.append(try await f.chunk("h\(i)")) }
        let (file, v1) = try await f.create(.file, "h.txt", chunks: [chunks[0]])
        var version = v1
        for i in 1..<5 {
            version = try await f.commit(file, base: version, f.draft(.file, "h.txt", chunks: [chunks[i]], t: 1_000 + Int64(i))).item.version
        }
        var versions = try await f.versions(file)
        try check(versions.map(\.version) == [5, 4, 3], "current + the last 2 earlier versions, got \(versions.map(\.version))")
        try check(versions.map(\.role) == [.current, .previous, .previous], "roles, got \(versions.map(\.role))")
        try check(versions.map(\.state.chunks) == [[chunks[4]], [chunks[3]], [chunks[2]]], "each keeps its own content")
        try await expectVersionNotFound(f, file, ResolveRequest(action: .restore, version: 1))
        try await expectVersionNotFound(f, file, ResolveRequest(action: .keepVersion, version: 2))
        // A kept version restores; the version it replaces becomes history and the oldest goes.
        let r = try await f.resolve(file, ResolveRequest(action: .restore, version: 3))
        try check(r.outcome == .applied && r.item.chunks == [chunks[2]], "restored version 3, got \(r)")
        versions = try await f.versions(file)
        try check(versions.map(\.version) == [r.item.version, 5, 4], "still current + 2 earlier, got \(versions.map(\.version))")
        // A device whose base was pruned commits against an unknown base: a different content is
        // a conflict (nothing is overwritten on a guess).
        let stale = try await f.commit(file, base: 2, f.draft(.file, "h.txt", chunks: [chunks[1], chunks[0]], t: 9_000), by: f.b)
        try check(stale.outcome == .conflict, "a commit on a pruned base with other content is a conflict, got \(stale.outcome)")
        try check(try await f.item(file).conflicts == 1, "the conflict version is kept")
    }

    /// keep-versions 2, keep-days 30: nothing younger than 30 days is pruned however many versions
    /// there are; once older, only the last 2 stay. The age counts from when a version stopped
    /// being current; exactly 30 days old is old.
    static func historyKeepsRecentVersions(_ f: StoreFixture) async throws {
        var chunks: [ChunkRef] = []
        for i in 0..<7 { chunks.append(try await f.chunk("d\(i)")) }
        let id = ItemID(UUID())
        var version = try await f.commit(id, base: nil, f.draft(.file, "d.txt", chunks: [chunks[0]]), now: 0).item.version
        for i in 1...5 {
            // Version i is replaced on day i.
            version = try await f.commit(id, base: version, f.draft(.file, "d.txt", chunks: [chunks[i]], t: Int64(i)), now: Int64(i) * day).item.version
        }
        var versions = try await f.versions(id)
        try check(versions.map(\.version) == [6, 5, 4, 3, 2, 1], "all younger than 30 days are kept, got \(versions.map(\.version))")
        // Day 33: versions 1…3 (replaced on days 1…3) are at least 30 days old and beyond the
        // last 2; version 4 (replaced on day 4) is beyond the last 2 but younger: it stays.
        version = try await f.commit(id, base: version, f.draft(.file, "d.txt", chunks: [chunks[6]], t: 6), now: 33 * day).item.version
        versions = try await f.versions(id)
        try check(versions.map(\.version) == [7, 6, 5, 4], "versions 1…3 pruned, 4 kept by age, 5 and 6 by count, got \(versions.map(\.version))")
        try await expectVersionNotFound(f, id, ResolveRequest(action: .restore, version: 3))
        // A resolve prunes too (restore at day 40): version 4 is old now.
        let r = try await f.resolve(id, ResolveRequest(action: .restore, version: 5), now: 40 * day)
        try check(r.item.chunks == [chunks[4]], "version 5 restored")
        versions = try await f.versions(id)
        try check(versions.map(\.version) == [r.item.version, 7, 6], "current + the last 2, got \(versions.map(\.version))")
    }

    /// keep-versions 0, keep-days 0 keeps no earlier version, but unresolved conflict versions
    /// stay however old, on both sides of a conflict (ours kept as the conflict, or theirs).
    static func historyNeverPrunesConflicts(_ f: StoreFixture) async throws {
        let c0 = try await f.chunk("k0"), ca = try await f.chunk("ka"), cb = try await f.chunk("kb"), cc = try await f.chunk("kc")
        let (file, v1) = try await f.create(.file, "k.txt", chunks: [c0])
        try await f.commit(file, base: v1, f.draft(.file, "k.txt", chunks: [ca], t: 2_000), by: f.a)
        // B on the old base: earlier mtime, so B's edit becomes a conflict version.
        let lost = try await f.commit(file, base: v1, f.draft(.file, "k.txt", chunks: [cb], t: 1_500), by: f.b)
        // Another stale edit with a later mtime: it becomes current, A's edit a conflict version.
        let won = try await f.commit(file, base: v1, f.draft(.file, "k.txt", chunks: [cc], t: 3_000), by: f.b)
        try check(lost.yours == "conflict" && won.yours == "current", "one conflict of each kind, got \(lost.yours ?? "-"), \(won.yours ?? "-")")
        // Ten years of edits later.
        var version = won.item.version
        for i in 1...3 {
            let c = try await f.chunk("k-late\(i)")
            version = try await f.commit(file, base: version, f.draft(.file, "k.txt", chunks: [c], t: 10_000 + Int64(i)), now: 3_650 * day + Int64(i)).item.version
        }
        var versions = try await f.versions(file)
        try check(versions.map(\.role) == [.current, .conflict, .conflict], "no earlier versions, both conflicts kept, got \(versions.map(\.role))")
        try check(Set(versions.filter { $0.role == .conflict }.map(\.state.chunks)) == [[cb], [ca]], "the conflict versions keep their content")
        try check(try await f.item(file).conflicts == 2, "two unresolved conflicts")
        // Resolved away, they are discarded versions: pruned at once under keep 0/0.
        let conflictVersions = versions.filter { $0.role == .conflict }.map(\.version)
        _ = try await f.resolve(file, ResolveRequest(action: .keepCurrent), now: 3_650 * day + 10)
        versions = try await f.versions(file)
        try check(versions.map(\.version) == [version], "only the current version is left, got \(versions.map(\.version))")
        try await expectVersionNotFound(f, file, ResolveRequest(action: .keepVersion, version: conflictVersions[0]))
    }

    /// A base version whose row was pruned while an older one was kept must not be mistaken for
    /// that older one: the commit is decided on an unknown base (a conflict here), never as an
    /// edit of the older state (which would silently replace the current content).
    static func historyPrunedBaseIsUnknown(_ f: StoreFixture) async throws {
        let c0 = try await f.chunk("u0"), ca = try await f.chunk("ua"), cb = try await f.chunk("ub")
        let (file, v1) = try await f.create(.file, "u.txt", chunks: [c0])
        let v2 = try await f.commit(file, base: v1, f.draft(.file, "u.txt", chunks: [ca], t: 2_000), by: f.a).item.version
        // B, on v1, wins a conflict: A's v2 (once current) becomes a conflict version.
        let r3 = try await f.commit(file, base: v1, f.draft(.file, "u.txt", chunks: [cb], t: 3_000), by: f.b)
        try check(r3.outcome == .conflict && r3.yours == "current", "B's later edit wins, got \(r3)")
        // B goes back to the first content, then discards A's version: v2 is pruned (discarded,
        // keep-days 0), v1 is kept (among the last 5 previous versions).
        try await f.commit(file, base: r3.item.version, f.draft(.file, "u.txt", chunks: [c0], t: 4_000), by: f.b)
        _ = try await f.resolve(file, ResolveRequest(action: .keepCurrent), by: f.b)
        let kept = try await f.versions(file).map(\.version)
        try check(kept.contains(v1) && !kept.contains(v2), "v1 kept, v2 pruned, got \(kept)")
        // A still has v2 as its base and renames the file. Taking v1 for its base would make A's
        // content look like A's own edit and replace B's; the base is unknown instead.
        let r = try await f.commit(file, base: v2, f.draft(.file, "renamed.txt", chunks: [ca], t: 2_500), by: f.a)
        try check(r.outcome == .conflict, "an unknown base with other content is a conflict, got \(r.outcome)")
        let item = try await f.item(file)
        try check(item.chunks == [c0] && item.name.value == "renamed.txt", "B's content stays current, A's rename applies, got \(item)")
        try check(try await f.versions(file).contains { $0.role == .conflict && $0.state.chunks == [ca] }, "A's content is a conflict version")
    }
}
