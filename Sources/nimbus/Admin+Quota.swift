import ArgumentParser
import Foundation
import NimbusProtocol
import NimbusServer

/// `nimbus admin set-quota` and `nimbus admin quota` (docs/deploy.md "Quotas").
extension Admin {
    struct SetQuota: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "set-quota",
            abstract: "Set an account's quota: the most bytes of file content it may store (or none); prints its usage.",
            discussion: """
                BYTES is a whole number of bytes, or with a suffix K, M, G or T (powers of 1024): 500M, 20G. `none` removes the quota. \
                A chunk upload that would take the account beyond its quota is refused (quota_exceeded); the devices keep the change \
                and upload it by themselves once there is room. Lowering a quota below the usage refuses only new content: \
                deletes, renames and moves still go through. Takes effect at once, also while servers run.
                """)

        @Option(help: "The server's data directory.") var data: String?
        @Option(help: "The server's PostgreSQL database (postgres://…), when it uses one.") var database: String?
        @Option(help: "The account.") var account: String
        @Argument(help: ArgumentHelp("The quota in bytes (K, M, G, T suffixes allowed), or `none`.", valueName: "BYTES|none"))
        var quota: String

        func validate() throws {
            if QuotaSize.parse(quota) == nil {
                throw ValidationError("the quota is a number of bytes (with an optional K, M, G or T suffix: 20G) or `none`; got \(quota.debugDescription)")
            }
        }

        func run() async throws {
            guard let bytes = QuotaSize.parse(quota) else { throw ValidationError("bad quota \(quota.debugDescription)") }
            let usage = try await Admin.withStore(data: data, database: database) { try await $0.setQuota(account: account, bytes: bytes) }
            print(Quota.line(usage))
        }
    }

    struct Quota: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show accounts' usage and quotas: account, bytes used, quota, bytes free, chunks, metadata, Recently Deleted.",
            discussion: "Usage is the bytes of the chunks an account stores (each once), with uploads under way, plus its metadata: the bytes of its versions and journal entries (chunk lists included). `trash` is the file bytes of its Recently Deleted entries: counted until purged, and purged oldest first when an upload would pass the quota (docs/trash.md).")

        @Option(help: "The server's data directory.") var data: String?
        @Option(help: "The server's PostgreSQL database (postgres://…), when it uses one.") var database: String?
        @Option(help: "Only this account.") var account: String?

        func run() async throws {
            let all = try await Admin.withStore(data: data, database: database) { try await $0.accountUsage(account: account) }
            if let account, all.isEmpty { throw CLIFailure(.usage, "no account named \(account.debugDescription)") }
            for u in all { print(Self.line(u)) }
        }

        static func line(_ u: AccountUsage) -> String {
            let quota = u.figures.quota.map { "quota \($0) (\(QuotaSize.human($0)))" } ?? "quota none"
            let free = u.free.map { "free \($0)" } ?? "free unlimited"
            return "\(u.account)\tused \(u.figures.usage) (\(QuotaSize.human(u.figures.usage)))\t\(quota)\t\(free)\tchunks \(u.chunks)\tmetadata \(u.metadata)\ttrash \(u.trash) (\(QuotaSize.human(u.trash)))"
        }
    }
}

/// A quota as typed: bytes with an optional binary suffix, or `none`.
enum QuotaSize {
    /// `.some(nil)` for `none`; nil when it is not a quota.
    static func parse(_ text: String) -> Int64?? {
        let t = text.trimmingCharacters(in: .whitespaces)
        if t.lowercased() == "none" { return .some(nil) }
        var digits = Substring(t)
        var unit: Int64 = 1
        if let last = t.last, let shift = ["K": 10, "M": 20, "G": 30, "T": 40][last.uppercased()] {
            unit = 1 << shift
            digits = t.dropLast()
        }
        guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }), let n = Int64(digits), n >= 0 else { return nil }
        let (bytes, overflow) = n.multipliedReportingOverflow(by: unit)
        guard !overflow, bytes <= Int64.max / 2 else { return nil }
        return .some(bytes)
    }

    /// 1536 → "1.5 KiB".
    static func human(_ bytes: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
        var v = Double(bytes), i = 0
        while v >= 1024, i < units.count - 1 { v /= 1024; i += 1 }
        return i == 0 ? "\(bytes) B" : "\(String(format: "%.1f", v)) \(units[i])"
    }
}
