import NimbusCore

/// Consistency of a store together with its chunks: the store's own invariants plus "every chunk a
/// version refers to exists" and "every chunk an account owns exists" (what uploads and the
/// garbage collector keep: `ChunkCollector`).
public enum StoreCheck {
    public static func problems(store: any ServerStore, chunks: any ChunkStore) async throws -> [String] {
        var problems = try await store.consistencyProblems()
        let referenced = try await store.referencedChunks()
        for hash in referenced.sorted() where try await chunks.size(of: hash) == nil {
            problems.append("chunk \(hash) is referenced but not stored")
        }
        var missing: [ContentHash] = []
        for hash in try await store.ownedChunkHashes().subtracting(referenced).sorted() where try await chunks.size(of: hash) == nil {
            missing.append(hash)
        }
        if !missing.isEmpty {
            // A collection running meanwhile may have freed some: only those still owned count.
            let owned = try await store.ownedChunkHashes()
            for hash in missing where owned.contains(hash) { problems.append("chunk \(hash) is owned by an account but not stored") }
        }
        return problems
    }
}

/// An ownership as the consistency checks compare them.
struct ChunkOwnership: Hashable {
    var account: Int64
    var hash: String
}

/// Versions referring to chunks their account does not own, reported in a bounded list.
struct UnownedChunks {
    private(set) var count = 0
    private var first: [String] = []

    mutating func add(item: String, seq: Int64, hash: ContentHash, account: Int64) {
        count += 1
        if first.count < 20 { first.append("item \(item) version \(seq) refers to chunk \(hash), which account \(account) does not own") }
    }

    var problems: [String] {
        count > first.count ? first + ["… \(count - first.count) more version chunk(s) without an ownership"] : first
    }
}
