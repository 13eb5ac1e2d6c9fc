import Foundation
import NimbusServer

/// A fresh bucket per test on the S3-compatible server named by NIMBUS_TEST_S3 (its endpoint URL;
/// scripts/test starts moto's standalone server and sets it). Without it the S3 tests are skipped
/// with `skipReason`.
public enum S3Scratch {
    public static let endpoint = ProcessInfo.processInfo.environment["NIMBUS_TEST_S3"].flatMap { $0.isEmpty ? nil : $0 }
    public static var available: Bool {
        if endpoint == nil { FileHandle.standardError.write(Data("\n*** \(skipReason) ***\n\n".utf8)) }
        return endpoint != nil
    }
    public static let skipReason = "SKIPPING the S3 tests: NIMBUS_TEST_S3 is unset. Run scripts/test (it starts moto's S3 server), or set NIMBUS_TEST_S3=http://127.0.0.1:PORT of an S3-compatible server accepting any credentials"

    /// The AWS_* settings `S3ChunkStore` and `nimbus serve --chunks s3://…` read.
    public static var environment: [String: String] {
        ["AWS_ENDPOINT_URL": endpoint ?? "", "AWS_REGION": "us-east-1",
         "AWS_ACCESS_KEY_ID": "nimbus-test", "AWS_SECRET_ACCESS_KEY": "nimbus-test-secret"]
    }

    /// Puts `environment` into this process's environment, so `nimbus` child processes inherit it.
    /// Every caller sets the same values, so concurrent calls are harmless.
    public static func exportEnvironment() {
        for (k, v) in environment { setenv(k, v, 1) }
    }

    /// Creates a new bucket; returns its store and its `s3://BUCKET/chunks` URL. Delete it with
    /// the store's `deleteBucket()`.
    public static func makeBucket() async throws -> (S3ChunkStore, String) {
        guard endpoint != nil else { throw FixtureError(skipReason) }
        let url = "s3://nimbus-t-\(UUID().uuidString.lowercased().prefix(13))/chunks"
        let store = try S3ChunkStore(url: url, environment: environment)
        try await store.createBucket()
        return (store, url)
    }

    /// A new bucket as `s3://BUCKET/chunks`, with its store; the bucket and its objects are deleted
    /// afterwards, also when `body` throws.
    public static func withBucket<T: Sendable>(_ body: @Sendable (S3ChunkStore, String) async throws -> T) async throws -> T {
        let (store, url) = try await makeBucket()
        do {
            let result = try await body(store, url)
            try await store.deleteBucket()
            return result
        } catch {
            try? await store.deleteBucket()
            throw error
        }
    }
}
