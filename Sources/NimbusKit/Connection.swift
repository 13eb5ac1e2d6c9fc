import Dispatch
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Where a path lives: the mount root, its presenter socket, and the container path.
struct MountLocation {
    let root: String
    let socket: String
    let containerPath: String

    /// Walks up from `path` to the directory that has `.nimbus/status` (found by name: `.nimbus`
    /// is never listed). Nil outside a mount.
    static func find(_ path: String) -> MountLocation? {
        let full = URL(fileURLWithPath: path).standardizedFileURL.path
        var isDir: ObjCBool = false
        var dir = FileManager.default.fileExists(atPath: full, isDirectory: &isDir) && isDir.boolValue
            ? full : (full as NSString).deletingLastPathComponent
        while true {
            if access(dir + "/.nimbus/status", F_OK) == 0 {
                guard let text = readAll(dir + "/.nimbus/status") else { return nil }
                let line = text.split(separator: "\n").first { $0.hasPrefix("presenter-socket: ") }
                guard let socket = line.map({ String($0.dropFirst("presenter-socket: ".count)) }), socket != "none" else { return nil }
                let rel = full == dir ? "/" : String(full.dropFirst(dir == "/" ? 0 : dir.count))
                return MountLocation(root: dir, socket: socket, containerPath: rel)
            }
            if dir == "/" || dir.isEmpty { return nil }
            dir = (dir as NSString).deletingLastPathComponent
        }
    }

