import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

@Suite struct ItemStatusTests {
    typealias B = StatusFacts.Base
    static let synced = B(version: 5, conflicts: 0, complete: true, anyPresent: true)
    static let placeholder = B(version: 5, conflicts: 0, complete: false, anyPresent: false)
    static let partial = B(version: 5, conflicts: 0, complete: false, anyPresent: true)
    static let conflicted = B(version: 5, conflicts: 2, complete: true, anyPresent: true)

    enum Record { case none, refused, deviceLocal, writing, heldV6, heldV5, refusedAndWriting, overQuota, overQuotaNoFigures }

    static func item(_ r: Record) -> SyncItem<T> {
        var i = SyncItem<T>()
        let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10))
        func failed(_ f: UploadFailure) { i.upload.on(.failed(f, message: "refused", missingChunks: false), at: .s(0), rules: rules) }
        switch r {
        case .none: break
        case .refused: failed(.refused)
        case .deviceLocal: i.upload.on(.deviceLocal(true), at: .s(0), rules: rules)
        case .writing: i.upload.on(.wrote, at: .s(0), rules: rules)
        case .heldV6: _ = i.remote.holdForLock(RemoteHoldsTests.v(6))
        case .heldV5: i.remote.holdForWriter(RemoteHoldsTests.v(5))
        case .refusedAndWriting: failed(.refused); i.upload.on(.wrote, at: .s(0), rules: rules)
        case .overQuota: failed(.overQuota(QuotaFigures(usage: 90, quota: 100)))
        case .overQuotaNoFigures: failed(.overQuota(nil))
        }
        return i
    }

    /// (record, facts, status): every status, and which wins when several apply.
    @Test(arguments: [
        (Record.none, StatusFacts(base: synced), ItemStatus.current),
        (.none, StatusFacts(base: placeholder), .cloud),
        (.none, StatusFacts(base: placeholder, downloading: true), .downloading),
        (.none, StatusFacts(base: partial), .partial),
        (.none, StatusFacts(base: partial, downloading: true), .downloading),
        (.none, StatusFacts(base: synced, downloading: true), .current),
        (.none, StatusFacts(base: nil), .uploading),
        (.none, StatusFacts(base: nil, isRoot: true), .current),
        (.none, StatusFacts(base: synced, queued: true), .uploading),
        (.none, StatusFacts(base: synced, queued: true, unauthorized: true), .error),
        (.none, StatusFacts(base: synced, unauthorized: true), .current),
        (.writing, StatusFacts(base: synced), .uploading),
        (.refused, StatusFacts(base: synced), .error),
        (.refusedAndWriting, StatusFacts(base: conflicted, queued: true), .error),
        // Waiting for room under the account's quota: an error, also never uploaded or queued.
        (.overQuota, StatusFacts(base: nil, queued: true), .error),
        (.overQuota, StatusFacts(base: synced, queued: true), .error),
        (.overQuotaNoFigures, StatusFacts(base: conflicted), .error),
        (.deviceLocal, StatusFacts(base: nil), .localOnly),
        (.none, StatusFacts(base: conflicted), .conflict),
        (.writing, StatusFacts(base: conflicted), .conflict),
        (.heldV6, StatusFacts(base: synced), .downloaded),
        (.heldV5, StatusFacts(base: synced), .current),
        (.heldV6, StatusFacts(base: synced, queued: true), .uploading),
        (.heldV6, StatusFacts(base: placeholder, downloading: true), .downloaded),
    ] as [(Record, StatusFacts, ItemStatus)])
    func status(_ record: Record, _ facts: StatusFacts, _ expected: ItemStatus) {
        #expect(Self.item(record).status(facts) == expected)
    }

    /// (record, facts, what `user.nimbus.error` says): a refusal's reason first, then a refused
    /// token for what waits to go up, then the last failure's text.
    @Test(arguments: [
        (Record.none, StatusFacts(base: synced), ""),
        (.refused, StatusFacts(base: synced), "refused"),
        (.refused, StatusFacts(base: synced, queued: true, unauthorized: true), "refused"),
        (.none, StatusFacts(base: synced, queued: true, unauthorized: true), "token"),
        (.writing, StatusFacts(base: synced, unauthorized: true), "token"),
        (.none, StatusFacts(base: nil, unauthorized: true), "token"),
        (.none, StatusFacts(base: synced, unauthorized: true), ""),
        (.overQuota, StatusFacts(base: synced, queued: true), "refused"),
    ] as [(Record, StatusFacts, String)])
    func errorText(_ record: Record, _ facts: StatusFacts, _ expected: String) {
        let text = Self.item(record).errorText(facts)
        if expected == "token" {
            #expect(text.contains("refused this device's token") && text.contains("--token-file"), "\(text)")
        } else {
            #expect(text == expected)
        }
    }

    @Test func progressSaysTheUploadUnderWayElseWhatIsHere() {
        let r = BaseTests().record([10, 30])
        #expect(ProgressText.of(uploading: (sent: 5, total: 20), base: nil) == "25% 5/20 uploaded")
        #expect(ProgressText.of(uploading: (sent: 0, total: 0), base: Base.placeholder(r)) == "100% 0/0 uploaded")
        #expect(ProgressText.of(uploading: nil, base: Base.placeholder(r)) == "0% 0/40")
        #expect(ProgressText.of(uploading: nil, base: Base(record: r, present: [false, true])) == "75% 30/40")
        #expect(ProgressText.of(uploading: nil, base: Base(record: r, present: nil)) == "100% 40/40")
        #expect(ProgressText.of(uploading: nil, base: nil) == "100% 0/0")
        #expect(ProgressText.of(uploading: nil, base: Base.placeholder(BaseTests().record([]))) == "100% 0/0")
    }

    @Test func theWordsAreTheDocumentedOnes() {
        #expect(ItemStatus.allCases.map(\.rawValue) == ["cloud", "downloading", "partial", "downloaded", "current", "uploading", "error", "local-only", "conflict"])
    }
}
