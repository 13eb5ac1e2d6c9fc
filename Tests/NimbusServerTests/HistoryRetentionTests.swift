import Foundation
import GRDB
import NimbusCore
import NimbusProtocol
@testable import NimbusServer
import Testing

/// The pruning rule as a table, and the SQLite upgrade that brings history retention to an
/// existing database. (The rule on real stores: StoreConformance's history cases.)
@Suite struct HistoryRetentionTests {
    static let day = HistoryRetention.nanosecondsPerDay

    static func previous(_ seq: Int64, retired: Int64, wasCurrent: Bool = true) -> EarlierVersion {
        EarlierVersion(seq: seq, role: .previous, wasCurrent: wasCurrent, retired: retired)
    }

    @Test func settingsAreValidated() {
        #expect(HistoryRetention(keepVersions: -1, keepDays: 30) == nil)
        #expect(HistoryRetention(keepVersions: 5, keepDays: -1) == nil)
        #expect(HistoryRetention(keepVersions: 5, keepDays: HistoryRetention.maxKeepDays + 1) == nil)
        #expect(HistoryRetention.problem(keepVersions: -1, keepDays: 0)?.contains("--keep-versions") == true)
        #expect(HistoryRetention(keepVersions: 0, keepDays: 0) != nil)
        #expect(HistoryRetention.default.keepVersions == 50 && HistoryRetention.default.keepDays == 30)
    }

    @Test func prunedOnlyWhenBothBeyondTheLastNAndOld() throws {
        let now = 100 * Self.day
        let earlier = (1...6).map { Self.previous(Int64($0), retired: Int64($0) * 10 * Self.day) }  // retired on days 10…60
        func pruned(_ n: Int, _ d: Int) throws -> [Int64] {
            try #require(HistoryRetention(keepVersions: n, keepDays: d)).prunable(earlier, now: now).map(\.seq).sorted()
        }
        #expect(try pruned(2, 0) == [1, 2, 3, 4], "the last 2 stay")
        #expect(try pruned(0, 0) == [1, 2, 3, 4, 5, 6], "0 and 0 keep nothing")
        #expect(try pruned(0, 60) == [1, 2, 3, 4], "retired on day 40 is exactly 60 days old at day 100: old")
        #expect(try pruned(2, 85) == [1], "only day 10 is older than 85 days")
        #expect(try pruned(10, 0) == [], "fewer than N")
        #expect(try pruned(0, 1_000) == [], "all younger than D")
    }

    @Test func discardedVersionsGoByAgeAndHoldNoPlaceAmongTheLastN() throws {
        let now = 100 * Self.day
        let earlier = [
            Self.previous(1, retired: 10 * Self.day),
            EarlierVersion(seq: 2, role: .discarded, wasCurrent: false, retired: 90 * Self.day),
            EarlierVersion(seq: 3, role: .discarded, wasCurrent: true, retired: 20 * Self.day),
        ]
        let rule = try #require(HistoryRetention(keepVersions: 1, keepDays: 30))
        #expect(rule.prunable(earlier, now: now).map(\.seq) == [3], "the previous version is the last 1; the young discarded one stays")
    }

    @Test func aClockThatWentBackPrunesNothingByAge() throws {
        let rule = try #require(HistoryRetention(keepVersions: 0, keepDays: 1))
        #expect(rule.prunable([Self.previous(1, retired: 50 * Self.day)], now: 10 * Self.day).isEmpty)
    }

    /// A database made before retention: its earlier versions get the upgrade time as their
    /// retired time, so they are kept the full --keep-days from the upgrade on.
    @Test func upgradeStampsExistingHistory() async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-upgrade-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/metadata.sqlite"
        let device = DeviceID(UUID()), item = ItemID(UUID())
        let token = String(repeating: "b", count: 64)
        @Sendable func state(_ t: Int64) -> ItemState {
            ItemState(kind: .file, location: ItemLocation(parent: .root, name: ItemName(trusted: "a.txt")), mode: 0o644, modified: t, modifiedBy: device)
        }
        do {
            let pool = try DatabasePool(path: path)
            try SQLiteStore.migrator.migrate(pool, upTo: "v1")
            try await pool.write { db in
                try db.execute(sql: "INSERT INTO accounts(id, name) VALUES (1, 'alice')")
                try db.execute(sql: "INSERT INTO devices(id, account_id, name, token_hash, created) VALUES (?, 1, 'laptop', ?, 0)",
                               arguments: [device.description, token])
                try db.execute(sql: "INSERT INTO containers(id, account_id, name, cursor) VALUES (1, 1, 'c', 3)")
                try db.execute(sql: """
                    INSERT INTO items(container_id, id, parent_id, name, kind, deleted, version, conflicts, state)
                    VALUES (1, ?, ?, 'a.txt', 'file', 0, 3, 0, ?)
                    """, arguments: [item.description, ItemID.root.description, try Codec.encode(state(3))])
                for (seq, role, wasCurrent) in [(1, "previous", 1), (2, "discarded", 0), (3, "current", 1)] {
                    try db.execute(sql: "INSERT INTO versions(container_id, item_id, seq, role, was_current, device_id, state) VALUES (1, ?, ?, ?, ?, ?, ?)",
                                   arguments: [item.description, seq, role, wasCurrent, device.description, try Codec.encode(state(Int64(seq)))])
                    try db.execute(sql: "INSERT INTO journal(container_id, seq, item_id, kind, device_id, record) VALUES (1, ?, ?, 'update', ?, ?)",
                                   arguments: [seq, item.description, device.description,
                                               try Codec.encode(ItemRecord(id: item, version: Int64(seq), state: state(Int64(seq)), conflicts: 0))])
                }
            }
        }
        let before = Int64(Date().timeIntervalSince1970) * 1_000_000_000
        let store = try SQLiteStore(path: path, history: try #require(HistoryRetention(keepVersions: 0, keepDays: 30)))
        #expect(try await store.consistencyProblems().isEmpty)
        let retired = try await store.pool.read { db in
            try Row.fetchAll(db, sql: "SELECT seq, retired FROM versions ORDER BY seq").map { ($0["seq"] as Int64, $0["retired"] as Int64?) }
        }
        #expect(retired.map(\.0) == [1, 2, 3] && retired[2].1 == nil)
        #expect(retired[0].1.map { $0 >= before - 2_000_000_000 && $0 <= before + 60_000_000_000 } == true, "stamped at the upgrade: \(retired)")
        let deviceRecord = try #require(try await store.device(tokenHash: token))
        let container = try #require(try await store.container(account: 1, name: "c", create: false))
        func touch(_ base: Int64, _ t: Int64, now: Int64) async throws -> Int64 {
            let draft = ItemDraft(kind: .file, parent: .root, name: ItemName(trusted: "a.txt"), mode: 0o644, modified: t)
            return try await store.commit(CommitRequest(item: item, baseVersion: base, state: draft), in: container, by: deviceRecord, now: now).item.version
        }
        // A day after the upgrade, the old earlier versions are young: kept (discarded ones never listed).
        let v4 = try await touch(3, 4, now: before + Self.day)
        #expect(try await store.versions(of: item, in: container).map(\.version) == [4, 3, 1])
        // An hour short of 31 days after: versions 1 and 2 (stamped at the upgrade) are over 30 days
        // old and go; 3 (retired a day after the upgrade) is not yet: it stays.
        _ = try await touch(v4, 5, now: before + 31 * Self.day - 3_600 * 1_000_000_000)
        #expect(try await store.versions(of: item, in: container).map(\.version) == [5, 4, 3])
        #expect(try await store.consistencyProblems().isEmpty)
    }
}
