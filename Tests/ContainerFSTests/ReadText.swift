import ContainerFS
import Foundation
import FuseKit
import Testing

extension ContainerFS {
    /// Up to 256 bytes of the root's file `name`, read through an open handle as a program would.
    func readText(_ name: String) throws -> String {
        let e = try lookup(parent: .root, name: name)
        let h = try open(node: e.node, flags: O_RDONLY)
        defer { release(node: e.node, handle: h.handle) }
        var buf = [UInt8](repeating: 0, count: 256)
        let n = pread(try #require(descriptor(h.handle)), &buf, buf.count, 0)
        return String(decoding: buf.prefix(max(n, 0)), as: UTF8.self)
    }
}
