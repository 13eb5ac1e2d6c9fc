/// How much history the server keeps of each item: `nimbus serve --keep-versions N --keep-days D`
/// (docs/deploy.md "History retention").
///
/// An item's **earlier versions** are its `previous` rows (states that were current once) and its
/// `discarded` rows (conflict versions resolved away). The current version and unresolved conflict
/// versions are never earlier versions, so they are never pruned.
///
/// An earlier version is pruned only when it is **both**
/// - not among the item's `keepVersions` newest previous versions (discarded versions are never
///   listed or restorable, so they hold no place among those N), and
/// - at least `keepDays` days old, counted from when it stopped being current (or was discarded),
///   by the server's clock.
///
/// So `keepVersions: 0, keepDays: 0` keeps no earlier version at all, a large `keepDays` keeps
/// everything younger than that however many there are, and a large `keepVersions` keeps the last
/// N however old. Pruning is `CommitEngine`'s, for the items a commit or resolve touches
/// (`prunable` is the rule, pure).
public struct HistoryRetention: Hashable, Sendable, CustomStringConvertible {
    /// How many of an item's newest previous versions are kept whatever their age.
    public let keepVersions: Int
    /// Earlier versions younger than this many days are kept however many there are.
    public let keepDays: Int

    /// 50 previous versions per item, and every earlier version younger than 30 days.
    public static let `default` = HistoryRetention(checked: 50, 30)
    /// The largest `keepDays` (100 years), so that the age in nanoseconds fits an Int64.
    public static let maxKeepDays = 36_500
    static let nanosecondsPerDay: Int64 = 86_400 * 1_000_000_000

    /// A sentence saying what is wrong with these numbers, or nil when they are valid.
    public static func problem(keepVersions: Int, keepDays: Int) -> String? {
        if keepVersions < 0 {
            return "--keep-versions takes a whole number of versions, 0 or more (got \(keepVersions)); 0 keeps only what --keep-days keeps"
        }
        if keepDays < 0 || keepDays > maxKeepDays {
            return "--keep-days takes a whole number of days, 0…\(maxKeepDays) (got \(keepDays)); 0 keeps only what --keep-versions keeps"
        }
        return nil
    }

    /// nil when `problem` names one.
    public init?(keepVersions: Int, keepDays: Int) {
        guard Self.problem(keepVersions: keepVersions, keepDays: keepDays) == nil else { return nil }
        self.init(checked: keepVersions, keepDays)
    }

    private init(checked keepVersions: Int, _ keepDays: Int) {
        self.keepVersions = keepVersions
        self.keepDays = keepDays
    }

    public var description: String {
        "keeping the last \(keepVersions) earlier version(s) of each item and all younger than \(keepDays) day(s)"
    }

    /// Which of an item's earlier versions go, at server time `now` (nanoseconds since 1970).
    /// A version retired "in the future" (the clock went back) is not old, unless `keepDays` is 0.
    func prunable(_ earlier: [EarlierVersion], now: Int64) -> [EarlierVersion] {
        let newestPrevious = Set(earlier.filter { $0.role == .previous }.map(\.seq).sorted(by: >).prefix(keepVersions))
        let cutoff = now - Int64(keepDays) * Self.nanosecondsPerDay
        return earlier.filter { v in
            !newestPrevious.contains(v.seq) && (keepDays == 0 || v.retired <= cutoff)
        }
    }
}

/// What pruning needs to know of one earlier version row (no state).
struct EarlierVersion: Hashable, Sendable {
    var seq: Int64
    /// `previous` or `discarded`.
    var role: StoredRole
    /// Whether the row was ever the current state; `stateCurrent(at:)` reads only those.
    var wasCurrent: Bool
    /// When it stopped being current or was discarded (server time, ns since 1970).
    var retired: Int64
}
