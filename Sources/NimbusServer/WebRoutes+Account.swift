import Foundation
import Hummingbird
import NimbusCore
import NimbusProtocol

/// Recently Deleted (docs/trash.md), the account's usage and quota, and pairing codes made from
/// the web view (docs/web.md).
extension WebRoutes {
    func registerAccount(on router: Router<NimbusContext>) {
        signedInPage(router, "web/c/:container/trash") { req, ctx, session in try await self.trashPage(req, ctx, session) }
        signedInForm(router, "web/c/:container/trash/:item/restore") { req, ctx, session, form in
            let c = try await self.container(ctx, session)
            let id = try Self.itemID(ctx)
            let r = try await self.routes.store.restoreTrash(id, to: nil, in: c, by: session.device, now: self.routes.clock())
            self.routes.metrics.commits.increment()
            self.routes.notifier.notify(container: c.id, seq: r.cursor)
            return Self.redirect(Self.folderURL(c, r.item.parent))
        }
        signedInForm(router, "web/c/:container/trash/:item/purge") { req, ctx, session, form in
            let c = try await self.container(ctx, session)
            let id = try Self.itemID(ctx)
            let r = try await self.routes.store.purgeTrash([id], in: c)
            if r.entries == 0 { throw Routes.notInTrash(id) }
            self.routes.metrics.purged(r)
            ctx.logger.info("Recently Deleted: purged entry \(id) (\(r.items) item(s), \(r.bytes) bytes) from the web view of device \(session.device.id)")
            return Self.redirect("/web/c/\(HTML.component(c.name))/trash")
        }
        signedInForm(router, "web/c/:container/trash/purge") { req, ctx, session, form in
            let c = try await self.container(ctx, session)
            let r = try await self.routes.store.purgeTrash(nil, in: c)
            self.routes.metrics.purged(r)
            ctx.logger.info("Recently Deleted: purged all \(r.entries) entries (\(r.items) item(s), \(r.bytes) bytes) from the web view of device \(session.device.id)")
            return Self.redirect("/web/c/\(HTML.component(c.name))/trash")
        }
        signedInPage(router, "web/usage") { req, ctx, session in try await self.usagePage(session) }
        signedInForm(router, "web/devices/pairing") { req, ctx, session, form in
            let url = (self.overTLS(req, ctx) ? "https://" : "http://") + (req.head.authority ?? "SERVER")
            return try await self.pairingCode(form, session, url: url)
        }
    }

    /// `GET …/trash?after=CURSOR`: the container's Recently Deleted entries, newest first, with
    /// where each was, when and by which device it was deleted, and when the server purges it.
    func trashPage(_ req: Request, _ ctx: NimbusContext, _ s: WebSession) async throws -> Response {
        let c = try await container(ctx, s)
        let after = try req.uri.queryParameters.get("after").map { a -> TrashCursor in
            guard let cursor = TrashCursor(String(a)) else { throw APIError(.invalidParameter, "after must be a \"next page\" link's value") }
            return cursor
        }
        let rows = try await routes.store.trash(in: c, after: after, limit: Self.pageSize + 1)
        let shown = rows.prefix(Self.pageSize).map(routes.entry)
        let names = Dictionary(try await routes.store.devices(account: s.device.accountName).map { ($0.id, $0.name) }, uniquingKeysWith: { a, _ in a })
        let base = "/web/c/\(HTML.component(c.name))"
        let csrf = "<input type=\"hidden\" name=\"csrf\" value=\"\(HTML.attribute(s.csrf))\">"
        var body = "<div id=\"live\"><nav class=\"crumbs\" id=\"crumbs\"><a href=\"/\">Containers</a> / <a href=\"\(base)\">\(HTML.name(c.name))</a> / <span>Recently Deleted</span></nav>"
        body += "<h1>Recently Deleted</h1><p class=\"muted\">What was deleted on any device stays here for \(routes.trashKeepSeconds / 86_400) days, then the server purges it. Restore brings an item back where it was, on every device.</p>"
        if after == nil, !shown.isEmpty {
            let t = try await routes.store.trashTotals(in: c)
            body += "<form method=\"post\" action=\"\(base)/trash/purge\" class=\"bar\">\(csrf)<span id=\"trash-total\">\(t.entries) entr\(t.entries == 1 ? "y" : "ies"), \(HTML.size(t.bytes))</span> "
            body += "<button type=\"submit\" id=\"empty-trash\">Delete all forever</button></form>"
        }
        body += "<table id=\"trash\"><thead><tr><th>Name</th><th>Was in</th><th class=\"num\">Size</th><th>Deleted</th><th>By</th><th>Purged after</th><th></th></tr></thead><tbody>"
        for e in shown {
            let folder = e.path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
            body += "<tr data-id=\"\(e.item.id)\"><td class=\"name\">\(HTML.name(e.item.name.value))\(e.item.kind == .folder ? "/" : "")"
            if e.items > 1 { body += " <span class=\"muted\">(\(e.items) items)</span>" }
            body += "</td><td>\(HTML.name("/" + folder))</td><td class=\"num\">\(HTML.size(e.bytes))</td><td>\(HTML.time(e.deletedAt))</td>"
            body += "<td>\(HTML.name(names[e.deletedBy] ?? "unknown device"))</td><td>\(HTML.time(e.expires))</td><td class=\"actions\">"
            body += "<form method=\"post\" action=\"\(base)/trash/\(e.item.id)/restore\">\(csrf)<button type=\"submit\" class=\"restore\">Restore</button></form>"
            body += "<form method=\"post\" action=\"\(base)/trash/\(e.item.id)/purge\">\(csrf)<button type=\"submit\" class=\"purge\">Delete forever</button></form></td></tr>"
        }
        body += "</tbody></table>"
        if shown.isEmpty, after == nil { body += "<p class=\"muted\" id=\"empty\">Nothing was deleted recently.</p>" }
        if rows.count > Self.pageSize, let last = shown.last {
            body += "<p><a id=\"next\" href=\"\(base)/trash?after=\(HTML.component(TrashCursor(deletedAt: last.deletedAt, id: last.item.id).text))\">Next page</a></p>"
        }
        body += "</div>"
        let cursor = try await routes.store.cursor(of: c)
        return Self.html(HTML.page(title: "Recently Deleted", session: s, body: body, data: ["watch": "\(base)/changes", "cursor": "\(cursor)"]))
    }

