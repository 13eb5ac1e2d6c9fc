import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import NimbusCore
import NimbusProtocol

/// The web view (docs/web.md): server-rendered pages at `/` of the same listener, for a browser
/// signed in with a pairing code. A signed-in browser is a device of the account (its token is
/// in an `HttpOnly`, `SameSite=Strict` cookie; `Secure` over TLS), listed and revoked like any.
/// Every change is a form POST that carries the session's CSRF value and comes from this origin
/// (`Origin`, `Sec-Fetch-Site`). Files download as attachments, never rendered by this origin.
struct WebRoutes: Sendable {
    let routes: Routes
    let auth: Authenticator
    /// The listener speaks TLS: the cookie is `Secure`.
    let tls: Bool
    /// A session unused this long is revoked (its next page is the sign-in page).
    let idleSeconds: Int64
    /// When each session was last marked used here: the store is told at most this often.
    let used = LockedDictionary<Int64>()

    static let cookie = "nimbus_web"
    /// Items per folder page.
    static let pageSize = 200

    func register(on router: Router<NimbusContext>) {
        router.get("/") { req, ctx in
            try await self.page(req, ctx) { session, _ in
                guard let session else {
                    // A cookie whose session is over: say why it may have ended.
                    let ended = self.cookie(req).map { _ in "This browser is signed out: it signed out, a device of the account revoked it, or it was unused for \(Self.duration(self.idleSeconds)) (idle sessions end). Sign in again with a new code." }
                    return self.signIn(message: ended, status: .ok, clearCookie: ended != nil, secure: self.overTLS(req, ctx))
                }
                return try await self.home(session)
            }
        }
        asset(router, "web/style.css", type: "text/css; charset=utf-8", HTML.style)
        router.post("web/sign-in") { req, ctx in
            try await self.page(req, ctx, change: true, signedIn: false) { _, form in try await self.signIn(form, req, ctx) }
        }
        signedInForm(router, "web/sign-out") { req, ctx, session, form in
            _ = try await self.routes.store.revokeDevice(account: session.device.accountName, device: session.device.name,
                                                         now: self.routes.clock() / 1_000_000_000)
            try? await self.routes.revocations.check(self.routes.store)
            var r = Self.redirect("/")
            r.headers.append(HTTPField(name: .setCookie, value: self.clearedCookie(secure: self.overTLS(req, ctx))))
            return r
        }
        signedInPage(router, "web/devices") { req, ctx, session in try await self.devices(session) }
        signedInForm(router, "web/devices/:device/revoke") { req, ctx, session, form in
            let name = try ctx.parameters.require("device")
            _ = try await self.routes.store.revokeDevice(account: session.device.accountName, device: name,
                                                         now: self.routes.clock() / 1_000_000_000)
            try? await self.routes.revocations.check(self.routes.store)
            if name == session.device.name {
                var r = Self.redirect("/")
                r.headers.append(HTTPField(name: .setCookie, value: self.clearedCookie(secure: self.overTLS(req, ctx))))
                return r
            }
            return Self.redirect("/web/devices")
        }
        signedInPage(router, "web/c/:container") { req, ctx, session in try await self.folder(req, ctx, session) }
        signedInForm(router, "web/c/:container/new-folder") { req, ctx, session, form in try await self.newFolder(form, ctx, session) }
        signedInForm(router, "web/c/:container/items/:item/rename") { req, ctx, session, form in try await self.change(form, ctx, session, delete: false) }
        signedInForm(router, "web/c/:container/items/:item/delete") { req, ctx, session, form in try await self.change(form, ctx, session, delete: true) }
        signedInPage(router, "web/c/:container/file/:item") { req, ctx, session in try await self.download(req, ctx, session) }
        registerLive(on: router)
        registerItems(on: router)
        registerAccount(on: router)
    }

