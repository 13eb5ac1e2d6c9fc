import Foundation
import Synchronization

/// The stream behind `.nimbus/events` (docs/mount.md "Events"): one line per change, move,
/// delete, new version, conflict, finished download or upload, each with a sequence number and
/// the item's current path:
///
///     SEQ TIME KIND ORIGIN PATH [-> NEWPATH] [DETAIL]
///     17 2026-11-23T04:50:01.234Z changed remote /notes/todo.txt v7
///
/// The file grows like a log: its size is every byte written since the mount started, so
/// `tail -f` (which polls the size on FUSE) follows it; the last `capacity` bytes can be read
/// back. Sequence numbers increase for the life of the state directory (the next one is kept in
/// the database when the mount stops; numbers are reserved ahead in blocks, so a run after
/// kill -9 skips some numbers but never repeats one). Its own mutex: lines are added with the filesystem lock
/// held or not.

/// What an event line says happened (its third field; docs/control.md "Events").
public enum EventKind: String, Sendable, CaseIterable {
    case created, changed, attributes, moved, deleted
    /// An editor's safe save exchanged two files' contents (the item kept its identity).
    case exchanged
    case downloaded, uploaded
    /// An upload the server kept as a conflict version, or whose current version it replaced.
    case conflict
    /// A new version from another device.
    case version
    /// An item brought back from Recently Deleted (docs/trash.md).
    case restored
    /// A program refused a download (DownloadPolicy): said once per program and mount, with
    /// the command that allows it.
    case refused
}

/// Who made an event happen (its fourth field): a program here, another device, the sync engine.
public enum EventOrigin: String, Sendable, CaseIterable {
    case local, remote, sync
}

public final class EventLog: Sendable {
    struct State {
        var seq: UInt64
        /// Numbers below this are promised to this run: a run after a crash starts here, so a
        /// number is never given twice (there is a gap instead).
        var reserved: UInt64
        /// Stream offset of `buffer[0]`.
        var base: Int64 = 0
        var buffer: [UInt8] = []
        /// Where in `buffer` the oldest line kept starts (bytes before it wait to be dropped).
        var oldest = 0
        /// The last line's kind, origin and path, and when it was written (for `coalesce`).
        var last: (kind: EventKind, origin: EventOrigin, path: String, at: ContinuousClock.Instant)?
        /// Where each line kept starts and the paths it names (for readers who may see only some
        /// lines: `readFiltered`); `lines[firstLine]` is the oldest line kept.
        var lines: [LineInfo] = []
        var firstLine = 0
        /// The last second a line was written in and its text up to the milliseconds
        /// ("2026-11-23T04:50:01."): formatted once per second, not once per line.
        var second: Int = -1
        var secondText: [UInt8] = []
    }

    struct LineInfo {
        var start: Int64
        var path: String
        var to: String?
        var paths: [String] { to.map { [path, $0] } ?? [path] }
    }

    /// Where a reader that sees only some lines is in the stream (`readFiltered`): its own offset
    /// (the bytes it was given so far), the stream offset it has read up to, and the bytes of
    /// whole lines read but not yet given.
    public struct FilteredCursor: Sendable {
        var offset: Int64 = 0
        var stream: Int64 = 0
        var pending: [UInt8] = []
        public init() {}
    }

    /// One event as a presenter hears of it (PresenterHub).
    public struct Record: Sendable {
        public let seq: UInt64
        public let kind: EventKind
        public let origin: EventOrigin
        public let path: String
        public let to: String?
        public let detail: String?
    }

    let capacity: Int
    private let state: Mutex<State>
    /// The listener sits in a class box: a bare closure stored in the generic `Mutex` and read
    /// out with `withLock { $0 }` gained a reabstraction thunk per read in release builds, so
    /// each call ran through all the thunks before it (a first sync of 20,000 items spent 70%
    /// of its time there).
    private final class Listener: Sendable {
        let f: @Sendable (Record) -> Void
        init(_ f: @escaping @Sendable (Record) -> Void) { self.f = f }
    }
    private let listener = Mutex<Listener?>(nil)

    /// Called after each line is added (possibly with the filesystem lock held: must not block).
    public func setListener(_ f: (@Sendable (Record) -> Void)?) {
        listener.withLock { $0 = f.map(Listener.init) }
    }

    /// Keeps a new reservation (the sequence a restart after a crash must start from).
    private let reserve: (@Sendable (UInt64) -> Void)?
    static let reservation: UInt64 = 1024
    /// The highest first sequence number taken as it is.
    public static let highest = UInt64.max / 2
    /// Serial, so reservations are kept in the order made.
    private let reserveQueue = DispatchQueue(label: "nimbus.events-reserve")

    /// `reserve` is called, off the caller's thread, when the numbers promised run low; the
    /// owner keeps `firstSequence + reservation` itself before the first line (at start).
    public init(firstSequence: UInt64 = 1, capacity: Int = 1 << 20, reserve: (@Sendable (UInt64) -> Void)? = nil) {
        self.capacity = capacity
        self.reserve = reserve
        // A number no run can reach (a damaged state directory) must not trap the mount.
        let first = min(firstSequence, Self.highest)
        state = Mutex(State(seq: first, reserved: first + Self.reservation))
    }