    /// Control files report size 0 (they are generated when opened): read to the end.
    static func readAll(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
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
/// process in that mount. A reader thread takes the daemon's lines: replies wake the waiting
/// request, asks and events go to the presenter's queue.
final class MountConnection: @unchecked Sendable {
    // @unchecked: every mutable field is guarded by `lock`.
    struct Entry {
        weak var presenter: (any FilePresenter)?
        var path: String
        var reacquirer: (@Sendable () -> Void)?
        /// Own coordinated writes under way, and until when their `changed` events are dropped.
        var writing = 0
        var quietUntil = Date.distantPast
    }

    final class Pending: @unchecked Sendable {
        // @unchecked: `reply` is written once before `done` is signalled.
        let done = DispatchSemaphore(value: 0)
        var reply: [String: Any]?
    }

    let location: MountLocation
    private let lock = NSLock()
    private let writeLock = NSLock()
    private var fd: Int32 = -1
    private var pending: [String: [Pending]] = [:]
    private(set) var entries: [Int: Entry] = [:]

    init(_ location: MountLocation) { self.location = location }

    func entry(_ token: Int) -> Entry? { lock.lock(); defer { lock.unlock() }; return entries[token] }
    func update(_ token: Int, _ f: (inout Entry) -> Void) {
        lock.lock(); defer { lock.unlock() }
        if var e = entries[token] { f(&e); entries[token] = e }
    }

    /// Connects (and re-presents what was registered) unless connected.
    func ensureConnected() throws {
        lock.lock()
        if fd >= 0 { lock.unlock(); return }
        let s = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard s >= 0 else { lock.unlock(); throw CoordinationError.unreachable(socket: location.socket, reason: String(cString: strerror(errno))) }
        var addr = sockaddr_un()
        addr.sun_family = sa_family_t(AF_UNIX)
        let path = Array(location.socket.utf8)
        guard path.count < MemoryLayout.size(ofValue: addr.sun_path) else {
            close(s); lock.unlock()
            throw CoordinationError.unreachable(socket: location.socket, reason: "path too long")
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
            close(s); lock.unlock()
            throw CoordinationError.unreachable(socket: location.socket, reason: reason + " (is the mount running?)")
        }
        fd = s
        let again = entries
        lock.unlock()
        let t = Thread { [self] in readLoop(s) }
        t.name = "nimbuskit \(location.root)"
        t.start()
        _ = try request(["op": "hello", "version": 1, "pid": Int(getpid()), "name": ProcessInfo.processInfo.processName],
                        key: "hello", timeout: 5)
        for (token, e) in again where e.presenter != nil {
            _ = try? request(["op": "present", "token": token, "path": e.path], key: "present:\(token)", timeout: 5)
        }
    }

    func register(_ token: Int, _ p: any FilePresenter, path: String) throws {
        lock.lock(); entries[token] = Entry(presenter: p, path: path); lock.unlock()
        try ensureConnected()
        let r = try request(["op": "present", "token": token, "path": path], key: "present:\(token)", timeout: 5)
        if r["ok"] as? Bool != true {
            lock.lock(); entries[token] = nil; lock.unlock()
            throw CoordinationError.refused(r["error"] as? String ?? "present failed")
        }
    }

    func unregister(_ token: Int) {
        lock.lock(); let had = entries.removeValue(forKey: token) != nil; let connected = fd >= 0; lock.unlock()
        if had && connected { _ = try? request(["op": "unpresent", "token": token], key: "unpresent:\(token)", timeout: 5) }
    }

    /// Sends one message and waits (at most `timeout` seconds) for the reply filed under `key`.
    func request(_ message: [String: Any], key: String, timeout: Double) throws -> [String: Any] {
        let p = Pending()
        lock.lock()
        let s = fd
        pending[key, default: []].append(p)
        lock.unlock()
        guard s >= 0, send(message, on: s) else {
            drop(s)
            throw CoordinationError.unreachable(socket: location.socket, reason: "the connection closed")
        }
        if p.done.wait(timeout: .now() + timeout) == .timedOut {
            lock.lock(); pending[key]?.removeAll { $0 === p }; lock.unlock()
            throw CoordinationError.unreachable(socket: location.socket, reason: "no answer within \(timeout) s")
        }
        guard let reply = p.reply else { throw CoordinationError.unreachable(socket: location.socket, reason: "the connection closed") }
        return reply
    }

    func send(_ message: [String: Any]) {
        lock.lock(); let s = fd; lock.unlock()
        if s >= 0, !send(message, on: s) { drop(s) }
    }

    private func send(_ message: [String: Any], on s: Int32) -> Bool {
        guard var bytes = try? [UInt8](JSONSerialization.data(withJSONObject: message, options: [.withoutEscapingSlashes])) else { return false }
        bytes.append(UInt8(ascii: "\n"))
        writeLock.lock(); defer { writeLock.unlock() }  // one line at a time
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(s, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                return false
            }
            off += n
        }
        return true
    }

    /// The connection is gone: waiting requests fail; the next use reconnects.
    private func drop(_ s: Int32) {
        lock.lock()
        guard s >= 0, fd == s else { lock.unlock(); return }
        fd = -1
        let waiting = pending.values.flatMap { $0 }
        pending = [:]
        lock.unlock()
        shutdown(s, Int32(SHUT_RDWR))
        for p in waiting { p.done.signal() }
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
                let line = Array(buffer[..<nl])
                buffer.removeSubrange(...nl)
                if let obj = (try? JSONSerialization.jsonObject(with: Data(line))) as? [String: Any] { dispatch(obj) }
            }
        }
        drop(s)
        close(s)
    }

    private func dispatch(_ m: [String: Any]) {
        if let re = m["re"] as? String {
            let key: String
            switch re {
            case "present", "unpresent": key = "\(re):\((m["token"] as? NSNumber)?.intValue ?? 0)"
            case "will-write", "did-write": key = "\(re):\(m["path"] as? String ?? "")"
            default: key = re
            }
            lock.lock()
            let p = pending[key]?.isEmpty == false ? pending[key]!.removeFirst() : nil
            lock.unlock()
            p?.reply = m
            p?.done.signal()
            return
        }
        let token = (m["token"] as? NSNumber)?.intValue ?? 0
        let path = m["path"] as? String ?? "/"
        let askID = (m["ask"] as? NSNumber)?.intValue
        guard let e = entry(token), let presenter = e.presenter else {
            if let askID { send(["op": "ack", "ask": askID]) }  // nobody to ask any more
            return
        }
        let queue = presenter.presentedItemOperationQueue
        if let ask = askID {
            switch m["kind"] as? String {
            case "save":
                queue.async { [self] in
                    do {
                        try presenter.savePresentedItemChanges()
                        send(["op": "ack", "ask": ask])
                    } catch {
                        send(["op": "ack", "ask": ask, "error": "\(error)"])
                    }
                }
            default:  // relinquish
                queue.async { [self] in
                    let once = Once()
                    presenter.relinquishPresentedItem { [self] reacquirer in
                        guard once.first() else { return }
                        update(token) { $0.reacquirer = reacquirer }
                        send(["op": "ack", "ask": ask])
                    }
                }
            }
            return
        }
        switch m["event"] as? String {
        case "reacquire":
            var r: (@Sendable () -> Void)?
            update(token) { r = $0.reacquirer; $0.reacquirer = nil }
            if let r { queue.async(execute: r) }
        case "changed":
            if e.writing > 0 || Date() < e.quietUntil { return }  // our own coordinated write
            queue.async { presenter.presentedItemDidChange() }
        case "moved":
            let to = m["to"] as? String ?? path
            update(token) { $0.path = to }
            let url = URL(fileURLWithPath: location.root + (to == "/" ? "" : to))
            queue.async { presenter.presentedItemDidMove(to: url) }
        case "deleted":
            lock.lock(); entries[token] = nil; lock.unlock()
            queue.async { presenter.accommodatePresentedItemDeletion() }
        case "version":
            let v = (m["version"] as? NSNumber)?.intValue ?? 0
            queue.async { presenter.presentedItemDidGain(version: v) }
        case "conflict":
            queue.async { presenter.presentedItemDidConflict() }
        default:
            break
        }
    }
}

/// True exactly once (a relinquish answered twice would ack twice).
final class Once: @unchecked Sendable {
    // @unchecked: guarded by `lock`.
    private let lock = NSLock()
    private var done = false
    func first() -> Bool {
        lock.lock(); defer { lock.unlock() }
        if done { return false }
        done = true
        return true
    }
}
