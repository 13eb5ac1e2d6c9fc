import Foundation
import NIOCore
import NimbusCore
@testable import NimbusServer
import NimbusTesting
import Testing

/// SigV4 against the specification's published example (no server needed).
@Suite struct S3SignerTests {
    /// "Example: GET Object" of the S3 SigV4 header-authentication documentation.
    @Test func matchesTheSpecificationExample() {
        let signer = S3Signer(accessKey: "AKIAIOSFODNN7EXAMPLE", secretKey: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", region: "us-east-1")
        let headers = signer.sign(method: "GET", path: "/test.txt", headers: [("Host", "examplebucket.s3.amazonaws.com"), ("Range", "bytes=0-9")],
                                  payloadHash: S3Signer.emptyPayloadHash, date: Date(timeIntervalSince1970: 1_369_353_600))
        let auth = headers.first { $0.0 == "Authorization" }?.1
        #expect(auth == "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    }

    @Test func refusesIncompleteSettings() {
        #expect(throws: APIError.self) { try S3ChunkStore(url: "s3://bucket/p", environment: [:]) }
        #expect(throws: APIError.self) { try S3ChunkStore(url: "s3:///p", environment: S3Scratch.environment) }
    }
}

/// The S3 chunk store against a real S3-compatible server (moto), a fresh bucket per test.
@Suite(.enabled(if: S3Scratch.available, "NIMBUS_TEST_S3 is unset; scripts/test starts moto's S3 server and sets it"))
struct S3ChunkStoreTests {
    static func bytes(_ text: String) -> ByteBuffer { ByteBuffer(string: text) }

    @Test func putSizeReadRanges() async throws {
        try await S3Scratch.withBucket { store, _ in
            let data = Self.bytes(String(repeating: "nimbus chunk ", count: 1000))
            let hash = ChunkHashing.sha256(data)
            #expect(try await store.size(of: hash) == nil)
            #expect(try await store.read(hash, range: nil) == nil)
            try await store.put(hash, bytes: data, ifStored: .skip)
            try await store.put(hash, bytes: data, ifStored: .skip)  // idempotent
            try await store.put(hash, bytes: data, ifStored: .store)
            #expect(try await store.size(of: hash) == Int64(data.readableBytes))
            #expect(try await store.read(hash, range: nil) == data)
            #expect(try await store.read(hash, range: 7..<20) == data.getSlice(at: 7, length: 13))
            #expect(try await store.read(hash, range: 5..<5)?.readableBytes == 0)
        }
    }

    /// The streaming rules every store keeps (`ChunkStreamConformance`). moto does not check
    /// x-amz-content-sha256, so this shows the server itself never completes a wrong upload.
    @Test func streamsAndChecks() async throws {
        try await S3Scratch.withBucket { store, _ in
            try await ChunkStreamConformance.run(store) { hash, bytes in
                let r = try await store.send(.PUT, key: store.objectKey(hash), body: bytes)
                #expect(r.status == .ok)
            }
        }
    }

    /// Virtual-hosted requests (`BUCKET.HOST/KEY`) against moto, which takes the bucket from the
    /// Host header. `s3.nimbus.test` has no DNS record, so the connection goes to moto's address
    /// (`connectTo`, like curl's --resolve) while Host and signature name the virtual host. The
    /// objects are the same ones path-style requests see.
    @Test func virtualHostedAddressing() async throws {
        try await S3Scratch.withBucket { pathStore, _ in
            let moto = try #require(URL(string: S3Scratch.endpoint!))
            let endpoint = try #require(URL(string: "http://s3.nimbus.test:\(moto.port!)"))
            var store = S3ChunkStore(endpoint: endpoint, bucket: pathStore.bucket, prefix: pathStore.prefix, addressing: .virtual,
                                     signer: pathStore.signer, logger: pathStore.logger)
            store.connectTo = (moto.host!, moto.port!)
            #expect(S3Target.of(endpoint: endpoint, bucket: store.bucket, key: "k", addressing: .virtual).host == "\(store.bucket).s3.nimbus.test:\(moto.port!)")
            let data = ChunkStreamConformance.bytes(200_000, seed: 4)
            let hash = ChunkHashing.sha256(data)
            try await store.put(hash, size: 200_000, body: Pieces.of(data, size: 30_000), ifStored: .store)
            #expect(try await store.size(of: hash) == 200_000)
            #expect(try await store.read(hash, range: nil) == data)
            #expect(try await pathStore.read(hash, range: 10..<20) == data.getSlice(at: 10, length: 10))
            // A bucket that does not exist, named in the host, is a clear error, not a hang.
            var missing = S3ChunkStore(endpoint: endpoint, bucket: "nimbus-no-such-bucket", prefix: "", addressing: .virtual,
                                       signer: pathStore.signer, logger: pathStore.logger)
            missing.connectTo = store.connectTo
            let error = await ChunkStreamConformance.failure { try await missing.put(hash, bytes: data, ifStored: .store) }
            #expect((error as? APIError)?.message.contains("does not exist") == true, "\(String(describing: error))")
        }
    }

    @Test func refusesBytesThatDoNotHashToTheName() async throws {
        try await S3Scratch.withBucket { store, _ in
            let wrong = ChunkHashing.sha256(Self.bytes("other"))
            await #expect(throws: APIError.self) { try await store.put(wrong, bytes: Self.bytes("mine"), ifStored: .skip) }
            let size = try await store.size(of: wrong)
            #expect(size == nil)
        }
    }
}
