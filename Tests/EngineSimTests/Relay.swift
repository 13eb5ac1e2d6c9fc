import Foundation
import Glibc
import MountPorts

/// A TCP relay on 127.0.0.1 in front of the server, one per device: the device's client talks to
/// the relay, so the network can go away under the engine in the middle of any request.
/// `cut()` drops every open connection (a commit may have reached the server while its answer
/// is lost) and refuses new ones (accepted, then closed at once) until `restore()`.
///
/// Threads: one accepting, two per connection copying bytes (blocking sockets; a few dozen
/// connections at most). `send` uses MSG_NOSIGNAL: a write into a dropped connection must not
/// raise SIGPIPE in the test process.
final class Relay: @unchecked Sendable {
    // @unchecked: `down`, `closed` and `open` are guarded by `lock`; `listener` is set in init.
    private let lock = NSLock()
    private var down = false
    private var closed = false
    /// Open connections: both descriptors of each pair; the second pump to end closes them.
    private var open: [ObjectIdentifier: Pair] = [:]
    private let listener: Int32
    private var loseMarker: [UInt8]?
    private var holdMarker: [UInt8]?
    private var holding = false
    let port: Int
    let targetPort: Int

    private final class Pair: @unchecked Sendable {
        // @unchecked: `ended` is guarded by the relay's lock; the descriptors never change.
        let a: Int32, b: Int32
        var ended = 0
        /// A request on it matched `loseMarker`: its answer is lost (`loseNextAnswer`).
        var swallow = false
        /// A request on it matched `holdMarker`: its answer waits for `releaseHeld`.
        var held = false
        init(_ a: Int32, _ b: Int32) { self.a = a; self.b = b }
    }

    init(targetPort: Int) throws {
        self.targetPort = targetPort
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SimFailure("relay: socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = Self.loopback(port: 0)
        let bound = withUnsafePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 64) == 0 else {
            Glibc.close(fd)
            throw SimFailure("relay: bind/listen: \(String(cString: strerror(errno)))")
        }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        listener = fd
        port = Int(UInt16(bigEndian: addr.sin_port))
        let t = Thread { [self] in acceptLoop() }
        t.name = "sim-relay-accept"
        t.start()
    }

    var url: String { "http://127.0.0.1:\(port)" }

    static func loopback(port: Int) -> sockaddr_in {
        var a = sockaddr_in()
        a.sin_family = sa_family_t(AF_INET)
        a.sin_port = UInt16(port).bigEndian
        a.sin_addr.s_addr = inet_addr("127.0.0.1")
        return a
    }

    /// The network goes away: open connections drop, new ones are closed at once.
    func cut() {
        lock.withLock {
            down = true
            for p in open.values { shutdown(p.a, Int32(SHUT_RDWR)); shutdown(p.b, Int32(SHUT_RDWR)) }
        }
    }

    func restore() { lock.withLock { down = false } }

    /// The next request whose bytes contain `marker` reaches the server, and when the answer
    /// comes back the network goes away instead (`cut()`): the server did the work, the device
    /// never hears of it — deterministically, not by luck of timing.
    func loseNextAnswer(after marker: String) { lock.withLock { loseMarker = Array(marker.utf8) } }

    /// The answer to the next request whose bytes contain `marker` is held back (the request
    /// is under way, its bytes are not) until `releaseHeld()`: a slow transfer on demand.
    func holdNextAnswer(after marker: String) { lock.withLock { holdMarker = Array(marker.utf8); holding = true } }

    /// Lets a held answer go on.
    func releaseHeld() { lock.withLock { holding = false } }

    /// Whether a request matched the hold marker (its answer is held or was).
    var holdMatched: Bool { lock.withLock { holdMarker == nil && holding } }

    var isCut: Bool { lock.withLock { down } }

    /// Stops accepting and drops every connection.
    func close() {
        lock.withLock { closed = true }
        cut()
        shutdown(listener, Int32(SHUT_RDWR))  // accept() returns
    }

    private func acceptLoop() {
        defer { Glibc.close(listener) }
        while true {
            let c = accept(listener, nil, nil)
            if c < 0 {
                if errno == EINTR { continue }
                return
            }
            let (refuse, stop) = lock.withLock { (down || closed, closed) }
            if refuse {
                Glibc.close(c)
                if stop { return }
                continue
            }
            let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var addr = Self.loopback(port: targetPort)
            let ok = s >= 0 && withUnsafePointer(to: &addr) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(s, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            } == 0
            guard ok else {
                Glibc.close(c)
                if s >= 0 { Glibc.close(s) }
                continue
            }
            let pair = Pair(c, s)
            let cutMeanwhile = lock.withLock { () -> Bool in
                if down { return true }
                open[ObjectIdentifier(pair)] = pair
                return false
            }
            if cutMeanwhile {
                Glibc.close(c)
                Glibc.close(s)
                continue
            }
            for (from, to) in [(c, s), (s, c)] {
                let t = Thread { [self] in pump(from, to, pair) }
                t.name = "sim-relay-pump"
                t.start()
            }
        }
    }

    private func pump(_ from: Int32, _ to: Int32, _ pair: Pair) {
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        loop: while true {
            let n = buffer.withUnsafeMutableBytes { recv(from, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            if from == pair.a, let marker = lock.withLock({ loseMarker }),
               buffer[0..<n].firstRange(of: marker) != nil {
                lock.withLock { pair.swallow = true; loseMarker = nil }
            }
            if from == pair.a, let marker = lock.withLock({ holdMarker }),
               buffer[0..<n].firstRange(of: marker) != nil {
                lock.withLock { pair.held = true; holdMarker = nil }
            }
            if from == pair.b, lock.withLock({ pair.held }) {
                while lock.withLock({ holding && !closed && !down }) { usleep(5_000) }
                lock.withLock { pair.held = false }
            }
            if from == pair.b, lock.withLock({ pair.swallow }) {
                cut()
                break
            }
            var sent = 0
            while sent < n {
                let m = buffer.withUnsafeBytes { send(to, $0.baseAddress! + sent, n - sent, Int32(MSG_NOSIGNAL)) }
                if m < 0 && errno == EINTR { continue }
                if m <= 0 { break loop }
                sent += m
            }
        }
        // One direction ended: end the other too (HTTP has no use for a half-open connection).
        shutdown(pair.a, Int32(SHUT_RDWR))
        shutdown(pair.b, Int32(SHUT_RDWR))
        let last = lock.withLock { () -> Bool in
            pair.ended += 1
            if pair.ended == 2 { open[ObjectIdentifier(pair)] = nil }
            return pair.ended == 2
        }
        if last {
            Glibc.close(pair.a)
            Glibc.close(pair.b)
        }
    }
}
