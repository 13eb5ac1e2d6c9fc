import Foundation
import Glibc
import PresenterProtocol
import Synchronization

/// Presenters over the daemon's local socket (docs/presenters.md): programs register paths they
/// present; the sync engine asks them to save before an upload and to relinquish before a
/// remote version replaces or deletes the file; every event of `.nimbus/events` that touches a
/// presented path is forwarded.
///
/// Never a deadlock, never a hang: asks go to all presenters of a path at once and end after
/// `timeout` whatever they answered; answers are handled on the connection's reader thread,
/// which never waits for anything but its socket; events go out on one serial queue and a
/// connection that does not take its bytes within a second (`SO_SNDTIMEO`) is dropped.
///
/// Every line a client sends gets read as a `Request` (PresenterProtocol); a line that is not
/// one is answered with an error reply naming what is wrong, and the connection stays open. Only
/// a line longer than `PresenterLine.maxLength` closes it.
public final class PresenterHub: Sendable {
    public typealias AskKind = PresenterProtocol.AskKind

    /// One presentation: a connection and the client's token for it.
    public struct Key: Hashable, Sendable {
        let conn: Int
        let token: Token
    }

    /// The end of an ask: who was asked, how many did not answer in time.
    public struct Outcome: Sendable {
        public let asked: [Key]
        public let late: Int
    }

    final class Conn: @unchecked Sendable {
        // @unchecked: `fd` is immutable; sends are serialized by `writeLock`.
        let id: Int
        let fd: Int32
        private let writeLock = NSLock()
        init(id: Int, fd: Int32) { self.id = id; self.fd = fd }

        /// One line; false when the peer is gone or does not read.
        func send(_ message: DaemonMessage) -> Bool {
            guard let bytes = PresenterLine.encode(message) else { return false }
            writeLock.lock()
            defer { writeLock.unlock() }
            var off = 0
            while off < bytes.count {
                let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
                if n < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                off += n
            }
            return true
        }
    }

    struct Batch {
        var waiting: Set<AskID>  // not answered yet
        var asked: [Key]
        var done: (@Sendable (Outcome) -> Void)?
    }

    struct State {
        var conns: [Int: Conn] = [:]
        var clients: [Int: String] = [:]  // conn → "pid 42 (editor)"
        var presentations: [Key: String] = [:]
        var asks: [AskID: (batch: Int, conn: Int)] = [:]
        var batches: [Int: Batch] = [:]
        var writes: [String: [Key]] = [:]  // "conn path" of a coordinated write → presenters asked
        var nextID = 1
        var timeouts = 0
        var listenFD: Int32 = -1
        var socketPath: String?
        var stopped = false
    }

    private let state = Mutex(State())
    private let events = DispatchQueue(label: "nimbus.presenters.events")
    public let timeout: Duration

    public init(timeout: Duration = .seconds(2)) {
        self.timeout = timeout
    }

    // MARK: the socket

