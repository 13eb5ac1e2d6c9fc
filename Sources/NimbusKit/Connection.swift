// NimbusKit: the client side of a mount's presenter socket (docs/presenters.md).
import Dispatch
import Foundation
import PresenterProtocol
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Where a path lives: the mount root, its presenter socket (nil: `presenter-socket: none`), and
/// the container path (`/` for the root).
struct MountLocation {
    let root: String
    let socket: String?
    let containerPath: String

    /// Walks up from `path` to the directory that has `.nimbus/status` (found by name: `.nimbus`
    /// is never listed), then through symlinks if that found nothing. Nil outside a mount.
    static func find(_ path: String) -> MountLocation? {
        let url = URL(fileURLWithPath: path)
        return search(url.standardizedFileURL.path) ?? search(url.resolvingSymlinksInPath().path)
    }

    private static func search(_ full: String) -> MountLocation? {
        var dir = full  // a file or a missing item has no `.nimbus` below it: it just goes up
        while true {
            let status = (dir == "/" ? "" : dir) + "/.nimbus/status"
            if access(status, F_OK) == 0 {
                let key = "presenter-socket: "
                let line = readAll(status).split(separator: "\n").first { $0.hasPrefix(key) }
                let socket = line.map { $0.dropFirst(key.count).trimmingCharacters(in: .whitespaces) }
                let rel = full == dir ? "/" : String(full.dropFirst(dir == "/" ? 0 : dir.count))
                return MountLocation(root: dir, socket: socket == "none" || socket == "" ? nil : socket, containerPath: rel)
            }
            if dir == "/" || dir.isEmpty { return nil }
            dir = (dir as NSString).deletingLastPathComponent
        }
    }

