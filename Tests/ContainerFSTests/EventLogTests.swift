@testable import ContainerFS
import Testing
@testable import MountPorts
import Foundation
import Glibc
import LocalStore

/// The log behind `.nimbus/events`: line format, escapes, what is kept when it grows.
@Suite struct EventLogTests {
    static func text(_ log: EventLog, from offset: Int64 = 0) -> String {
        String(decoding: log.read(offset: offset, size: 1 << 22), as: UTF8.self)
    }

    @Test func linesCarryIncreasingSequencesAndEscapedPaths() {
        let log = EventLog(firstSequence: 41)
        log.append(.created, origin: .local, path: "/a b.txt")
        log.append(.moved, origin: .remote, path: "/x->y\nz", to: "/back\\slash", detail: "v3")
        let lines = Self.text(log).split(separator: "\n")
        #expect(lines.count == 2)
        let first = lines[0].split(separator: " ", maxSplits: 4)
        #expect(first[0] == "41" && first[2] == "created" && first[3] == "local" && first[4] == "/a b.txt")
        #expect(first[1].hasSuffix("Z") && first[1].contains("T"), "UTC time: \(first[1])")
        let second = lines[1].split(separator: " ", maxSplits: 4)
        #expect(second[0] == "42")
        // The name's "->" cannot be mistaken for the move's separator; one event stays one line.
        #expect(second[4] == #"/x-\>y\nz -> /back\\slash v3"#)
        #expect(String(second[4]).components(separatedBy: " -> ").count == 2)
        #expect(log.nextSequence == 43)
        #expect(log.size == Int64(Self.text(log).utf8.count))
    }

    /// The line is written byte by byte (no String per field): the same text as the format says,
    /// for any sequence number, time and name.
    @Test func theFieldsAreWrittenExactly() throws {
        let log = EventLog(firstSequence: 9_007_199_254_740_993)
        var before = timespec()
        clock_gettime(CLOCK_REALTIME, &before)
        log.append(.changed, origin: .sync, path: "/d\u{E9}j\u{E0} vu/\u{65E5}\u{672C}.txt", detail: "v0")
        log.append(.restored, origin: .remote, path: "/0", to: "/9")
        let lines = Self.text(log).split(separator: "\n").map(String.init)
        #expect(lines.count == 2)
        let f = lines[0].split(separator: " ", maxSplits: 4).map(String.init)
        #expect(f[0] == "9007199254740993" && f[2] == "changed" && f[3] == "sync" && f[4] == "/d\u{E9}j\u{E0} vu/\u{65E5}\u{672C}.txt v0")
        #expect(f[1].wholeMatch(of: /[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z/) != nil, "\(f[1])")
        // The same text as the time of `before`, within the second or two the test took.
        let expected = EventLog.time(before)
        #expect(f[1].prefix(16) == expected.prefix(16), "\(f[1]) vs \(expected)")
        #expect(lines[1].split(separator: " ").dropFirst(2).joined(separator: " ") == "restored remote /0 -> /9")
        #expect(lines[1].hasPrefix("9007199254740994 "))
        // A number beyond any run's (a damaged state directory) does not trap the mount.
        let odd = EventLog(firstSequence: .max)
        odd.append(.created, origin: .local, path: "/x")
        #expect(odd.nextSequence == EventLog.highest + 1)
        #expect(log.size == Int64(Self.text(log).utf8.count))
    }

    /// The next number is kept in the state directory; a damaged one (beyond any run's) is
    /// taken as the highest, not trapped on when the mount opens.
    @Test func aDamagedStoredSequenceDoesNotTrapTheMount() throws {
        let dir = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("nimbus-events-\(UUID().uuidString)")
        let store = try LocalStore(directory: dir)
        defer { store.close(); try? FileManager.default.removeItem(at: dir) }
        try store.setMeta("events.seq", "\(UInt64.max)")
        store.commitQueued()
        let services = try MountServices.open(store: store, presenterTimeout: .seconds(1))
        services.events.append(.created, origin: .local, path: "/x")
        #expect(services.events.nextSequence == EventLog.highest + 1)
    }

    @Test func controlCharactersInNamesCannotForgeLinesOrReachATerminal() {
        let log = EventLog()
        log.append(.created, origin: .local, path: "/a\r\nb\u{1B}]0;owned\u{07}c\u{7F}\td")
        let text = Self.text(log)
        #expect(text.split(separator: "\n").count == 1 && text.hasSuffix("\n"))
        #expect(text.hasSuffix(#"/a\x0D\nb\x1B]0;owned\x07c\x7F\x09d"# + "\n"), "\(text)")
        #expect(!text.unicodeScalars.dropLast().contains { $0.value < 0x20 || $0.value == 0x7F })
    }

    @Test func aFullLogDropsWholeLinesFromTheFrontAndKeepsItsSize() {
        let log = EventLog(capacity: 1000)
        for i in 0..<200 { log.append(.changed, origin: .local, path: "/file-\(i).txt") }
        let size = log.size
        #expect(size > 1000, "the size counts every byte ever written, so tail -f keeps following")
        // Reading from offset 0 starts at the oldest line kept, on a line boundary.
        let kept = Self.text(log)
        #expect(kept.utf8.count <= 1000 && kept.hasSuffix("/file-199.txt\n"))
        #expect(kept.split(separator: "\n").allSatisfy { UInt64($0.split(separator: " ")[0]) != nil })
        // The last line read at its own offset.
        let last = Self.text(log, from: size - Int64("/file-199.txt\n".utf8.count))
        #expect(last == "/file-199.txt\n")
        #expect(log.read(offset: size, size: 10).isEmpty)
    }

    @Test func aSaveRightAfterTheSameEventIsOneLine() {
        let log = EventLog()
        log.append(.created, origin: .local, path: "/f")
        log.append(.changed, origin: .local, path: "/f", coalesce: [.created, .changed])
        log.append(.changed, origin: .local, path: "/f", coalesce: [.created, .changed])
        log.append(.changed, origin: .local, path: "/g", coalesce: [.created, .changed])
        log.append(.uploaded, origin: .sync, path: "/f")
        log.append(.changed, origin: .local, path: "/f", coalesce: [.created, .changed])
        let kinds = Self.text(log).split(separator: "\n").map { $0.split(separator: " ")[2] + " " + $0.split(separator: " ")[4] }
        #expect(kinds == ["created /f", "changed /g", "uploaded /f", "changed /f"])
    }
}
