import Glibc

/// Linux's `fallocate(2)`, which Glibc's module map leaves out (a GNU extension), looked up once.
private let fallocateCall: (@convention(c) (Int32, Int32, Int, Int) -> Int32)? = {
    guard let f = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "fallocate") else { return nil }
    return unsafeBitCast(f, to: (@convention(c) (Int32, Int32, Int, Int) -> Int32).self)
}()

/// Turns `length` bytes at `offset` of the file into a hole, keeping its size
/// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`): their disk space is given back. False when the
/// file system cannot punch holes.
public func punchFileHole(_ fd: Int32, offset: Int64, length: Int64) -> Bool {
    guard let fallocateCall, length > 0 else { return false }
    return fallocateCall(fd, 0x01 | 0x02, Int(offset), Int(length)) == 0
}
