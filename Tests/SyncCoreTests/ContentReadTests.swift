import Foundation
import NimbusCore
import NimbusProtocol
import SyncCore
import Testing

/// The upload's rules around reading a file's content (ContentRead.swift), as tables.
@Suite struct ContentReadTests {
    static func m(_ g: UInt64, changing: Bool = false, unsynced: Bool = false) -> WriteMoment {
        WriteMoment(generation: g, changing: changing, unsynced: unsynced)
    }

    /// (before, after, snapshot, one state).
    @Test(arguments: [
        (m(3), m(3), UInt64?.none, true),
        (m(3), m(4), nil, false),                               // a write ended while it was read
        (m(3, changing: true), m(3), nil, false),               // one was under way when it began
        (m(3), m(3, changing: true), nil, false),               // one is under way now
        (m(3), m(3, unsynced: true), nil, false),               // a writer mid-save: its close sends it
        (m(3, unsynced: true), m(3, unsynced: true), 3, true),  // a snapshot at its quiet generation
        (m(3, unsynced: true), m(3, unsynced: true), 2, false), // a snapshot of another generation
        (nil, m(3), nil, false),
        (m(3), nil, nil, false),
    ] as [(WriteMoment?, WriteMoment?, UInt64?, Bool)])
    func whatWasChunkedIsOneStateOfTheFile(_ before: WriteMoment?, _ after: WriteMoment?, _ snapshot: UInt64?, _ one: Bool) {
        #expect(CommitPlan.isOneState(before: before, after: after, snapshot: snapshot) == one)
    }

    @Test func whereACommitsContentComesFrom() {
        let r = ContentPlanTests.file([10, 20])
        #expect(CommitPlan.contentSource(isFile: false, base: nil) == .none)
        #expect(CommitPlan.contentSource(isFile: true, base: nil) == .read, "new here: read")
        #expect(CommitPlan.contentSource(isFile: true, base: Base(record: r, present: nil)) == .read, "whole here: read")
        #expect(CommitPlan.contentSource(isFile: true, base: Base(record: r, present: [true, false])) == .base(r.chunks),
                "not all downloaded: not changed here")
    }

    @Test func theServerIsAskedForMissingChunksUnlessTheyAreTheBases() {
        let r = ContentPlanTests.file([10, 20])
        #expect(CommitPlan.contentSend(chunks: r.chunks, known: r.chunks, chunksMissing: false) == .known)
        #expect(CommitPlan.contentSend(chunks: r.chunks, known: r.chunks, chunksMissing: true) != .known, "the server said chunks are gone")
        #expect(CommitPlan.contentSend(chunks: r.chunks, known: nil, chunksMissing: false) == .ask, "two chunks: asked for")
    }

    /// A file of one chunk of at most 64 KiB sends its bytes inside the commit, unless the server
    /// said chunks were missing (a server that ignores inline bytes): then it asks as any other.
    @Test func aSmallFileSendsItsBytesInsideTheCommit() {
        let limit = Int64(ProtocolLimits.inlineFileBytes)
        let small = ContentPlanTests.file([limit]).chunks, big = ContentPlanTests.file([limit + 1]).chunks
        let empty = ContentPlanTests.file([]).chunks
        #expect(CommitPlan.contentSend(chunks: small, known: nil, chunksMissing: false) == .inline)
        #expect(CommitPlan.contentSend(chunks: small, known: empty, chunksMissing: false) == .inline, "an edit of a small file")
        #expect(CommitPlan.contentSend(chunks: small, known: nil, chunksMissing: true) == .ask)
        #expect(CommitPlan.contentSend(chunks: small, known: nil, chunksMissing: false, inlineAllowed: false) == .ask, "sent apart: no commit to carry it")
        #expect(CommitPlan.contentSend(chunks: small, known: small, chunksMissing: false) == .known)
        #expect(CommitPlan.contentSend(chunks: big, known: nil, chunksMissing: false) == .ask, "over 64 KiB")
        #expect(CommitPlan.contentSend(chunks: empty, known: nil, chunksMissing: false) == .ask, "no chunk: nothing to inline")
    }

    @Test func whatADeleteIsSentOn() {
        let live = ContentPlanTests.file([10])
        let gone = ContentPlanTests.file([10], version: 2, deleted: true)
        #expect(CommitPlan.deleteBase(nil) == .askServer)
        #expect(CommitPlan.deleteBase(Base(record: live, present: nil)) == .base(live, version: 1))
        #expect(CommitPlan.deleteBase(Base(record: gone, present: nil)) == .alreadyDeleted)
    }

    @Test func whatAFailureSays() {
        #expect(UploadFailure.transient.message("boom") == "upload failed: boom")
        #expect(UploadFailure.transient.why("boom") == "boom")
        let q = UploadFailure.overQuota(QuotaFigures(usage: 5, quota: 4))
        #expect(q.message("x").contains("it stores 5 bytes of its quota of 4 bytes") && q.why("x") == q.message("x"))
        #expect(UploadFailure.overQuota(nil).message("x").contains("the server gave no figures"))
    }
}

/// What a program asks through the control xattrs (ControlPlan.swift).
@Suite struct ControlPlanTests {
    @Test(arguments: [
        (NimbusXattr.resolve, "current", ControlPlan.Resolve.request(ResolveRequest(action: .keepCurrent))),
        (.resolve, "7", .request(ResolveRequest(action: .keepVersion, version: 7))),
        (.restore, "3", .request(ResolveRequest(action: .restore, version: 3))),
        (.discard, "9", .request(ResolveRequest(action: .discard, versions: [9]))),
        (.restore, "current", .invalid),
        (.discard, "x", .invalid),
        (.pinned, "1", .notAllowed),
    ])
    func resolvingXattrs(_ name: NimbusXattr, _ value: String, _ expected: ControlPlan.Resolve) {
        #expect(ControlPlan.resolve(name, value: value) == expected)
    }

    @Test func flags() {
        for on in ["1", "YES", "true", "On"] { #expect(ControlPlan.flag(on) == true) }
        for off in ["0", "no", "FALSE", "off"] { #expect(ControlPlan.flag(off) == false) }
        for bad in ["", "2", "maybe"] { #expect(ControlPlan.flag(bad) == nil) }
    }
}
