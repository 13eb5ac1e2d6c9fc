import NimbusCore
import NimbusProtocol

/// Where each chunk of a content starts: the offsets of its chunks plus the size at the end.
public struct ChunkMap: Sendable, Equatable {
    public let offsets: [Int64]

    public init(_ chunks: [ChunkRef]) {
        var o: [Int64] = [0]
        o.reserveCapacity(chunks.count + 1)
        for c in chunks { o.append(o[o.count - 1] + c.size) }
        offsets = o
    }

    public var size: Int64 { offsets[offsets.count - 1] }
    public var count: Int { offsets.count - 1 }

    /// Indices of the chunks overlapping `range` (clamped to the content).
    public func covering(_ range: Range<Int64>) -> Range<Int> {
        let lo = max(0, range.lowerBound), hi = min(size, range.upperBound)
        guard lo < hi else { return 0..<0 }
        // First chunk whose end is past `lo`, last whose start is before `hi` (binary search).
        let first = upperBound(lo) - 1
        let last = upperBound(hi - 1) - 1
        return first..<(last + 1)
    }

    /// The chunk after `span`, fetched while `span` is read (none past the end).
    public func readAhead(after span: Range<Int>) -> [Int] {
        span.isEmpty || span.upperBound >= count ? [] : [span.upperBound]
    }

    /// The bytes of chunk `i` that fall in `range`, as offsets into the chunk.
    public func part(of i: Int, in range: Range<Int64>) -> Range<Int> {
        Int(max(range.lowerBound, offsets[i]) - offsets[i])..<Int(min(range.upperBound, offsets[i + 1]) - offsets[i])
    }

    /// Index of the first offset greater than `x`.
    private func upperBound(_ x: Int64) -> Int {
        var a = 0, b = offsets.count
        while a < b {
            let m = (a + b) / 2
            if offsets[m] <= x { a = m + 1 } else { b = m }
        }
        return a
    }
}

/// The chunks of one old version as it is read (`cat` of a version): the last `kept` fetched
/// are held, most recently used last, and each chunk is fetched once however many reads wait
/// for it. Pure value type; `Waiter` is whatever a read waits with.
public struct HeldChunks<Waiter>: Sendable where Waiter: Sendable {
    public let kept: Int
    private var held: [(index: Int, bytes: [UInt8])] = []
    private var fetching: [Int: [Waiter]] = [:]

    public init(kept: Int) { self.kept = kept }

    public enum Ask: Sendable {
        /// Held: here are its bytes.
        case held([UInt8])
        /// A fetch of it is under way: the waiter is told when it ends.
        case joined
        /// Fetch it now; the waiter is told when it ends.
        case fetch
    }

    public mutating func ask(_ i: Int, _ waiter: Waiter) -> Ask {
        if let h = held.firstIndex(where: { $0.index == i }) {
            let e = held.remove(at: h)
            held.append(e)
            return .held(e.bytes)
        }
        let under = fetching[i] != nil
        fetching[i, default: []].append(waiter)
        return under ? .joined : .fetch
    }

    /// The fetch of chunk `i` ended (`bytes` nil: it failed): the waiters to tell.
    public mutating func ended(_ i: Int, bytes: [UInt8]?) -> [Waiter] {
        if let bytes {
            held.append((i, bytes))
            if held.count > kept { held.removeFirst() }
        }
        return fetching.removeValue(forKey: i) ?? []
    }

    public var heldIndices: [Int] { held.map(\.index) }
}
