import Foundation
import NIOCore

/// Bucket housekeeping, for tests and first-time setup (production buckets are usually made and
/// retired by the operator).
extension S3ChunkStore {
    /// Creates the bucket if it does not exist.
    public func createBucket() async throws {
        let r = try await send(.PUT, key: nil)
        guard r.status == .ok || r.status == .conflict else { throw unexpected(r, "create bucket \(bucket)") }
    }

    /// Deletes every object of the bucket, then the bucket.
    public func deleteBucket() async throws {
        while true {
            let list = try await send(.GET, key: nil, query: [("list-type", "2"), ("max-keys", "1000")])
            guard list.status == .ok else { throw unexpected(list, "list bucket \(bucket)") }
            let keys = Self.keys(inListing: String(buffer: list.body))
            if keys.isEmpty { break }
            for key in keys {
                let r = try await send(.DELETE, key: key)
                guard r.status == .noContent || r.status == .ok else { throw unexpected(r, "delete \(key)") }
            }
        }
        let r = try await send(.DELETE, key: nil)
        guard r.status == .noContent || r.status == .ok || r.status == .notFound else { throw unexpected(r, "delete bucket \(bucket)") }
    }

    /// The <Key> elements of a ListObjectsV2 answer (keys are hex hashes under a plain prefix, so
    /// no XML entities occur).
    static func keys(inListing xml: String) -> [String] {
        var out: [String] = []
        var rest = xml[...]
        while let open = rest.range(of: "<Key>"), let close = rest.range(of: "</Key>", range: open.upperBound..<rest.endIndex) {
            out.append(String(rest[open.upperBound..<close.lowerBound]))
            rest = rest[close.upperBound...]
        }
        return out
    }
}
