import AsyncHTTPClient
import Foundation
import NIOHTTP1
@testable import NimbusServer
import Testing

/// Which URL, Host header and signature each addressing style produces, checked against known
/// answers: the AWS SigV4 documentation's S3 examples (virtual-hosted, examplebucket) and, for
/// path-style and custom hosts, which the documentation has no example of, signatures computed by
/// botocore 1.44's `S3SigV4Auth` (the AWS SDK for Python) for the same requests — the same
/// harness reproduces the documentation's examples, so the two implementations agree on them.
@Suite struct S3AddressingTests {
    static let key = "AKIAIOSFODNN7EXAMPLE", secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    /// 2013-05-24T00:00:00Z, the date of the documentation's examples.
    static let date = Date(timeIntervalSince1970: 1_369_353_600)
    static let chunk = "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"

    static func store(_ url: String, _ env: [String: String]) throws -> S3ChunkStore {
        try S3ChunkStore(url: url, environment: ["AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret].merging(env) { $1 })
    }

    static func signature(_ r: HTTPClientRequest) -> String {
        String(r.headers.first(name: "Authorization")?.split(separator: "=").last ?? "")
    }

    @Test func awsDocumentationExamplesVirtualHosted() throws {
        let s = try Self.store("s3://examplebucket", ["AWS_ENDPOINT_URL": "https://s3.amazonaws.com"])
        #expect(s.addressing == .virtual)
        // "Example: GET Object".
        let get = s.request(.GET, key: "test.txt", headers: [("Range", "bytes=0-9")], payloadHash: S3Signer.emptyPayloadHash, date: Self.date)
        #expect(get.url == "https://examplebucket.s3.amazonaws.com/test.txt")
        #expect(get.headers.first(name: "Host") == "examplebucket.s3.amazonaws.com")
        #expect(Self.signature(get) == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
        // "Example: PUT Object" (a key with a character that is percent-encoded).
        let put = s.request(.PUT, key: "test$file.text", headers: [("Date", "Fri, 24 May 2013 00:00:00 GMT"), ("x-amz-storage-class", "REDUCED_REDUNDANCY")],
                            payloadHash: Self.chunk, date: Self.date)
        #expect(put.url == "https://examplebucket.s3.amazonaws.com/test%24file.text")
        #expect(Self.signature(put) == "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd")
        // "Example: GET Bucket (List Objects)": the bucket itself is "/" on its virtual host.
        let list = s.request(.GET, key: nil, query: [("max-keys", "2"), ("prefix", "J")], payloadHash: S3Signer.emptyPayloadHash, date: Self.date)
        #expect(list.url == "https://examplebucket.s3.amazonaws.com/?max-keys=2&prefix=J")
        #expect(Self.signature(list) == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7")
    }

    @Test func pathStyleForCustomEndpoints() throws {
        // PUT of a chunk on a custom endpoint with a port, another region (botocore signed the
        // body "Welcome to Amazon S3.", whose SHA-256 is `chunk`).
        let s = try Self.store("s3://nimbus-chunks/prod", ["AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1"])
        #expect(s.addressing == .path)
        let put = s.request(.PUT, key: "prod/" + Self.chunk, payloadHash: Self.chunk, date: Self.date)
        #expect(put.url == "http://127.0.0.1:9000/nimbus-chunks/prod/" + Self.chunk)
        #expect(put.headers.first(name: "Host") == "127.0.0.1:9000")
        #expect(Self.signature(put) == "f5b557ed60ebc316c73b6bbcb349f0c64231865c6c353136540f7e77eff26725")
        // An endpoint with a path (a gateway): it leads both the URL and the signed URI.
        let g = try Self.store("s3://nimbus-chunks", ["AWS_ENDPOINT_URL": "http://minio.internal:9000/gateway/"])
        let get = g.request(.GET, key: Self.chunk, headers: [("Range", "bytes=7-19")], payloadHash: S3Signer.emptyPayloadHash, date: Self.date)
        #expect(get.url == "http://minio.internal:9000/gateway/nimbus-chunks/" + Self.chunk)
        #expect(get.headers.first(name: "Host") == "minio.internal:9000")
        #expect(Self.signature(get) == "bca85d91b9e8589606c6cf06d4b6f85e3eff035ae35030d1898fa5439a698a8e")
    }

    @Test func virtualHostedOnACustomEndpointWhenAsked() throws {
        let s = try Self.store("s3://nimbus-chunks/prod", ["AWS_ENDPOINT_URL": "http://s3.nimbus.test:9000", "AWS_S3_FORCE_PATH_STYLE": "0"])
        #expect(s.addressing == .virtual)
        let head = s.request(.HEAD, key: "prod/" + Self.chunk, payloadHash: S3Signer.emptyPayloadHash, date: Self.date)
        #expect(head.url == "http://nimbus-chunks.s3.nimbus.test:9000/prod/" + Self.chunk)
        #expect(head.headers.first(name: "Host") == "nimbus-chunks.s3.nimbus.test:9000")
        #expect(Self.signature(head) == "48a428cb83b79ddbb4cc945bf5b5ee96a597f6109c2f68290ca79edab7368c09")
    }

    @Test func defaultsAndOverrides() throws {
        // AWS's own endpoint (the default): virtual-hosted, on the regional host.
        let aws = try Self.store("s3://my-chunks/p", ["AWS_REGION": "eu-central-1"])
        #expect(aws.addressing == .virtual)
        #expect(aws.request(.GET, key: "p/x", payloadHash: S3Signer.emptyPayloadHash).url == "https://my-chunks.s3.eu-central-1.amazonaws.com/p/x")
        // Forced path-style on AWS.
        for value in ["1", "true", "TRUE"] {
            let forced = try Self.store("s3://my-chunks/p", ["AWS_S3_FORCE_PATH_STYLE": value])
            #expect(forced.addressing == .path)
            #expect(forced.request(.GET, key: "p/x", payloadHash: S3Signer.emptyPayloadHash).url == "https://s3.us-east-1.amazonaws.com/my-chunks/p/x")
        }
        // Bucket names that cannot be a host name stay path-style on AWS, and cannot be forced virtual.
        #expect(try Self.store("s3://my.chunks", [:]).addressing == .path)
        #expect(try Self.store("s3://My_Chunks", [:]).addressing == .path)
        #expect(try Self.store("s3://my.chunks", ["AWS_ENDPOINT_URL": "http://s3.lan", "AWS_S3_FORCE_PATH_STYLE": "0"]).addressing == .virtual)
        let dotted = #expect(throws: APIError.self) { try Self.store("s3://my.chunks", ["AWS_S3_FORCE_PATH_STYLE": "false"]) }
        #expect(dotted?.message.contains("AWS_S3_FORCE_PATH_STYLE") == true)
        // An unknown value is refused with what the values mean.
        let bad = #expect(throws: APIError.self) { try Self.store("s3://b/p", ["AWS_S3_FORCE_PATH_STYLE": "yes"]) }
        #expect(bad?.message.contains("neither 1/true") == true)
        #expect(S3Addressing.hostable("abc", https: true) && !S3Addressing.hostable("ab", https: true) && !S3Addressing.hostable("-abc", https: false))
    }
}
