import SyncCore
import Testing

/// A stepped clock's instant: seconds as a Duration since the start.
struct T: InstantProtocol, Sendable {
    var t: Duration
    func advanced(by d: Duration) -> T { T(t: t + d) }
    func duration(to other: T) -> Duration { other.t - t }
    static func < (a: T, b: T) -> Bool { a.t < b.t }
    static func s(_ x: Int) -> T { T(t: .seconds(x)) }
}

@Suite struct UploadPacingTests {
    let rules = UploadPacing<T>.Rules(quietPeriod: .seconds(10), burst: 3)

    @Test func aSaveUploadsAtOnce() {
        var p = UploadPacing<T>()
        #expect(p.decide(at: .s(0), written: 0, rules: rules) == .now)
        p.changed(at: .s(0), rules: rules)
        #expect(p.decide(at: .s(0), written: 100, rules: rules) == .now)
    }

    @Test func aBurstThenOnePerQuietPeriod() {
        var p = UploadPacing<T>()
        var written: UInt64 = 0
        // Whole rewrites each second: the byte rule never holds them, the bucket does.
        for second in 0..<3 {
            p.changed(at: .s(second), rules: rules)
            written += 1000
            #expect(p.decide(at: .s(second), written: written, rules: rules) == .now, "burst upload \(second)")
            p.uploaded(at: .s(second), sent: 1000, written: written, rules: rules)
        }
        p.changed(at: .s(3), rules: rules)
        written += 1000
        // Three uploads at 0, 1, 2: the bucket is at 30 s; one more is allowed at 30 - 20 = 10 s.
        #expect(p.decide(at: .s(3), written: written, rules: rules) == .wait(until: .s(10)))
        #expect(p.decide(at: .s(10), written: written, rules: rules) == .now)
        p.uploaded(at: .s(10), sent: 1000, written: written, rules: rules)
        #expect(p.decide(at: .s(11), written: written + 1000, rules: rules) == .wait(until: .s(20)))
    }

    @Test func bytesUploadedStayWithinTwiceTheBytesWritten() {
        // A log: 100 bytes appended each second, each upload sends the whole (small) file.
        var p = UploadPacing<T>()
        var size: Int64 = 0
        var written: UInt64 = 0
        var sent: Int64 = 0
        for second in 0..<3600 {
            size += 100
            written += 100
            p.changed(at: .s(second), rules: rules)
            if p.decide(at: .s(second), written: written, rules: rules) == .now {
                p.uploaded(at: .s(second), sent: size, written: written, rules: rules)
                sent += size
            }
        }
        // The program stops: the last state goes once the file is quiet, and counts too.
        #expect(p.decide(at: .s(3599 + 10), written: written, rules: rules) == .now)
        sent += size
        // The first upload of the run and the one that may follow at once are outside the
        // byte rule (100 and 200 bytes); everything, the last state included, stays within 2×
        // what was written.
        #expect(sent <= 2 * Int64(written) + 300, "sent \(sent) for \(written) written")
        #expect(sent >= Int64(written), "the log kept reaching the server: sent \(sent) for \(written) written")
    }

    @Test func theLastStateGoesOnceTheFileIsQuiet() {
        var p = UploadPacing<T>()
        p.changed(at: .s(0), rules: rules)
        p.uploaded(at: .s(0), sent: 1_000_000, written: 10, rules: rules)
        p.changed(at: .s(1), rules: rules)
        p.uploaded(at: .s(1), sent: 1_000_000, written: 20, rules: rules)
        p.changed(at: .s(2), rules: rules)
        // 10 bytes written since the run's first upload, 1 MB sent after it: held until quiet
        // (or until 2 MB more is written: what was sent plus the next).
        #expect(p.decide(at: .s(2), written: 30, rules: rules) == .wait(until: .s(12)))
        #expect(p.decide(at: .s(12), written: 30, rules: rules) == .now)
        // A change in between moves the quiet point.
        p.changed(at: .s(5), rules: rules)
        #expect(p.decide(at: .s(12), written: 40, rules: rules) == .wait(until: .s(15)))
        // Enough written since earns it at once.
        #expect(p.decide(at: .s(6), written: 10 + 2_000_000, rules: rules) == .now)
        #expect(p.decide(at: .s(6), written: 10 + 1_999_999, rules: rules) != .now)
    }