    /// The sequence number the next line will get.
    public var nextSequence: UInt64 { state.withLock { $0.seq } }

    /// Bytes written so far (the file's size).
    public var size: Int64 { state.withLock { $0.base + Int64($0.buffer.count) } }

    /// Writes one line. With `coalesce`, a line that repeats the previous one's path and origin
    /// within a second, where the previous kind is one of `coalesce`, is not written (a save
    /// through a shell redirect flushes twice; the first write after a create is part of it).
    public func append(_ kind: EventKind, origin: EventOrigin, path: String, to: String? = nil, detail: String? = nil,
                       coalesce: Set<EventKind> = []) {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        let now = ContinuousClock.now
        var renewed: UInt64?
        let seq: UInt64? = state.withLock { s in
            if !coalesce.isEmpty, let last = s.last, last.path == path, last.origin == origin,
               coalesce.contains(last.kind), now - last.at < .seconds(1) {
                return nil
            }
            // Half the reservation left: the next one is kept long before it is needed.
            if s.seq + Self.reservation / 2 >= s.reserved {
                s.reserved = s.seq + Self.reservation
                renewed = s.reserved
            }
            let seq = s.seq
            s.last = (kind, origin, path, now)
            s.lines.append(LineInfo(start: s.base + Int64(s.buffer.count), path: path, to: to))
            // Written straight into the buffer, no String per field (`nimbus-bench events`
            // measures a line).
            Self.appendDecimal(&s.buffer, s.seq)
            s.buffer.append(UInt8(ascii: " "))
            Self.appendTime(&s, ts)
            s.buffer.append(UInt8(ascii: " "))
            s.buffer.append(contentsOf: kind.rawValue.utf8)
            s.buffer.append(UInt8(ascii: " "))
            s.buffer.append(contentsOf: origin.rawValue.utf8)
            s.buffer.append(UInt8(ascii: " "))
            Self.appendEscaped(&s.buffer, path)
            if let to {
                s.buffer.append(contentsOf: " -> ".utf8)
                Self.appendEscaped(&s.buffer, to)
            }
            if let detail {
                s.buffer.append(UInt8(ascii: " "))
                s.buffer.append(contentsOf: detail.utf8)
            }
            s.buffer.append(UInt8(ascii: "\n"))
            s.seq += 1
            if s.buffer.count - s.oldest > capacity {
                // Whole lines leave the front: the oldest kept line moves on at once, the bytes
                // are dropped in bulk (a removeFirst of the whole buffer per line was quadratic:
                // a first sync of 20,000 items spent 70% of its time moving this buffer).
                var cut = s.buffer.count - capacity
                while cut < s.buffer.count, s.buffer[cut - 1] != UInt8(ascii: "\n") { cut += 1 }
                s.oldest = cut
                let oldestStart = s.base + Int64(cut)
                while s.firstLine < s.lines.count, s.lines[s.firstLine].start < oldestStart { s.firstLine += 1 }
                if s.oldest >= capacity / 4 {
                    s.buffer.removeFirst(s.oldest)
                    s.base += Int64(s.oldest)
                    s.oldest = 0
                    s.lines.removeFirst(s.firstLine)
                    s.firstLine = 0
                }
            }
            return seq
        }
        if let renewed, let reserve { reserveQueue.async { reserve(renewed) } }
        if let seq, let l = listener.withLock({ $0 }) {
            l.f(Record(seq: seq, kind: kind, origin: origin, path: path, to: to, detail: detail))
        }
    }

    /// Bytes at stream offset `offset`; an offset older than what is kept reads from the oldest
    /// line kept.
    public func read(offset: Int64, size: Int) -> [UInt8] {
        state.withLock { s in
            guard offset >= 0, size > 0 else { return [] }
            let start = offset < s.base ? s.oldest : Int(min(offset - s.base, Int64(s.buffer.count)))
            let from = max(s.oldest, start)
            guard from < s.buffer.count else { return [] }
            return Array(s.buffer[from..<(from + min(size, s.buffer.count - from))])
        }
    }

    /// Reads for someone who may see only the lines `visible` accepts (called with the paths a
    /// line names, outside this log's lock). The reader's offsets count only the bytes it was
    /// given: reading on from where the last read ended continues the stream line by line; a
    /// read elsewhere (a seek) starts at the first line kept at or after that stream offset.
    public func readFiltered(_ cursor: inout FilteredCursor, offset: Int64, size: Int,
                             visible: ([String]) -> Bool) -> [UInt8] {
        if offset != cursor.offset {
            cursor = FilteredCursor()
            cursor.offset = offset
            cursor.stream = max(0, offset)
        }
        var out = cursor.pending
        while out.count < size {
            let batch = lines(from: cursor.stream, bytes: max(size, 16 * 1024))
            if batch.isEmpty { break }
            for l in batch {
                if visible(l.paths) { out += l.bytes }
                cursor.stream = l.end
            }
        }
        let given = Array(out.prefix(size))
        cursor.pending = Array(out.dropFirst(given.count))
        cursor.offset += Int64(given.count)
        return given
    }