    /// A file of the pages (the stylesheet, the script), the same for everyone.
    func asset(_ router: Router<NimbusContext>, _ path: String, type: String, _ text: String) {
        router.get(RouterPath(path)) { _, _ in
            var headers = Self.securityHeaders
            headers[.contentType] = type
            headers[.cacheControl] = "max-age=3600"
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: text)))
        }
    }

    /// A page for a signed-in browser at `path` (signed out: to the sign-in page).
    func signedInPage(_ router: Router<NimbusContext>, _ path: String,
                    _ body: @escaping @Sendable (Request, NimbusContext, WebSession) async throws -> Response) {
        router.get(RouterPath(path)) { req, ctx in
            try await self.page(req, ctx) { session, _ in
                guard let session else { return Self.redirect("/") }
                return try await body(req, ctx, session)
            }
        }
    }

    /// A form of a signed-in browser at `path`: from this origin, with the session's CSRF value.
    func signedInForm(_ router: Router<NimbusContext>, _ path: String,
                    _ body: @escaping @Sendable (Request, NimbusContext, WebSession, [String: String]) async throws -> Response) {
        router.post(RouterPath(path)) { req, ctx in
            try await self.page(req, ctx, change: true) { session, form in
                guard let session else { return Self.redirect("/") }
                return try await body(req, ctx, session, form)
            }
        }
    }

    // MARK: sessions

    /// The session token from the `Cookie` header, if any.
    func cookie(_ req: Request) -> String? {
        for header in req.headers[values: .cookie] {
            for part in header.split(separator: ";") {
                let kv = part.trimmingCharacters(in: .whitespaces)
                if kv.hasPrefix(Self.cookie + "="), kv.utf8.count < 200 { return String(kv.dropFirst(Self.cookie.count + 1)) }
            }
        }
        return nil
    }

    /// The browser reached this server over TLS: this listener's, or a trusted proxy's that
    /// says so (`X-Forwarded-Proto: https`, as dist/nginx/nimbus.conf sets it).
    func overTLS(_ req: Request, _ ctx: NimbusContext) -> Bool {
        tls || (routes.trustedProxies.contains(ctx.clientAddress) && req.headers[HTTPField.Name("X-Forwarded-Proto")!] == "https")
    }

    func setCookie(_ token: String, secure: Bool) -> String {
        "\(Self.cookie)=\(token); Path=/; HttpOnly; SameSite=Strict" + (secure ? "; Secure" : "")
    }

    func clearedCookie(secure: Bool) -> String {
        "\(Self.cookie)=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict" + (secure ? "; Secure" : "")
    }

    /// The CSRF value of a session: a MAC of a fixed text under its token, which only this
    /// origin's pages (and the server) can know.
    static func csrf(_ token: String) -> String {
        let mac = HMAC<SHA256>.authenticationCode(for: Data("nimbus web csrf".utf8), using: SymmetricKey(data: Data(token.utf8)))
        return mac.prefix(16).map { String(format: "%02x", $0) }.joined()
    }

    /// The signed-in session of a request, nil when there is none. `use`: the person at the
    /// browser used it (a page, a form, an upload), or the page itself asked (`.check`: live
    /// refresh, `X-Nimbus-Refresh`), which keeps nothing alive. Throws `Expired` for a session
    /// idle longer than `idleSeconds` (it is revoked then).
    func session(_ req: Request, _ use: WebSessionUse? = nil) async throws -> WebSession? {
        guard let token = cookie(req), let device = try await auth.known(token: token) else { return nil }
        let use = use ?? (req.headers[Self.refreshHeader] == nil ? .use : .check)
        // The store keeps when the session was last used, told at most every minute (sooner for
        // short idle times), and revokes it past `idleSeconds`.
        let now = routes.clock() / 1_000_000_000
        let key = device.id.description
        let every = max(0, min(60, idleSeconds / 4))
        if let last = used[key], now - last < every { return WebSession(device: device, csrf: Self.csrf(token)) }
        guard try await routes.store.webSession(device.id, use, now: now, idleSeconds: idleSeconds) else {
            used[key] = nil
            try? await routes.revocations.check(routes.store)
            throw WebRoutes.Expired()
        }
        if use == .use { used[key] = now }
        return WebSession(device: device, csrf: Self.csrf(token))
    }

    /// Sent by the page's script when it reads the page again by itself (live refresh).
    static let refreshHeader = HTTPField.Name("X-Nimbus-Refresh")!

    /// A session that expired when idle: the sign-in page says so.
    struct Expired: Error {}

    /// A change must come from a page of this origin: a browser says where a request comes from
    /// (`Sec-Fetch-Site`, `Origin`); one from another site is refused whatever it carries.
    static func sameOrigin(_ req: Request) -> Bool {
        // A browser that says where the request comes from is believed (a page's script cannot
        // set this header); an older one is judged by `Origin` ("null" is refused).
        if let site = req.headers[HTTPField.Name("Sec-Fetch-Site")!] { return site == "same-origin" || site == "none" }
        if let origin = req.headers[HTTPField.Name("Origin")!] {
            guard let host = req.head.authority, let url = URL(string: origin), let oh = url.host else { return false }
            let originAuthority = url.port.map { "\(oh):\($0)" } ?? oh
            return originAuthority.lowercased() == host.lowercased()
        }
        return true
    }

    /// Runs a page's handler with the session (nil when not signed in) and turns its errors into
    /// an HTML page that says what happened. `change`: a POST that must come from this origin
    /// and (when `signedIn`) carry the session's CSRF value.
    func page(_ req: Request, _ ctx: NimbusContext, change: Bool = false, signedIn: Bool = true,
              _ body: (WebSession?, [String: String]) async throws -> Response) async throws -> Response {
        var session: WebSession? = nil
        do {
            do {
                session = try await self.session(req)
            } catch is Expired {
                return signIn(message: "You were signed out: this browser's session was not used for \(Self.duration(idleSeconds)) (idle sessions end). Sign in again with a new code.",
                              status: .unauthorized, clearCookie: true, secure: overTLS(req, ctx))
            }
            var form: [String: String] = [:]
            if change {
                guard Self.sameOrigin(req) else {
                    return Self.html(HTML.page(title: "Refused", session: nil, body: "<h1>Refused</h1><p class=\"error\">This change came from another site; nothing was done.</p>"),
                                     status: .forbidden)
                }
                form = try await Self.form(req)
                if signedIn, session != nil {
                    guard let sent = form["csrf"], sent == session?.csrf else {
                        return Self.html(HTML.page(title: "Refused", session: session, body: "<h1>Refused</h1><p class=\"error\">This form is out of date or did not come from this site; nothing was done. Go back, reload the page and try again.</p>"),
                                         status: .forbidden)
                    }
                }
            }
            return try await body(session, form)
        } catch {
            let e = ErrorMiddleware.apiError(error, request: req, logger: ctx.logger)
            let text = "<h1>\(HTML.text(Self.title(e)))</h1><p class=\"error\">\(HTML.text(e.message))</p><p><a href=\"/\">Back to the start</a></p>"
            return Self.html(HTML.page(title: Self.title(e), session: session, body: text), status: .init(code: e.code.httpStatus))
        }
    }

    static func title(_ e: APIError) -> String {
        switch e.code.httpStatus {
        case 404: "Not found"
        case 429: "Too many attempts"
        case 400..<500: "Cannot do that"
        default: "Server trouble"
        }
    }

    /// A form body (`application/x-www-form-urlencoded`), at most 16 KiB; read once per request.
    static func form(_ req: Request) async throws -> [String: String] {
        var request = req
        let buffer = try await request.collectBody(upTo: 16 << 10)
        var out: [String: String] = [:]
        for pair in String(buffer: buffer).split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func decode(_ s: Substring) -> String? { s.replacingOccurrences(of: "+", with: " ").removingPercentEncoding }
            guard let k = decode(kv[0]), let v = kv.count > 1 ? decode(kv[1]) : "" else { continue }
            out[k] = v
        }
        return out
    }

    static var securityHeaders: HTTPFields {
        var h = HTTPFields()
        h[HTTPField.Name("Content-Security-Policy")!] =
            "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        h[HTTPField.Name("X-Frame-Options")!] = "DENY"
        h[HTTPField.Name("X-Content-Type-Options")!] = "nosniff"
        h[HTTPField.Name("Referrer-Policy")!] = "same-origin"
        return h
    }

    static func html(_ page: String, status: HTTPResponse.Status = .ok) -> Response {
        var headers = securityHeaders
        headers[.contentType] = "text/html; charset=utf-8"
        headers[.cacheControl] = "no-store"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: page)))
    }

    static func redirect(_ location: String) -> Response {
        var headers = securityHeaders
        headers[.location] = location
        headers[.cacheControl] = "no-store"
        return Response(status: .seeOther, headers: headers)
    }

    // MARK: pages

    func signIn(message: String?, status: HTTPResponse.Status, clearCookie: Bool, secure: Bool = false) -> Response {
        var body = "<h1>Sign in</h1>"
        if let message { body += "<p class=\"error\" id=\"message\">\(HTML.text(message))</p>" }
        body += """
            <p>On a device enrolled in your account, run <code>nimbus device add NAME</code> (NAME: what
            this browser is called in your list of devices) and enter the code it prints.</p>
            <form method="post" action="/web/sign-in">
            <label for="code">Pairing code</label>
            <input type="text" id="code" name="code" autocomplete="one-time-code" autocapitalize="characters"
             spellcheck="false" maxlength="32" placeholder="XXXX-XXXX-XXXX" required autofocus>
            <button type="submit" id="sign-in">Sign in</button></form>
            """
        var r = Self.html(HTML.page(title: "Sign in", session: nil, body: body), status: status)
        if clearCookie { r.headers.append(HTTPField(name: .setCookie, value: clearedCookie(secure: secure))) }
        return r
    }

    func signIn(_ form: [String: String], _ req: Request, _ ctx: NimbusContext) async throws -> Response {
        let client = routes.client(req, ctx)
        try routes.pairing.check(client)
        guard let code = form["code"].flatMap(PairingLimits.normalize) else {
            routes.pairing.wrong(client)
            return signIn(message: "That is not a pairing code (XXXX-XXXX-XXXX). Make one on an enrolled device with `nimbus device add NAME`.",
                          status: .badRequest, clearCookie: false)
        }
        let token = TokenHash.newToken()
        guard let device = try await routes.store.redeemPairing(codeHash: TokenHash.of(code), deviceName: nil, tokenHash: TokenHash.of(token),
                                                                now: routes.clock() / 1_000_000_000) else {
            routes.pairing.wrong(client)
            return signIn(message: "This pairing code is unknown, already used or expired (codes work once, for \(PairingLimits.lifetimeSeconds / 60) minutes). Make a new one with `nimbus device add NAME`.",
                          status: .unauthorized, clearCookie: false)
        }
        _ = try await routes.store.webSession(device.id, .start, now: routes.clock() / 1_000_000_000, idleSeconds: idleSeconds)
        used[device.id.description] = routes.clock() / 1_000_000_000
        var r = Self.redirect("/")
        r.headers.append(HTTPField(name: .setCookie, value: setCookie(token, secure: overTLS(req, ctx))))
        return r
    }

    /// "12 hours", "90 seconds": a duration as people say it.
    static func duration(_ seconds: Int64) -> String {
        func n(_ v: Int64, _ unit: String) -> String { "\(v) \(unit)\(v == 1 ? "" : "s")" }
        if seconds % 86_400 == 0 { return n(seconds / 86_400, "day") }
        if seconds % 3_600 == 0 { return n(seconds / 3_600, "hour") }
        if seconds % 60 == 0 { return n(seconds / 60, "minute") }
        return n(seconds, "second")
    }

    func home(_ s: WebSession) async throws -> Response {
        let names = try await routes.store.containers(account: s.device.accountID)
        var body = "<h1>Containers</h1>"
        if names.isEmpty {
            body += "<p class=\"muted\">No containers yet: mount one on a device (<code>nimbus mount</code>) and it appears here.</p>"
        } else {
            body += "<ul id=\"containers\">"
            for n in names { body += "<li><a href=\"/web/c/\(HTML.component(n))\">\(HTML.name(n))</a></li>" }
            body += "</ul>"
        }
        return Self.html(HTML.page(title: "Containers", session: s, body: body))
    }

    func devices(_ s: WebSession) async throws -> Response {
        let all = try await routes.store.devices(account: s.device.accountName)
        var body = "<h1>Devices</h1><table id=\"devices\"><thead><tr><th>Name</th><th>Enrolled</th><th>State</th><th></th></tr></thead><tbody>"
        for d in all {
            body += "<tr><td class=\"name\">\(HTML.name(d.name))\(d.id == s.device.id ? " <span class=\"muted\">(this browser)</span>" : "")</td>"
            if let used = d.webUsed, d.revoked == nil {
                body += "<td>\(HTML.time(d.created * 1_000_000_000)) <span class=\"muted\">web, idle expiry after \(Self.duration(idleSeconds)); last used \(HTML.time(used * 1_000_000_000))</span></td>"
            } else {
                body += "<td>\(HTML.time(d.created * 1_000_000_000))</td>"
            }
            if let r = d.revoked {
                body += "<td class=\"muted\">revoked \(HTML.time(r * 1_000_000_000))</td><td></td></tr>"
            } else {
                body += "<td>active</td><td><form method=\"post\" action=\"/web/devices/\(HTML.component(d.name))/revoke\">"
                body += "<input type=\"hidden\" name=\"csrf\" value=\"\(HTML.attribute(s.csrf))\">"
                body += "<button type=\"submit\">Revoke</button></form></td></tr>"
            }
        }
        body += "</tbody></table><h2>Add a device</h2>"
        body += "<form method=\"post\" action=\"/web/devices/pairing\" class=\"bar\"><input type=\"hidden\" name=\"csrf\" value=\"\(HTML.attribute(s.csrf))\">"
        body += "<input type=\"text\" name=\"name\" id=\"pairing-new-name\" placeholder=\"Name of the new device\" required maxlength=\"255\">"
        body += "<button type=\"submit\" id=\"make-pairing\">Make a pairing code</button></form>"
        return Self.html(HTML.page(title: "Devices", session: s, body: body))
    }

    func container(_ ctx: NimbusContext, _ s: WebSession) async throws -> ContainerRecord {
        let name = try ctx.parameters.require("container")
        if let problem = ContainerName.problem(name) { throw APIError(.invalidContainerName, problem) }
        guard let c = try await routes.store.container(account: s.device.accountID, name: name, create: false) else {
            throw APIError.containerNotFound(name)
        }
        return c
    }

    func folder(_ req: Request, _ ctx: NimbusContext, _ s: WebSession) async throws -> Response {
        let c = try await container(ctx, s)
        let folder: ItemID
        if let f = req.uri.queryParameters.get("folder") {
            guard let id = ItemID(String(f)) else { throw APIError(.invalidParameter, "folder must be an item id") }
            folder = id
        } else {
            folder = .root
        }
        let after = req.uri.queryParameters.get("after").map { String($0) }
        if let after, after.utf8.count > 1024 { throw APIError(.invalidParameter, "after is a name, at most 1,024 bytes") }
        // The path from the root, for the breadcrumbs; a folder that is gone is not found.
        let trail = try await self.trail(c, to: folder)
        let page = try await routes.store.children(of: folder, in: c, after: after, limit: Self.pageSize + 1)
        let shown = page.prefix(Self.pageSize)
        let names = Dictionary(try await routes.store.devices(account: s.device.accountName).map { ($0.id, $0.name) }, uniquingKeysWith: { a, _ in a })
        let base = "/web/c/\(HTML.component(c.name))"
        var body = Self.uploadPanel + "<div id=\"live\"><nav class=\"crumbs\" id=\"crumbs\"><a href=\"/\">Containers</a> / <a href=\"\(base)\">\(HTML.name(c.name))</a>"
        for (i, f) in trail.enumerated() {
            body += " / " + (i == trail.count - 1 ? "<span>\(HTML.name(f.name))</span>"
                             : "<a href=\"\(base)?folder=\(f.id)\">\(HTML.name(f.name))</a>")
        }
        body += "</nav><p class=\"side\"><a id=\"trash-link\" href=\"\(base)/trash\">Recently Deleted</a></p>"
        let cursor = try await routes.store.cursor(of: c)
        let csrf = "<input type=\"hidden\" name=\"csrf\" value=\"\(HTML.attribute(s.csrf))\">"
        body += "<form method=\"post\" action=\"\(base)/new-folder\" class=\"bar\">\(csrf)"
        body += "<input type=\"hidden\" name=\"folder\" value=\"\(folder.isRoot ? "" : folder.description)\">"
        body += "<input type=\"text\" name=\"name\" id=\"new-folder-name\" placeholder=\"New folder\" required maxlength=\"255\">"
        body += "<button type=\"submit\" id=\"new-folder\">New folder</button></form>"
        body += "<table id=\"items\"><thead><tr><th>Name</th><th class=\"num\">Size</th><th>Modified</th><th>By</th><th></th><th></th></tr></thead><tbody>"
        for item in shown {
            let name = HTML.name(item.name.value)
            let link: String
            switch item.kind {
            case .folder: link = "<a class=\"folder\" href=\"\(base)?folder=\(item.id)\">\(name)/</a>"
            case .file: link = "<a class=\"file\" href=\"\(base)/file/\(item.id)\" download>\(name)</a>"
            case .symlink: link = "\(name) <span class=\"muted\">→ \(HTML.text(item.symlinkTarget ?? ""))</span>"
            }
            body += "<tr data-id=\"\(item.id)\"><td class=\"name\">\(link)</td>"
            let size = item.kind == ItemKind.file ? HTML.size(item.size) : ""
            body += "<td class=\"num\">\(size)</td>"
            body += "<td>\(HTML.time(item.modified))</td><td>\(HTML.name(names[item.modifiedBy] ?? "unknown device"))</td>"
            let at = "\(base)/items/\(item.id)"
            body += "<td>\(item.conflicts > 0 ? "<a class=\"conflict\" href=\"\(at)\">\(item.conflicts) conflict\(item.conflicts == 1 ? "" : "s")</a>" : "")</td>"
            body += "<td class=\"actions\"><form method=\"post\" action=\"\(at)/rename\">\(csrf)"
            body += "<input type=\"hidden\" name=\"version\" value=\"\(item.version)\">"
            body += "<input type=\"text\" name=\"name\" value=\"\(HTML.attribute(item.name.value))\" required maxlength=\"255\" aria-label=\"New name\">"
            body += "<button type=\"submit\" class=\"rename\">Rename</button></form>"
            body += "<form method=\"post\" action=\"\(at)/delete\">\(csrf)<input type=\"hidden\" name=\"version\" value=\"\(item.version)\">"
            body += "<input type=\"hidden\" name=\"cursor\" value=\"\(cursor)\"><button type=\"submit\" class=\"delete\">Delete</button></form>"
            body += "<a class=\"move\" href=\"\(at)/move\">Move</a>"
            if item.kind == .file { body += " <a class=\"versions\" href=\"\(at)\">Versions</a>" }
            body += "</td></tr>"
        }
        body += "</tbody></table>"
        if shown.isEmpty, after == nil { body += "<p class=\"muted\" id=\"empty\">This folder is empty.</p>" }
        if page.count > Self.pageSize, let last = shown.last {
            let f = folder.isRoot ? "" : "folder=\(folder)&"
            body += "<p><a id=\"next\" href=\"\(base)?\(f)after=\(HTML.component(last.name.value))\">Next page</a></p>"
        }
        body += "</div>"
        let title = trail.last?.name ?? c.name
        return Self.html(HTML.page(title: title, session: s, body: body,
                                   data: ["watch": "\(base)/changes", "cursor": "\(cursor)", "upload": "\(base)/upload",
                                          "folder": folder.isRoot ? "" : folder.description]))
    }

    /// The upload controls of a folder page, shown by the script (uploads need it).
    static let uploadPanel = """
        <section id="upload" hidden><label>Upload files <input type="file" id="upload-files" multiple></label>
        <label>Upload a folder <input type="file" id="upload-folder" webkitdirectory multiple></label>
        <span class="muted">or drop files and folders on this page</span>
        <div><progress id="upload-progress" value="0" max="1"></progress> <span id="upload-state"></span></div>
        <ul id="uploads"></ul></section><noscript><p class="muted">Uploading needs JavaScript; everything else works without it.</p></noscript>
        """

    /// The page of folder `id` in container `c`.
    static func folderURL(_ c: ContainerRecord, _ id: ItemID) -> String {
        "/web/c/\(HTML.component(c.name))" + (id.isRoot ? "" : "?folder=\(id)")
    }

    static func name(_ form: [String: String]) throws -> ItemName {
        let raw = form["name"] ?? ""
        do { return try ItemName(raw) } catch { throw APIError(.invalidName, "\(error): \(raw.prefix(300).debugDescription)") }
    }

    /// A new folder, committed by this browser's device like any device's mkdir.
    func newFolder(_ form: [String: String], _ ctx: NimbusContext, _ s: WebSession) async throws -> Response {
        let c = try await container(ctx, s)
        let parent = try form["folder"].flatMap { $0.isEmpty ? nil : $0 }.map { f -> ItemID in
            guard let id = ItemID(f) else { throw APIError(.invalidParameter, "folder must be an item id") }
            return id
        } ?? .root
        let draft = ItemDraft(kind: .folder, parent: parent, name: try Self.name(form), mode: 0o755, modified: routes.clock())
        let r = try await routes.store.commit(CommitRequest(item: ItemID(UUID()), baseVersion: nil, state: draft), in: c, by: s.device,
                                              now: routes.clock())
        routes.committed(c, r)
        return Self.redirect(Self.folderURL(c, parent))
    }

    /// A rename or a delete of an item as the page showed it (`version`, and for a delete the
    /// container's `cursor` when the page was made): the server's rules decide as for any
    /// device's commit on that base — a delete of an item edited since is ignored (edits win),
    /// a rename and an edit made elsewhere both apply.
    func change(_ form: [String: String], _ ctx: NimbusContext, _ s: WebSession, delete: Bool) async throws -> Response {
        let c = try await container(ctx, s)
        guard let id = ItemID(try ctx.parameters.require("item")) else { throw APIError(.invalidParameter, "not an item id") }
        guard let version = form["version"].flatMap({ Int64($0) }), version > 0 else {
            throw APIError(.invalidVersion, "the form lacks the version the page showed; reload the page")
        }
        guard let current = try await routes.store.item(id, in: c), !current.deleted else {
            throw APIError(.notFound, "this item is not in \(c.name) any more (deleted, or moved into Recently Deleted)")
        }
        var draft = ItemDraft(current)
        if delete { draft.deleted = true } else { draft.name = try Self.name(form) }
        let seen = delete ? form["cursor"].flatMap { Int64($0) }.map { max(0, $0) } : nil
        let r = try await routes.store.commit(CommitRequest(item: id, baseVersion: version, state: draft, seenCursor: seen), in: c,
                                              by: s.device, now: routes.clock())
        routes.committed(c, r)
        return Self.redirect(Self.folderURL(c, current.parent))
    }

    /// A file's bytes as an attachment (one byte range with `Range`), streamed chunk by chunk.
    func download(_ req: Request, _ ctx: NimbusContext, _ s: WebSession) async throws -> Response {
        let c = try await container(ctx, s)
        let idText = try ctx.parameters.require("item")
        guard let id = ItemID(idText) else { throw APIError(.invalidParameter, "not an item id") }
        // What it is first (cheap): a folder or a deleted item is refused without reading its state.
        guard let p = try await routes.store.place(of: id, in: c), !p.deleted, p.kind == .file,
              var item = try await routes.store.item(id, in: c), !item.deleted, item.kind == .file else {
            throw APIError(.notFound, "this file is not in \(c.name) any more (deleted, or moved into Recently Deleted)")
        }
        // An earlier or conflict version (the file's page links them): its bytes, the current name.
        if let v = req.uri.queryParameters.get("version") {
            guard let version = Int64(v), version >= 1, version < Int64.max else { throw APIError(.invalidParameter, "version is a version number") }
            guard let old = try await routes.store.versions(of: id, in: c, before: version + 1).versions.first(where: { $0.version == version }),
                  old.state.kind == .file, !old.state.deleted else {
                throw APIError(.versionNotFound, "this file has no version \(version) any more (the server keeps earlier versions for a while); see its page for the versions it has")
            }
            let name = item.name
            item = old.state
            item.name = name
        }
        var headers = Self.securityHeaders
        headers[.contentType] = "application/octet-stream"
        headers[HTTPField.Name("Content-Disposition")!] = Self.attachment(item.name.value)
        headers[HTTPField.Name("Content-Security-Policy")!] = "default-src 'none'; sandbox"
        headers[.acceptRanges] = "bytes"
        headers[.cacheControl] = "private, no-cache"
        var status = HTTPResponse.Status.ok
        var range: Range<Int64> = 0..<item.size
        if let header = req.headers[.range], item.size > 0 {
            range = try ByteRange.parse(header, size: item.size)
            status = .partialContent
            headers[.contentRange] = "bytes \(range.lowerBound)-\(range.upperBound - 1)/\(item.size)"
        }
        // The pieces of chunks that cover the range (nil range: the whole chunk, checked against
        // its hash as it streams).
        var pieces: [WebPiece] = []
        var offset: Int64 = 0
        for chunk in item.chunks {
            let whole = offset..<(offset + chunk.size)
            let part = whole.clamped(to: range)
            if !part.isEmpty {
                pieces.append(WebPiece(hash: chunk.hash, size: chunk.size,
                                       range: part == whole ? nil : (part.lowerBound - offset)..<(part.upperBound - offset)))
            }
            offset += chunk.size
        }
        let chunks = routes.chunks, metrics = routes.metrics, logger = ctx.logger
        // The first piece opens before the status line goes, so a missing chunk is a clear error.
        var first: ChunkReader? = nil
        if let p = pieces.first {
            guard let r = try await chunks.open(p.hash, range: p.range) else { throw WebPiece.missing(p.hash) }
            first = r
        }
        let length = range.upperBound - range.lowerBound
        let (allPieces, opened) = (pieces, first)
        let body = ResponseBody(contentLength: Int(length)) { writer in
            // Small pieces go out together; a small chunk read whole is kept for the next piece
            // of the same chunk (a file of zeros is one chunk many times over).
            var out = ByteBuffer()
            var kept: (hash: ContentHash, bytes: ByteBuffer)? = nil
            func send(_ b: ByteBuffer) async throws {
                var b = b
                out.writeBuffer(&b)
                if out.readableBytes >= 64 << 10 { try await flush() }
            }
            func flush() async throws {
                guard out.readableBytes > 0 else { return }
                metrics.bytesOut.increment(by: Int64(out.readableBytes))
                try await writer.write(out)
                out = ByteBuffer()
            }
            for (i, p) in allPieces.enumerated() {
                if let k = kept, k.hash == p.hash {
                    let r = p.range ?? 0..<p.size
                    try await send(k.bytes.getSlice(at: Int(r.lowerBound), length: Int(r.upperBound - r.lowerBound)) ?? ByteBuffer())
                    continue
                }
                let reader: ChunkReader
                if i == 0, let opened { reader = opened } else {
                    guard let r = try await chunks.open(p.hash, range: p.range) else {
                        logger.error("web download of \(id): chunk \(p.hash) missing; cut the response")
                        throw WebPiece.missing(p.hash)
                    }
                    reader = r
                }
                var whole = p.range == nil && p.size <= 1 << 20 ? ByteBuffer() : nil
                for try await piece in reader {
                    if whole != nil { var copy = piece; whole!.writeBuffer(&copy) }
                    try await send(piece)
                }
                if let whole { kept = (p.hash, whole) }
            }
            try await flush()
            try await writer.finish(nil)
        }
        return Response(status: status, headers: headers, body: body)
    }

    /// `Content-Disposition` for a download named `name`: an ASCII stand-in and the UTF-8 name.
    static func attachment(_ name: String) -> String {
        let ascii = String(name.unicodeScalars.map { $0.isASCII && $0.value >= 0x20 && $0 != "\"" && $0 != "\\" && $0.value != 0x7F ? Character($0) : "_" })
        return "attachment; filename=\"\(ascii)\"; filename*=UTF-8''\(HTML.component(name))"
    }
}

/// A piece of a download: chunk `hash` of `size` bytes, all of it or `range` of it.
struct WebPiece: Sendable {
    var hash: ContentHash
    var size: Int64
    var range: Range<Int64>?

    static func missing(_ h: ContentHash) -> APIError {
        APIError(.unavailable, "a piece of this file (chunk \(h)) is missing on the server; upload the file again from a device that has it")
    }
}
