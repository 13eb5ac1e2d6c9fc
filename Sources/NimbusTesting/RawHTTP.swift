import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A plain TCP connection for sending a server what no HTTP client would: half-sent heads,
/// bodies shorter than their Content-Length, bytes one at a time. Every read is bounded.
public final class RawConnection: @unchecked Sendable {
    // @unchecked: one test task owns the descriptor.
    private var fd: Int32

    /// Connects to `url`'s host and port (`http://127.0.0.1:PORT`).
    public init(_ url: String) throws {
        guard let u = URL(string: url), let host = u.host, let port = u.port else { throw FixtureError("bad url \(url)") }
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw FixtureError("socket: errno \(errno)") }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(port).bigEndian)
        inet_pton(AF_INET, host, &addr.sin_addr)
        let r = withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard r == 0 else {
            Glibc.close(fd)
            throw FixtureError("connect to \(url): errno \(errno)")
        }
    }

    deinit { if fd >= 0 { Glibc.close(fd) } }

    public func close() {
        if fd >= 0 { Glibc.close(fd) }
        fd = -1
    }

    /// Sends all of `bytes`; false when the server has closed the connection.
    @discardableResult
    public func send(_ bytes: [UInt8]) -> Bool {
        var done = 0
        while done < bytes.count {
            let n = bytes[done...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                return false
            }
            done += n
        }
        return true
    }

    @discardableResult
    public func send(_ text: String) -> Bool { send(Array(text.utf8)) }

    /// What the server sends within `timeout`, until it closes the connection or stops sending.
    /// `closed` tells whether the server closed its side.
    public func read(timeout: Duration) -> (bytes: [UInt8], closed: Bool) {
        var out: [UInt8] = []
        let deadline = ContinuousClock.now + timeout
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let left = deadline - ContinuousClock.now
            if left <= .zero { return (out, false) }
            var p = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ms = Int32(max(1, left.components.seconds * 1000 + left.components.attoseconds / 1_000_000_000_000_000))
            let r = poll(&p, 1, ms)
            if r < 0 { if errno == EINTR { continue }; return (out, true) }
            if r == 0 { return (out, false) }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return (out, true) }
            out.append(contentsOf: buffer[0..<n])
        }
    }

    /// Reads until one whole response (head and Content-Length body; the head alone for an answer
    /// to HEAD) has arrived, or `timeout`.
    public func readResponse(timeout: Duration, toHEAD: Bool = false) -> RawHTTPResponse? {
        var got: [UInt8] = []
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let (bytes, closed) = read(timeout: min(.milliseconds(200), deadline - ContinuousClock.now))
            got += bytes
            if let r = RawHTTPResponse(got, toHEAD: toHEAD), r.complete { return r }
            if closed { return RawHTTPResponse(got, toHEAD: toHEAD) }
        }
        return RawHTTPResponse(got, toHEAD: toHEAD)
    }
}

/// An HTTP/1.1 response as bytes arrived.
public struct RawHTTPResponse: Sendable {
    public let status: Int
    public let headers: [String: String]
    public let body: [UInt8]
    public let complete: Bool

    init?(_ bytes: [UInt8], toHEAD: Bool) {
        let sep: [UInt8] = [13, 10, 13, 10]
        guard let end = (0..<max(0, bytes.count - 3)).first(where: { Array(bytes[$0..<$0 + 4]) == sep }) else { return nil }
        let head = String(decoding: bytes[0..<end], as: UTF8.self).components(separatedBy: "\r\n")
        guard let first = head.first, first.split(separator: " ").count >= 2, let code = Int(first.split(separator: " ")[1]) else { return nil }
        var h: [String: String] = [:]
        for line in head.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            h[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        status = code
        headers = h
        body = Array(bytes[(end + 4)...])
        complete = toHEAD || body.count >= Int(h["content-length"] ?? "0") ?? 0
    }

    public var text: String { String(decoding: body, as: UTF8.self) }
}
