#if canImport(Glibc)
import Glibc
#endif

/// One line of a daemon's log on stderr.
///
/// On a terminal or in a file a line starts with its UTC time (`2026-11-25T08:07:57.123Z`).
/// Under systemd, where stderr is the journal (`JOURNAL_STREAM` names the stream, see
/// systemd.exec(5)), the journal stamps every line itself, so a line starts with its syslog
/// priority instead (`<6>` info, `<4>` warning, `<3>` error), which journald turns into the
/// entry's priority (`journalctl -p warning` shows warnings and worse).
public enum LogLine {
    public enum Level: Int, Sendable, Comparable {
        case error = 3, warning = 4, notice = 5, info = 6, debug = 7
        public static func < (a: Level, b: Level) -> Bool { a.rawValue > b.rawValue }
    }

    /// Whether stderr is the systemd journal: `JOURNAL_STREAM` is "DEVICE:INODE" of the stream
    /// systemd connected, and it must still be fd 2 (a program started from a service whose
    /// stderr was redirected inherits the variable but not the journal).
    public static let toJournal: Bool = {
        guard let v = getenv("JOURNAL_STREAM").map({ String(cString: $0) }) else { return false }
        return isJournal(fd: 2, journalStream: v)
    }()

    /// Whether `fd` is the stream named by a `JOURNAL_STREAM` value.
    public static func isJournal(fd: Int32, journalStream: String) -> Bool {
        let parts = journalStream.split(separator: ":")
        guard parts.count == 2, let dev = UInt64(parts[0]), let ino = UInt64(parts[1]) else { return false }
        var st = stat()
        guard fstat(fd, &st) == 0 else { return false }
        return UInt64(st.st_dev) == dev && UInt64(st.st_ino) == ino
    }

    /// The line for `message` from `tag` (e.g. "nimbus sync"), ending in a newline.
    public static func format(_ tag: String, _ message: String, level: Level = .info, journal: Bool = toJournal,
                              at time: timespec = now()) -> String {
        journal ? "<\(level.rawValue)>\(tag): \(message)\n" : "\(timestamp(time)) \(tag): \(message)\n"
    }

    /// Writes one line to stderr in one write(2), so lines of several threads never interleave.
    public static func write(_ tag: String, _ message: String, level: Level = .info) {
        var line = format(tag, message, level: level)
        line.withUTF8 { buf in
            var done = 0
            while done < buf.count {
                let n = Glibc.write(2, buf.baseAddress! + done, buf.count - done)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return }
                done += n
            }
        }
    }

    public static func now() -> timespec {
        var t = timespec()
        clock_gettime(CLOCK_REALTIME, &t)
        return t
    }

    /// ISO 8601 in UTC with milliseconds.
    public static func timestamp(_ t: timespec) -> String {
        var secs = t.tv_sec
        var tm = tm()
        gmtime_r(&secs, &tm)
        func pad(_ v: Int32, _ n: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, n - s.count)) + s
        }
        return "\(pad(tm.tm_year + 1900, 4))-\(pad(tm.tm_mon + 1, 2))-\(pad(tm.tm_mday, 2))T"
            + "\(pad(tm.tm_hour, 2)):\(pad(tm.tm_min, 2)):\(pad(tm.tm_sec, 2)).\(pad(Int32(t.tv_nsec / 1_000_000), 3))Z"
    }
}