    /// Listens at `path` (mode 0600). Throws with a message saying what to do.
    public func listen(at path: String) throws {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HubError("cannot create the presenter socket: \(String(cString: strerror(errno)))") }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let capacity = MemoryLayout.size(ofValue: addr.sun_path)
        guard path.utf8.count < capacity else {
            close(fd)
            throw HubError("the presenter socket path \(path) is longer than \(capacity - 1) bytes; use a shorter --state directory")
        }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            for (i, b) in path.utf8.enumerated() { raw[i] = b }
            raw[path.utf8.count] = 0
        }
        unlink(path)  // a socket left by a daemon that was killed (we hold the state lock)
        let bound = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0, chmod(path, 0o600) == 0, Glibc.listen(fd, 64) == 0 else {
            let e = String(cString: strerror(errno))
            close(fd)
            throw HubError("cannot listen on the presenter socket \(path): \(e)")
        }
        state.withLock { s in s.listenFD = fd; s.socketPath = path }
        let t = Thread { [self] in acceptLoop(fd) }
        t.name = "nimbus presenters"
        t.start()
    }

    /// Stops listening and drops every connection.
    public func stop() {
        let (fd, path, conns) = state.withLock { s in
            s.stopped = true
            defer { s.listenFD = -1 }
            return (s.listenFD, s.socketPath, Array(s.conns.values))
        }
        if fd >= 0 { shutdown(fd, Int32(SHUT_RDWR)); close(fd) }
        if let path { unlink(path) }
        for c in conns { shutdown(c.fd, Int32(SHUT_RDWR)) }
    }

    public var socketPath: String? { state.withLock { $0.socketPath } }

    /// `.nimbus/status` lines.
    public func statusLines() -> [(String, String)] {
        state.withLock { s in
            [("presenter-socket", s.socketPath ?? "none"), ("presenters", "\(s.presentations.count)"),
             ("presenter-timeouts", "\(s.timeouts)")]
        }
    }

    /// Presented paths (escaped as in `.nimbus/events`: a name with a newline stays on its line)
    /// with their clients, for `.nimbus/claims`.
    public func presentationLines() -> [String] {
        state.withLock { s in
            s.presentations.sorted { $0.value < $1.value }.map { k, p in "presenting \(EventLog.escape(p)) by \(s.clients[k.conn] ?? "connection \(k.conn)")" }
        }
    }

    private func acceptLoop(_ listenFD: Int32) {
        while true {
            let fd = accept(listenFD, nil, nil)
            if fd < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                return  // closed by stop()
            }
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            var tv = timeval(tv_sec: 1, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            let conn: Conn? = state.withLock { s in
                guard !s.stopped else { return nil }
                let c = Conn(id: s.nextID, fd: fd)
                s.nextID += 1
                s.conns[c.id] = c
                return c
            }
            guard let conn else { close(fd); return }
            let t = Thread { [self] in readLoop(conn) }
            t.name = "nimbus presenter \(conn.id)"
            t.start()
        }
    }

    private func readLoop(_ conn: Conn) {
        var pending: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 8192)
        reading: while true {
            let n = chunk.withUnsafeMutableBytes { recv(conn.fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            pending += chunk[0..<n]
            while let nl = pending.firstIndex(of: UInt8(ascii: "\n")) {
                let line = Array(pending[..<nl])
                pending.removeSubrange(...nl)
                if !handle(line, conn) { break reading }
            }
            if pending.count > PresenterLine.maxLength {
                _ = conn.send(.reply(.failed(Reply.noOp, "a line longer than 1 MiB; closing")))
                break
            }
        }
        drop(conn)
        close(conn.fd)
    }

    /// Forgets a connection: its presentations end, asks waiting for it count as answered.
    private func drop(_ conn: Conn) {
        let finished: [(Batch, Int)] = state.withLock { s in
            s.conns[conn.id] = nil
            s.clients[conn.id] = nil
            for k in s.presentations.keys where k.conn == conn.id { s.presentations[k] = nil }
            var out: [(Batch, Int)] = []
            for (ask, a) in s.asks where a.conn == conn.id {
                s.asks[ask] = nil
                if let r = answered(ask, batch: a.batch, &s) { out.append(r) }
            }
            return out
        }
        for (b, late) in finished { b.done?(Outcome(asked: b.asked, late: late)) }
    }

    /// Marks `ask` answered; returns the batch when it was the last one.
    private func answered(_ ask: AskID, batch: Int, _ s: inout State) -> (Batch, Int)? {
        guard var b = s.batches[batch] else { return nil }
        b.waiting.remove(ask)
        if b.waiting.isEmpty {
            s.batches[batch] = nil
            return (b, 0)
        }
        s.batches[batch] = b
        return nil
    }

    /// One client line; false closes the connection (only when the reply cannot be sent).
    private func handle(_ line: [UInt8], _ conn: Conn) -> Bool {
        let decoded = Request.decode(line: line)
        let op: String? = switch decoded {
        case .success(let r): r.op.rawValue
        case .failure(let e): e.op
        }
        if let op, op != Op.hello.rawValue, state.withLock({ $0.clients[conn.id] == nil }) {
            return conn.send(.reply(.failed(op, "send hello first")))
        }
        let request: Request
        switch decoded {
        case .success(let r): request = r
        case .failure(let e): return conn.send(.reply(e.reply))
        }
        switch request {
        case .hello(_, let pid, let name):
            let label = "pid \(pid.map { "\($0)" } ?? "?") (\(Self.label(name ?? "?")))"
            state.withLock { $0.clients[conn.id] = label }
            return conn.send(.reply(.hello()))
        case .present(let token, let path):
            guard let path = Self.normalize(path) else {
                return conn.send(.reply(.failed(Op.present.rawValue, token: token, Self.notAContainerPath)))
            }
            state.withLock { $0.presentations[Key(conn: conn.id, token: token)] = path }
            return conn.send(.reply(.ok(.present, token: token)))
        case .unpresent(let token):
            state.withLock { _ = $0.presentations.removeValue(forKey: Key(conn: conn.id, token: token)) }
            return conn.send(.reply(.ok(.unpresent, token: token)))
        case .ack(let ask, _):
            let finished: (Batch, Int)? = state.withLock { s in
                guard let a = s.asks[ask], a.conn == conn.id else { return nil }
                s.asks[ask] = nil
                return answered(ask, batch: a.batch, &s)
            }
            if let (b, late) = finished { b.done?(Outcome(asked: b.asked, late: late)) }
            return true
        case .willWrite(let token, let path):
            guard let path = Self.normalize(path) else {
                return conn.send(.reply(.failed(Op.willWrite.rawValue, Self.notAContainerPath)))
            }
            // Answered when the others relinquished (or the bound passed); this thread goes on
            // reading, so acks on this same connection are never stuck behind the wait.
            ask(.relinquish(.write), paths: [path], excluding: Key(conn: conn.id, token: token)) { [self] outcome in
                state.withLock { $0.writes["\(conn.id) \(path)", default: []] += outcome.asked }
                _ = conn.send(.reply(.willWrite(path: path, late: outcome.late)))
            }
            return true
        case .didWrite(_, let path):
            guard let path = Self.normalize(path) else {
                return conn.send(.reply(.failed(Op.didWrite.rawValue, Self.notAContainerPath)))
            }
            let asked = state.withLock { $0.writes.removeValue(forKey: "\(conn.id) \(path)") } ?? []
            reacquire(asked, path: path)
            return conn.send(.reply(.ok(.didWrite, path: path)))
        }
    }

    static let notAContainerPath = "path must be a container path like /docs/a.txt"

    /// A client's name as `.nimbus/claims` shows it: one line, at most 100 characters.
    static func label(_ name: String) -> String {
        String(String.UnicodeScalarView(name.unicodeScalars.prefix(100).map { $0.properties.generalCategory == .control ? "?" : $0 }))
    }

    /// "/a//b/" → "/a/b"; nil for relative paths and `.`/`..` components.
    static func normalize(_ p: String) -> String? {
        guard p.hasPrefix("/") else { return nil }
        let parts = p.split(separator: "/")
        guard !parts.contains(where: { $0 == "." || $0 == ".." }) else { return nil }
        return "/" + parts.joined(separator: "/")
    }

    static func covers(_ presented: String, _ path: String) -> Bool {
        presented == path || presented == "/" || path.hasPrefix(presented + "/")
    }

    // MARK: asks

    public var isEmpty: Bool { state.withLock { $0.presentations.isEmpty } }

    /// Asks every presenter of `paths` (or of a folder above them) at once; `done` runs when all
    /// answered, or after `timeout` with the number that did not.
    public func ask(_ what: Ask.What, paths: [String], excluding: Key? = nil,
                    done: @escaping @Sendable (Outcome) -> Void) {
        var sends: [(Conn, Ask)] = []
        let batchID: Int? = state.withLock { s in
            var waiting = Set<AskID>()
            var asked: [Key] = []
            for (key, presented) in s.presentations where key != excluding {
                guard let path = paths.first(where: { Self.covers(presented, $0) }), let conn = s.conns[key.conn] else { continue }
                let id = AskID(s.nextID)
                s.nextID += 1
                waiting.insert(id)
                asked.append(key)
                sends.append((conn, Ask(id: id, token: key.token, path: path, what: what)))
            }
            guard !waiting.isEmpty else { return nil }
            let batch = s.nextID
            s.nextID += 1
            for (conn, ask) in sends { s.asks[ask.id] = (batch, conn.id) }
            s.batches[batch] = Batch(waiting: waiting, asked: asked, done: done)
            return batch
        }
        guard let batchID else { return done(Outcome(asked: [], late: 0)) }
        for (conn, ask) in sends where !conn.send(.ask(ask)) {
            shutdown(conn.fd, Int32(SHUT_RDWR))  // its reader drops it, which answers for it
        }
        let ns = timeout.components.seconds * 1_000_000_000 + timeout.components.attoseconds / 1_000_000_000
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(Int(ns))) { [self] in
            let expired: Batch? = state.withLock { s in
                guard let b = s.batches.removeValue(forKey: batchID) else { return nil }
                for ask in b.waiting { s.asks[ask] = nil }
                s.timeouts += b.waiting.count
                return b
            }
            if let expired { expired.done?(Outcome(asked: expired.asked, late: expired.waiting.count)) }
        }
    }

    /// `reason`: why a relinquish ask is made (another version replaces the file, or a delete).
    public func ask(_ kind: AskKind, paths: [String], reason: RelinquishReason? = nil) async -> Outcome {
        if isEmpty { return Outcome(asked: [], late: 0) }
        let what: Ask.What = switch kind {
        case .save: .save
        case .relinquish: .relinquish(reason)
        }
        return await withCheckedContinuation { c in ask(what, paths: paths) { c.resume(returning: $0) } }
    }

    /// Tells presenters that relinquished that they may take the file back.
    public func reacquire(_ keys: [Key], path: String) {
        let targets: [(Conn, Key, String)] = state.withLock { s in
            keys.compactMap { k in
                guard let c = s.conns[k.conn], let p = s.presentations[k] else { return nil }
                return (c, k, Self.covers(p, path) ? path : p)
            }
        }
        for (c, k, p) in targets { _ = c.send(.event(Event(token: k.token, path: p, change: .reacquire))) }
    }

    // MARK: events

    /// Forwards one `.nimbus/events` line to the presenters it concerns (EventLog's listener).
    public func event(_ r: EventLog.Record) {
        if isEmpty { return }
        events.async { [self] in deliver(r) }
    }

    private func deliver(_ r: EventLog.Record) {
        var sends: [(Conn, Event)] = []
        let origin = Origin(r.origin)
        state.withLock { s in
            for (key, presented) in s.presentations {
                guard let conn = s.conns[key.conn] else { continue }
                func send(_ path: String, _ change: Event.Change) {
                    sends.append((conn, Event(token: key.token, path: path, change: change)))
                }
                switch r.kind {
                case .moved:
                    guard let to = r.to else { continue }
                    if Self.covers(r.path, presented) {
                        // The presented item (or a folder above it) moved: the presentation follows.
                        let now = to + presented.dropFirst(r.path.count)
                        s.presentations[key] = now
                        send(presented, .moved(to: now, seq: r.seq))
                    } else if Self.covers(presented, r.path) || Self.covers(presented, to) {
                        send(r.path, .changed(origin: origin, to: to, seq: r.seq))
                    }
                case .deleted:
                    if Self.covers(r.path, presented) {
                        s.presentations[key] = nil
                        send(presented, .deleted(seq: r.seq))
                    } else if Self.covers(presented, r.path) {
                        send(r.path, .changed(origin: origin, to: nil, seq: r.seq))
                    }
                case .created, .changed, .attributes, .exchanged:
                    if Self.covers(presented, r.path) || r.to.map({ Self.covers(presented, $0) }) == true {
                        send(r.path, .changed(origin: origin, to: nil, seq: r.seq))
                    }
                case .version:
                    if Self.covers(presented, r.path) {
                        let v = Int(r.detail?.dropFirst() ?? "") ?? 0
                        send(r.path, .version(v, seq: r.seq))
                        send(r.path, .changed(origin: origin, to: nil, seq: r.seq))
                    }
                case .conflict:
                    if Self.covers(presented, r.path) { send(r.path, .conflict(seq: r.seq)) }
                default:
                    continue
                }
            }
        }
        for (conn, event) in sends where !conn.send(.event(event)) {
            shutdown(conn.fd, Int32(SHUT_RDWR))
        }
    }
}

extension Origin {
    init(_ origin: EventOrigin) {
        switch origin {
        case .local: self = .local
        case .remote: self = .remote
        case .sync: self = .sync
        }
    }
}

struct HubError: Error, CustomStringConvertible {
    let description: String
    init(_ d: String) { description = d }
}