    @Test func slowAppendsToALargeFileWaitForTheirBytes() {
        var p = UploadPacing<T>()
        p.changed(at: .s(0), rules: rules)
        p.uploaded(at: .s(0), sent: 4_000_000, written: 0, rules: rules)
        p.uploaded(at: .s(1), sent: 1_000_000, written: 0, rules: rules)
        // 1 KB a second, changed every second (never quiet): 2000 s to write what the second
        // upload sent plus the next (estimated as that upload again).
        var second = 2
        while second < 3000 {
            p.changed(at: .s(second), rules: rules)
            if p.decide(at: .s(second), written: UInt64(second) * 1000, rules: rules) == .now { break }
            second += 1
        }
        #expect(second == 2000)
    }

    @Test func aQuietFileStartsANewRun() {
        var p = UploadPacing<T>()
        p.changed(at: .s(0), rules: rules)
        p.uploaded(at: .s(0), sent: 1_000_000, written: 0, rules: rules)
        p.uploaded(at: .s(1), sent: 1_000_000, written: 0, rules: rules)
        #expect(p.decide(at: .s(2), written: 1, rules: rules) != .now)
        #expect(!p.isIdle(at: .s(20), rules: rules))
        // An hour later, a one-byte edit of the large file uploads at once.
        p.changed(at: .s(3600), rules: rules)
        #expect(p.decide(at: .s(3600), written: 2, rules: rules) == .now)
        #expect(p.isIdle(at: .s(7200), rules: rules))
    }

    /// Uploads with no change seen (queued before a restart, one retried after a lost answer):
    /// the run's last state still goes once quiet since the last upload, not "a quiet period
    /// from now" at every ask.
    @Test func uploadsWithNoChangeSeenAreNotPacedForever() {
        var p = UploadPacing<T>()
        p.uploaded(at: .s(0), sent: 28, written: 0, rules: rules)
        p.uploaded(at: .s(1), sent: 28, written: 0, rules: rules)
        #expect(p.decide(at: .s(5), written: 0, rules: rules) == .wait(until: .s(11)))
        #expect(p.decide(at: .s(11), written: 0, rules: rules) == .now)
        #expect(p.decide(at: .s(500), written: 0, rules: rules) == .now)
    }

    @Test func aCounterThatRestartedCountsWhole() {
        var p = UploadPacing<T>()
        p.changed(at: .s(0), rules: rules)
        p.uploaded(at: .s(0), sent: 10, written: 1_000_000, rules: rules)
        p.uploaded(at: .s(1), sent: 1000, written: 1_000_000, rules: rules)
        // The node changed (a remote version): the counter restarted at 0 and counts whole.
        #expect(p.decide(at: .s(2), written: 2000, rules: rules) == .now)
        #expect(p.decide(at: .s(2), written: 1999, rules: rules) != .now)
    }

    @Test func extremeValuesNeitherTrapNorOpenTheGate() {
        var p = UploadPacing<T>()
        p.changed(at: .s(0), rules: rules)
        p.uploaded(at: .s(0), sent: .max, written: .max, rules: rules)
        p.uploaded(at: .s(1), sent: .max, written: 0, rules: rules)
        p.uploaded(at: .s(2), sent: -5, written: 0, rules: rules)
        #expect(p.sentSinceStart == .max)
        #expect(p.decide(at: .s(3), written: 7, rules: rules) == .wait(until: .s(10)))
        #expect(p.decide(at: .s(100), written: 7, rules: rules) == .now)
    }

    @Test func noQuietPeriodNoPacing() {
        let off = UploadPacing<T>.Rules(quietPeriod: .zero)
        var p = UploadPacing<T>()
        for second in 0..<10 {
            p.changed(at: .s(second), rules: off)
            #expect(p.decide(at: .s(second), written: 0, rules: off) == .now)
            p.uploaded(at: .s(second), sent: 1 << 30, written: 0, rules: off)
        }
    }
}
