import NimbusCore

/// Consistency of a store together with its chunks: the store's own invariants plus "every chunk a
/// version refers to exists".
public enum StoreCheck {
    public static func problems(store: any ServerStore, chunks: any ChunkStore) async throws -> [String] {
        var problems = try await store.consistencyProblems()
        for hash in try await store.referencedChunks().sorted() where try await chunks.size(of: hash) == nil {
            problems.append("chunk \(hash) is referenced but not stored")
        }
        return problems
    }
}