    /// Whole lines kept that start at or after stream offset `from` (from the oldest kept when
    /// `from` is older), about `bytes` of them, with the paths each names.
    func lines(from: Int64, bytes: Int) -> [(end: Int64, bytes: [UInt8], paths: [String])] {
        state.withLock { s in
            var lo = s.firstLine, hi = s.lines.count
            while lo < hi {
                let mid = (lo + hi) / 2
                if s.lines[mid].start < from { lo = mid + 1 } else { hi = mid }
            }
            let total = s.base + Int64(s.buffer.count)
            var out: [(end: Int64, bytes: [UInt8], paths: [String])] = []
            var taken = 0
            var i = lo
            while i < s.lines.count, taken < bytes {
                let start = s.lines[i].start
                let end = i + 1 < s.lines.count ? s.lines[i + 1].start : total
                let a = Int(start - s.base), b = Int(end - s.base)
                out.append((end, Array(s.buffer[a..<b]), s.lines[i].paths))
                taken += b - a
                i += 1
            }
            return out
        }
    }

    /// Paths are written as they are, except for these escapes, so that one event is one line,
    /// " -> " always separates a move's two paths, and a name cannot send a terminal escape
    /// sequence to whoever reads the log: `\` → `\\`, newline → `\n`, any other control
    /// character (U+0000–U+001F, U+007F) → `\xHH`, and the `>` of a `->` inside a name → `\>`.
    /// (By scalars: CR LF is one `Character`, and must not hide its newline.)
    public static func escape(_ p: String) -> String {
        var out = String.UnicodeScalarView()
        var previous: Unicode.Scalar = " "
        for c in p.unicodeScalars {
            switch c {
            case "\\": out.append(contentsOf: "\\\\".unicodeScalars)
            case "\n": out.append(contentsOf: "\\n".unicodeScalars)
            case ">" where previous == "-": out.append(contentsOf: "\\>".unicodeScalars)
            case _ where c.value < 0x20 || c.value == 0x7F:
                let hex = String(c.value, radix: 16, uppercase: true)
                out.append(contentsOf: ("\\x" + (hex.count < 2 ? "0" + hex : hex)).unicodeScalars)
            default: out.append(c)
            }
            previous = c
        }
        return String(out)
    }

    /// `p` as `escape` writes it; a path with nothing to escape (almost all) is copied as it is.
    static func appendEscaped(_ buffer: inout [UInt8], _ p: String) {
        // Only these bytes start an escape (`>` when after `-`); UTF-8's multi-byte sequences
        // never contain them.
        let plain = p.utf8.allSatisfy { b in b >= 0x20 && b != 0x7F && b != UInt8(ascii: "\\") && b != UInt8(ascii: ">") }
        if plain { buffer.append(contentsOf: p.utf8) } else { buffer.append(contentsOf: escape(p).utf8) }
    }

    static func appendDecimal(_ buffer: inout [UInt8], _ v: UInt64) {
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var n = 0, v = v
        withUnsafeMutableBytes(of: &digits) { d in
            repeat {
                d[19 - n] = UInt8(ascii: "0") + UInt8(v % 10)
                v /= 10
                n += 1
            } while v > 0
            buffer.append(contentsOf: d[(20 - n)...])
        }
    }

    /// `ts` as UTC with milliseconds (`time(_:)`'s text), the part up to the seconds reused
    /// within a second.
    static func appendTime(_ s: inout State, _ ts: timespec) {
        if ts.tv_sec != s.second {
            s.second = ts.tv_sec
            let text = time(ts)
            s.secondText = Array(text.utf8.prefix(20))
        }
        s.buffer.append(contentsOf: s.secondText)
        let ms = ts.tv_nsec / 1_000_000
        s.buffer.append(UInt8(ascii: "0") + UInt8(ms / 100))
        s.buffer.append(UInt8(ascii: "0") + UInt8(ms / 10 % 10))
        s.buffer.append(UInt8(ascii: "0") + UInt8(ms % 10))
        s.buffer.append(UInt8(ascii: "Z"))
    }

    static func time(_ ts: timespec) -> String {
        var tm = tm()
        var t = ts.tv_sec
        gmtime_r(&t, &tm)
        func digits(_ v: Int, _ n: Int) -> String {
            let s = String(v)
            return s.count >= n ? s : String(repeating: "0", count: n - s.count) + s
        }
        return digits(Int(tm.tm_year) + 1900, 4) + "-" + digits(Int(tm.tm_mon) + 1, 2) + "-" + digits(Int(tm.tm_mday), 2)
            + "T" + digits(Int(tm.tm_hour), 2) + ":" + digits(Int(tm.tm_min), 2) + ":" + digits(Int(tm.tm_sec), 2)
            + "." + digits(ts.tv_nsec / 1_000_000, 3) + "Z"
    }
}