    /// `GET /web/usage`: what the account stores (each chunk once, whatever shares it), its
    /// quota, and how much of it Recently Deleted holds.
    func usagePage(_ s: WebSession) async throws -> Response {
        guard let u = try await routes.store.accountUsage(account: s.device.accountName).first else {
            throw APIError(.notFound, "this account has no usage figures")
        }
        var body = "<h1>Usage</h1><div class=\"usage\" id=\"usage\">"
        body += "<p><span id=\"used\">\(HTML.size(u.figures.usage))</span> used"
        if let q = u.figures.quota {
            body += " of <span id=\"quota\">\(HTML.size(q))</span> (\(q > 0 ? "\(min(100, u.figures.usage * 100 / q))" : "100")%)</p>"
            body += "<p><progress value=\"\(min(u.figures.usage, q))\" max=\"\(max(q, 1))\"></progress></p>"
        } else {
            body += "; this account has no quota</p>"
        }
        body += "<p>\(HTML.size(u.trash)) of it in Recently Deleted (purged first, oldest first, when an upload would pass the quota); \(HTML.size(u.metadata)) of it the history and journal of your files. Files whose bytes are equal are stored once.</p></div>"
        return Self.html(HTML.page(title: "Usage", session: s, body: body))
    }

    /// A pairing code for a new device named in the form, made by this browser's device (as
    /// `nimbus device add NAME` makes one): shown once.
    func pairingCode(_ form: [String: String], _ s: WebSession, url: String) async throws -> Response {
        let name = (form["name"] ?? "").trimmingCharacters(in: .whitespaces)
        if let problem = DeviceNames.problem(name) { throw APIError(.invalidName, problem) }
        var rng = SystemRandomNumberGenerator()
        let code = String((0..<PairingLimits.length).map { _ in PairingLimits.alphabet.randomElement(using: &rng)! })
        let expires = routes.clock() / 1_000_000_000 + PairingLimits.lifetimeSeconds
        try await routes.store.addPairing(account: s.device.accountID, codeHash: TokenHash.of(code), deviceName: name, createdBy: s.device.id,
                                          expires: expires)
        var body = "<h1>Pairing code</h1><p>On the new device, run</p>"
        body += "<pre id=\"pairing-command\">nimbus login \(HTML.text(url)) --code <span id=\"pairing-code\">\(HTML.text(PairingLimits.display(code)))</span> --state DIR</pre>"
        body += "<p>or enter the code on this server's sign-in page in another browser. It works once, until \(HTML.time(expires * 1_000_000_000)); the device will be called <bdi id=\"pairing-name\">\(HTML.text(name))</bdi>.</p>"
        body += "<p><a href=\"/web/devices\">Back to the devices</a></p>"
        return Self.html(HTML.page(title: "Pairing code", session: s, body: body))
    }
}
