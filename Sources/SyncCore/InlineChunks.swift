import NimbusCore
import NimbusProtocol

/// Chunk bytes that came inside a changes page (`ChangesResponse.inline`), kept until a download
/// of that chunk takes them (each once). At most `limit` bytes: when more come, the oldest go,
/// and their files download from the server as usual.
public struct InlineChunks: Sendable {
    public let limit: Int
    private var bytes: [ContentHash: [UInt8]] = [:]
    /// Arrival order, for dropping the oldest.
    private var order: [ContentHash] = []
    public private(set) var total = 0

    public init(limit: Int = 4 * 1024 * 1024) { self.limit = limit }

    public var count: Int { bytes.count }

    public func holds(_ hash: ContentHash) -> Bool { bytes[hash] != nil }

    /// Keeps `b` as the bytes of `hash` (a chunk larger than the limit is not kept).
    public mutating func add(_ hash: ContentHash, _ b: [UInt8]) {
        guard b.count <= limit, bytes[hash] == nil else { return }
        while total + b.count > limit, !order.isEmpty {
            let oldest = order.removeFirst()
            total -= bytes.removeValue(forKey: oldest)?.count ?? 0
        }
        bytes[hash] = b
        order.append(hash)
        total += b.count
    }

    /// The bytes of `hash`, given out once.
    public mutating func take(_ hash: ContentHash) -> [UInt8]? {
        guard let b = bytes.removeValue(forKey: hash) else { return nil }
        order.removeAll { $0 == hash }
        total -= b.count
        return b
    }
}