    /// Control files report size 0 (they are generated when opened): read to the end.
    static func readAll(_ path: String) -> String {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "" }
        defer { close(fd) }
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = read(fd, &buf, buf.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            out += buf[0..<n]
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// One connection to one mount's daemon, shared by every presenter and coordinator of this
/// process in that mount, made on first use and again after it dropped (presenting the
/// registered presenters again). A reader thread takes the daemon's lines: replies wake the
/// waiting request; asks and events go to the presenter's own queue.
final class MountConnection: Sendable {
    struct Entry {
        weak var presenter: (any FilePresenter)?
        var path: String
        /// Reacquirers of answered relinquish asks, run in order as `reacquire` events come.
        var reacquirers: [@Sendable () -> Void] = []
        /// Relinquish asks whose `writer` was not called yet, and `reacquire` events that came
        /// before it was (the daemon went on after its bound): those reacquirers run at once.
        var relinquishing = 0
        var earlyReacquires = 0
        /// This presenter's coordinated writes by container path: how many run, and until when
        /// their `changed` events are dropped.
        var ownWrites: [String: (running: Int, quietUntil: ContinuousClock.Instant)] = [:]
    }
    /// A request waiting for its reply: matched by op, then token and path when both have one.
    final class Pending: Sendable {
        let op: Op, token: Token?, path: String?
        let done = DispatchSemaphore(value: 0)
        let reply = Mutex<Reply?>(nil)  // set before `done` is signalled; nil: the connection dropped
        init(_ request: Request) {
            op = request.op
            switch request {
            case .present(let t, _), .unpresent(let t): (token, path) = (t, nil)
            case .willWrite(_, let p), .didWrite(_, let p): (token, path) = (nil, p)
            case .hello, .ack: (token, path) = (nil, nil)
            }
        }
    }
    struct State {
        var fd: Int32 = -1
        var ready = false  // hello answered on `fd`
        var pending: [Pending] = []
        var entries: [Token: Entry] = [:]
    }

    let root: String
    let socket: String
    private let state = Mutex(State())
    private let connecting = Mutex(())  // held while (re)connecting: hello and presenting again
    private let sendLock = Mutex(())  // one line at a time on the socket

    init(root: String, socket: String) { (self.root, self.socket) = (root, socket) }

    private var closed: CoordinationError { .unreachable(socket: socket, reason: "the connection closed (is the mount running?)") }

    // MARK: what FileCoordinator uses

    /// Connects, says hello and presents the registered presenters again, unless connected.
    func ensureConnected() throws {
        try connecting.withLock { _ in
            if state.withLock({ $0.ready }) { return }
            let s = try openSocket()
            state.withLock { $0.fd = s }
            let reader = Thread { [self] in readLoop(s) }
            reader.name = "nimbuskit \(root)"
            reader.start()
            do {
                let r = try request(.hello(pid: Int(getpid()), name: ProcessInfo.processInfo.processName))
                guard r.ok else { throw CoordinationError.refused(r.error ?? "hello was not accepted") }
            } catch {
                drop(s)
                throw error
            }
            let again = state.withLock { st -> [(Token, String)] in
                guard st.fd == s else { return [] }
                st.ready = true
                return st.entries.compactMap { $0.value.presenter == nil ? nil : ($0.key, $0.value.path) }
            }
            for (token, path) in again { _ = try? request(.present(token: token, path: path)) }
        }
    }

    func register(_ token: Token, _ p: any FilePresenter, path: String) throws {
        try ensureConnected()
        state.withLock { $0.entries[token] = Entry(presenter: p, path: path) }
        do {
            let r = try request(.present(token: token, path: path))
            guard r.ok else { throw CoordinationError.refused(r.error ?? "present was not accepted") }
        } catch {
            state.withLock { _ = $0.entries.removeValue(forKey: token) }
            throw error
        }
    }

    func unregister(_ token: Token) {
        let live = state.withLock { $0.entries.removeValue(forKey: token) != nil && $0.ready }
        if live { _ = try? request(.unpresent(token: token)) }
    }

    /// `will-write`: returns when the other presenters answered or the daemon's bound passed.
    func willWrite(token: Token, path: String, file: String, deadline: ContinuousClock.Instant, timeout: Duration) throws {
        try ensureConnected()
        ownWrite(token, path, starts: true)
        do {
            let r = try request(.willWrite(token: token, path: path),
                                within: max(deadline - .now, .milliseconds(1)), late: .timedOut(path: file, seconds: timeout.seconds))
            guard r.ok else { throw CoordinationError.refused(r.error ?? "will-write was not accepted") }
        } catch {
            ownWrite(token, path, starts: false, quiet: .zero)
            throw error
        }
    }

    /// `did-write`: the other presenters reacquire; the writer's own `changed` events of the
    /// next 2 s are dropped.
    func didWrite(token: Token, path: String) {
        _ = try? request(.didWrite(token: token, path: path))
        ownWrite(token, path, starts: false, quiet: .seconds(2))
    }

    private func ownWrite(_ token: Token, _ path: String, starts: Bool, quiet: Duration = .zero) {
        guard token != 0 else { return }
        state.withLock { st in
            guard var e = st.entries[token] else { return }
            let now = ContinuousClock.now
            var w = e.ownWrites[path] ?? (0, now)
            w.running += starts ? 1 : -1
            if !starts { w.quietUntil = max(w.quietUntil, now + quiet) }
            e.ownWrites = e.ownWrites.filter { $0.value.running > 0 || $0.value.quietUntil > now }
            if w.running > 0 || w.quietUntil > now { e.ownWrites[path] = w } else { e.ownWrites[path] = nil }
            st.entries[token] = e
        }
    }

    // MARK: the socket

    private func openSocket() throws -> Int32 {
        let s = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard s >= 0 else { throw CoordinationError.unreachable(socket: socket, reason: String(cString: strerror(errno))) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let path = Array(socket.utf8)
        guard path.count < MemoryLayout.size(ofValue: addr.sun_path) else {
            close(s)
            throw CoordinationError.unreachable(socket: socket, reason: "the path is too long for a socket")
        }
        withUnsafeMutableBytes(of: &addr.sun_path) { raw in
            for (i, b) in path.enumerated() { raw[i] = b }
            raw[path.count] = 0
        }
        let rc = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(s, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0 else {
            let reason = String(cString: strerror(errno))
            close(s)
            throw CoordinationError.unreachable(socket: socket, reason: reason + " (is the mount running?)")
        }
        var tv = timeval(tv_sec: 5, tv_usec: 0)  // a daemon that stops reading cannot block a writer for long
        setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        return s
    }

    /// Sends one message and waits (at most `within`) for its reply; `late` is thrown on timeout.
    private func request(_ message: Request, within: Duration = .seconds(5), late: CoordinationError? = nil) throws -> Reply {
        let p = Pending(message)
        let s = state.withLock { st in
            if st.fd >= 0 { st.pending.append(p) }
            return st.fd
        }
        guard s >= 0 else { throw closed }
        guard write(message, on: s) else {
            forget(p)
            drop(s)
            throw closed
        }
        if p.done.wait(timeout: .now() + within.seconds) == .timedOut {
            forget(p)
            throw late ?? .unreachable(socket: socket, reason: "no answer to \(message.op.rawValue) within \(CoordinationError.text(within.seconds)) s")
        }
        guard let reply = p.reply.withLock({ $0 }) else { throw closed }
        return reply
    }

    private func forget(_ p: Pending) { state.withLock { $0.pending.removeAll { $0 === p } } }

    /// Sends without waiting (acks, unpresenting a presenter that is gone).
    private func send(_ message: Request) {
        let s = state.withLock { $0.fd }
        if s >= 0, !write(message, on: s) { drop(s) }
    }

    private func write(_ message: Request, on s: Int32) -> Bool {
        guard let bytes = PresenterLine.encode(message) else { return false }
        return sendLock.withLock { _ in
            var off = 0
            while off < bytes.count {
                let n = bytes.withUnsafeBytes { Glibc.send(s, $0.baseAddress! + off, $0.count - off, Int32(MSG_NOSIGNAL)) }
                if n < 0 {
                    if errno == EINTR { continue }
                    return false
                }
                off += n
            }
            return true
        }
    }

    /// The connection is gone: waiting requests fail, relinquished presenters reacquire (their
    /// `reacquire` event cannot come any more), and the next use reconnects.
    private func drop(_ s: Int32) {
        let (waiting, reacquire) = state.withLock { st -> ([Pending], [(any FilePresenter, [@Sendable () -> Void])]) in
            guard s >= 0, st.fd == s else { return ([], []) }
            st.fd = -1
            st.ready = false
            defer { st.pending = [] }
            var runs: [(any FilePresenter, [@Sendable () -> Void])] = []
            for (token, var e) in st.entries {
                if let p = e.presenter, !e.reacquirers.isEmpty { runs.append((p, e.reacquirers)) }
                e.reacquirers = []
                e.earlyReacquires = e.relinquishing
                st.entries[token] = e
            }
            return (st.pending, runs)
        }
        shutdown(s, Int32(SHUT_RDWR))  // the reader sees the end and closes `s`
        for p in waiting { p.done.signal() }
        for (p, blocks) in reacquire {
            let queue = p.presentedItemOperationQueue
            for b in blocks { queue.async(execute: b) }
        }
    }

    private func readLoop(_ s: Int32) {
        var buffer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 8192)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(s, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            buffer += chunk[0..<n]
            while let nl = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = buffer[..<nl]
                // A line that is not a JSON object is skipped, like one this client does not know.
                if let m = DaemonMessage.decode(line: line) { dispatch(m) }
                buffer.removeSubrange(...nl)
            }
            if buffer.count > PresenterLine.maxLength { break }  // not a daemon speaking this protocol
        }
        drop(s)
        close(s)
    }

    // MARK: the daemon's lines

    private func dispatch(_ m: DaemonMessage) {
        switch m {
        case .reply(let reply): answer(reply)
        case .ask(let ask): handle(ask)
        case .event(let event): handle(event)
        case .other(let ask?): send(.ack(ask, error: nil))  // an ask this client does not know: go ahead
        case .other(nil): break  // a newer daemon's news
        }
    }

    private func answer(_ reply: Reply) {
        func fits(_ p: Pending) -> Bool {
            p.op.rawValue == reply.re && (reply.token == nil || p.token == nil || p.token == reply.token)
                && (reply.path == nil || p.path == nil || p.path == reply.path)
        }
        let p = state.withLock { st -> Pending? in
            guard let i = st.pending.firstIndex(where: fits) ?? st.pending.firstIndex(where: { $0.op.rawValue == reply.re }) else { return nil }
            return st.pending.remove(at: i)
        }
        p?.reply.withLock { $0 = reply }
        p?.done.signal()
    }

    /// The live presenter of `token`; a token whose presenter is gone is unpresented.
    private func presenter(_ token: Token) -> (any FilePresenter)? {
        let (presenter, stale) = state.withLock { st -> ((any FilePresenter)?, Bool) in
            guard let e = st.entries[token] else { return (nil, false) }
            if e.presenter == nil { st.entries[token] = nil }
            return (e.presenter, e.presenter == nil)
        }
        if stale { send(.unpresent(token: token)) }
        return presenter
    }

    private func handle(_ ask: Ask) {
        guard let presenter = presenter(ask.token) else { return send(.ack(ask.id, error: nil)) }  // nobody to ask any more
        let queue = presenter.presentedItemOperationQueue
        let token = ask.token
        switch ask.what {
        case .save:
            queue.async { [self] in
                do {
                    try presenter.savePresentedItemChanges()
                    send(.ack(ask.id, error: nil))
                } catch {
                    send(.ack(ask.id, error: "\(error)"))
                }
            }
        case .relinquish:
            state.withLock { $0.entries[token]?.relinquishing += 1 }
            queue.async { [self] in
                let once = Once()
                presenter.relinquishPresentedItem { [self] reacquirer in
                    guard once.first() else { return }
                    let now = state.withLock { st -> Bool in
                        guard var e = st.entries[token] else { return false }
                        defer { st.entries[token] = e }
                        e.relinquishing = max(0, e.relinquishing - 1)
                        if e.earlyReacquires > 0 {
                            e.earlyReacquires -= 1
                            return true
                        }
                        if let reacquirer { e.reacquirers.append(reacquirer) }
                        return false
                    }
                    send(.ack(ask.id, error: nil))
                    if now, let reacquirer { queue.async(execute: reacquirer) }
                }
            }
        }
    }

    private func handle(_ event: Event) {
        guard let presenter = presenter(event.token) else { return }
        let queue = presenter.presentedItemOperationQueue
        let token = event.token
        switch event.change {
        case .reacquire:
            let r = state.withLock { st -> (@Sendable () -> Void)? in
                guard var e = st.entries[token] else { return nil }
                defer { st.entries[token] = e }
                if !e.reacquirers.isEmpty { return e.reacquirers.removeFirst() }
                if e.relinquishing > e.earlyReacquires { e.earlyReacquires += 1 }
                return nil
            }
            if let r { queue.async(execute: r) }
        case .changed(_, let to, _):
            let own = state.withLock { st -> Bool in
                guard let e = st.entries[token] else { return true }
                let now = ContinuousClock.now
                return e.ownWrites.contains { written, w in
                    (w.running > 0 || now < w.quietUntil) && (written == e.path || written == event.path || written == to)
                }
            }
            if !own { queue.async { presenter.presentedItemDidChange() } }
        case .moved(let to, _):
            state.withLock { $0.entries[token]?.path = to }
            let url = URL(fileURLWithPath: to == "/" ? root : (root == "/" ? "" : root) + to)
            queue.async { presenter.presentedItemDidMove(to: url) }
        case .deleted:
            state.withLock { _ = $0.entries.removeValue(forKey: token) }
            FileCoordinator.forget(token: token, on: self)
            queue.async { presenter.accommodatePresentedItemDeletion() }
        case .version(let v, _):
            queue.async { presenter.presentedItemDidGain(version: v) }
        case .conflict:
            queue.async { presenter.presentedItemDidConflict() }
        }
    }
}

/// True exactly once: a `writer` called twice acks once.
final class Once: Sendable {
    private let done = Atomic(false)
    func first() -> Bool { done.compareExchange(expected: false, desired: true, ordering: .relaxed).exchanged }
}
