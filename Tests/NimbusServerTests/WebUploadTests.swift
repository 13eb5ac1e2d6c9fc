import Chunking
import Foundation
import NIOCore
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusServer
import NimbusTesting
import Testing

/// The web view's upload route (docs/web.md "Upload") against a live server: the server cuts a
/// file exactly as a device does, so equal files share chunks whichever way they came, and an
/// upload that is not whole commits nothing.
@Suite struct WebUploadTests {
    static let container = "com.example.web"

    /// A signed-in browser: its cookie and the CSRF value its pages carry.
    struct Browser {
        let client: NimbusClient
        let cookie: String
        let csrf: String
        let origin: String

        func upload(_ bytes: [UInt8]?, name: String, folder: String = "", kind: String? = nil, headers: [(String, String)] = []) async throws -> NimbusClient.RawResponse {
            var q = "name=\(name.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)&folder=\(folder)"
            if let kind { q += "&kind=\(kind)" }
            return try await client.send(.POST, "/web/c/\(WebUploadTests.container)/upload?\(q)", body: bytes.map { ByteBuffer(bytes: $0) },
                                         contentType: "application/octet-stream",
                                         headers: [("Cookie", cookie), ("X-Nimbus-CSRF", csrf), ("Origin", origin)] + headers, authorized: false)
        }
    }

    /// A browser's session: a device's token in the cookie (as the sign-in makes one; the
    /// journeys in Tests/web sign in through the page), and the CSRF value its pages carry.
    static func signIn(_ s: LiveServer, _ device: NimbusClient) async throws -> Browser {
        let anon = NimbusClient(baseURL: s.url, token: "")
        let cookie = "nimbus_web=\(try await s.token(device: "browser"))"
        let page = try await anon.send(.GET, "/web/c/\(container)", headers: [("Cookie", cookie)], authorized: false)
        let marker = "name=\"csrf\" value=\""
        let start = try #require(page.text.range(of: marker), "\(page.status) \(page.text)").upperBound
        let csrf = String(page.text[start...].prefix(32))
        return Browser(client: anon, cookie: cookie, csrf: csrf, origin: s.url)
    }

    @Test func anUploadIsCutAsADeviceCutsItAndSharesItsChunks() async throws {
        try await LiveServer.with { s in
            let device = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await device.createContainer(Self.container)
            let browser = try await Self.signIn(s, device)
            // Random bytes, a long run of zeros (whole 4 MiB zero chunks) and random again.
            var rng = SystemRandomNumberGenerator()
            var bytes = (0..<6_000_000).map { _ in UInt8.random(in: 0...255, using: &rng) }
            bytes += [UInt8](repeating: 0, count: 9 << 20)
            bytes += (0..<1_234_567).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let r = try await browser.upload(bytes, name: "film <1>.bin")
            #expect(r.status == 200, "\(r.text)")
            let answer = try JSONDecoder().decode([String: JSONValue].self, from: Data(buffer: r.body))
            guard case .string(let idText)? = answer["id"], let id = ItemID(idText) else { Issue.record("no id: \(r.text)"); return }
            let item = try await device.item(Self.container, id)
            #expect(item.name.value == "film <1>.bin" && item.size == Int64(bytes.count))
            #expect(item.chunks == Chunker.standard.chunks(of: bytes).map(\.ref), "the chunks a device would make")
            // A device with the same file finds every chunk on the server already.
            let missing = try await device.missingChunks(item.chunks.map(\.hash))
            #expect(missing.isEmpty)
            // And the bytes read back are the file.
            var back: [UInt8] = []
            for c in item.chunks { back += try await device.getChunk(c.hash) }
            #expect(back == bytes)
        }
    }

    @Test func anUploadThatIsNotWholeCommitsNothing() async throws {
        try await LiveServer.with { s in
            let device = NimbusClient(baseURL: s.url, token: try await s.token())
            _ = try await device.createContainer(Self.container)
            let browser = try await Self.signIn(s, device)
            // Without the page's CSRF header, or from another origin: refused before any byte.
            let noCSRF = try await browser.client.send(.POST, "/web/c/\(Self.container)/upload?name=a", body: ByteBuffer(string: "x"),
                                                       headers: [("Cookie", browser.cookie), ("Origin", browser.origin)], authorized: false)
            #expect(noCSRF.status == 403 && noCSRF.text.contains("\"error\""))
            let elsewhere = try await browser.upload(Array("x".utf8), name: "a", headers: [("Sec-Fetch-Site", "cross-site")])
            #expect(elsewhere.status == 403)
            // Names the server refuses, a folder that is not there, a kind it does not know.
            for name in ["", "a/b", "..", String(repeating: "n", count: 256)] {
                let bad = try await browser.upload(Array("x".utf8), name: name)
                #expect(bad.status == 400 && bad.text.contains("\"error\""), "\(name.prefix(20)): \(bad.status) \(bad.text)")
            }
            let gone = try await browser.upload(Array("x".utf8), name: "a", folder: ItemID(UUID()).description)
            #expect(gone.status == 404 || gone.status == 409, "\(gone.status) \(gone.text)")
            let link = try await browser.upload(Array("x".utf8), name: "a", kind: "symlink")
            #expect(link.status == 400)
            let page = try await device.items(Self.container)
            #expect(page.items.isEmpty, "nothing committed: \(page.items.map(\.name))")
            // A folder, then an empty file in it.
            let folder = try await browser.upload(nil, name: "Inbox", kind: "folder")
            #expect(folder.status == 200, "\(folder.text)")
            let folderID = try #require(try JSONDecoder().decode([String: JSONValue].self, from: Data(buffer: folder.body))["id"])
            guard case .string(let fid) = folderID else { Issue.record("no id"); return }
            let empty = try await browser.upload([], name: "empty.txt", folder: fid)
            #expect(empty.status == 200, "\(empty.text)")
            let items = try await device.items(Self.container).items
            #expect(Set(items.map(\.name.value)) == ["Inbox", "empty.txt"])
            #expect(items.first { $0.name.value == "empty.txt" }?.chunks.isEmpty == true)
        }
    }
}
