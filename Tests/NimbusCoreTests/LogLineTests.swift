import Glibc
import NimbusLog
import Testing

@Suite struct LogLineTests {
    @Test func aLineOnATerminalOrInAFileStartsWithItsUTCTime() {
        let t = timespec(tv_sec: 1_795_000_000, tv_nsec: 7_500_000)  // 2026-11-18T11:06:40.007Z
        #expect(LogLine.format("nimbus sync", "first sync: 3 items", journal: false, at: t)
            == "2026-11-18T11:06:40.007Z nimbus sync: first sync: 3 items\n")
        #expect(LogLine.timestamp(timespec(tv_sec: 0, tv_nsec: 999_999_999)) == "1970-01-01T00:00:00.999Z")
    }

    @Test func aLineInTheJournalCarriesItsPriorityAndNoTime() {
        #expect(LogLine.format("nimbus mount", "mounted /m", journal: true) == "<6>nimbus mount: mounted /m\n")
        #expect(LogLine.format("nimbus store", "disk full", level: .warning, journal: true) == "<4>nimbus store: disk full\n")
        #expect(LogLine.format("nimbus store", "lost", level: .error, journal: true) == "<3>nimbus store: lost\n")
        #expect(LogLine.Level.error > LogLine.Level.info)
    }

    /// `JOURNAL_STREAM` counts only while fd 2 is still that stream: a program started from a
    /// service with its stderr redirected to a file inherits the variable, not the journal.
    @Test func theJournalIsRecognisedByItsDeviceAndInode() throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        var st = stat()
        #expect(fstat(fds[1], &st) == 0)
        #expect(LogLine.isJournal(fd: fds[1], journalStream: "\(st.st_dev):\(st.st_ino)"))
        #expect(!LogLine.isJournal(fd: fds[1], journalStream: "\(st.st_dev):\(st.st_ino + 1)"))
        #expect(!LogLine.isJournal(fd: fds[1], journalStream: "garbage"))
        #expect(!LogLine.isJournal(fd: fds[1], journalStream: ""))
        #expect(!LogLine.isJournal(fd: fds[1], journalStream: "1:2:3"))
    }
}
