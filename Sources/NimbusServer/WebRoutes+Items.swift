import Foundation
import Hummingbird
import NimbusCore
import NimbusProtocol

/// A file's page (its versions and conflicts, with restore and resolve) and moving an item
/// (docs/web.md). Every change is a commit or a resolve of this browser's device, decided by the
/// server's ordinary rules.
extension WebRoutes {
    func registerItems(on router: Router<NimbusContext>) {
        signedInPage(router, "web/c/:container/items/:item") { req, ctx, session in try await self.itemPage(req, ctx, session) }
        signedInForm(router, "web/c/:container/items/:item/resolve") { req, ctx, session, form in try await self.resolve(form, ctx, session) }
        signedInPage(router, "web/c/:container/items/:item/move") { req, ctx, session in try await self.movePage(req, ctx, session) }
        signedInForm(router, "web/c/:container/items/:item/move") { req, ctx, session, form in try await self.move(form, ctx, session) }
    }

    static func itemID(_ ctx: NimbusContext) throws -> ItemID {
        guard let id = ItemID(try ctx.parameters.require("item")) else { throw APIError(.invalidParameter, "not an item id") }
        return id
    }

    /// The folders from the root down to `folder` (not the root itself); a folder that is gone
    /// (deleted, or not a folder) is not found.
    func trail(_ c: ContainerRecord, to folder: ItemID) async throws -> [(id: ItemID, name: String)] {
        var trail: [(id: ItemID, name: String)] = []
        var at = folder
        while !at.isRoot {
            guard trail.count < 512, let p = try await routes.store.place(of: at, in: c), !p.deleted, p.kind == .folder else {
                throw APIError(.notFound, "this folder is not in \(c.name) any more (deleted, or moved into Recently Deleted)")
            }
            trail.append((at, p.name))
            at = p.parent
        }
        return trail.reversed()
    }

    /// The breadcrumbs of the folder `folder`, each a link (the `<nav>` is left open).
    func crumbs(_ c: ContainerRecord, to folder: ItemID, link: (ItemID) -> String) async throws -> String {
        var out = "<nav class=\"crumbs\" id=\"crumbs\"><a href=\"/\">Containers</a> / <a href=\"\(link(.root))\">\(HTML.name(c.name))</a>"
        for f in try await trail(c, to: folder) { out += " / <a href=\"\(link(f.id))\">\(HTML.name(f.name))</a>" }
        return out
    }

    /// `GET …/items/ID?before=V`: a file's versions, newest first (current, conflicts, earlier
    /// ones the server kept): each downloads; an earlier one can be made current again
    /// (`restore`), a conflict kept (`keep_version`) or the current one kept (`keep_current`).
    func itemPage(_ req: Request, _ ctx: NimbusContext, _ s: WebSession) async throws -> Response {
        let c = try await container(ctx, s)
        let id = try Self.itemID(ctx)
        guard let item = try await routes.store.item(id, in: c), !item.deleted else {
            throw APIError(.notFound, "this item is not in \(c.name) any more (deleted, or moved into Recently Deleted)")
        }
        let before = try req.uri.queryParameters.get("before").map { b -> Int64 in
            guard let v = Int64(b), v >= 1 else { throw APIError(.invalidParameter, "before is a version number") }
            return v
        }
        let page = try await routes.store.versions(of: id, in: c, before: before)
        let base = "/web/c/\(HTML.component(c.name))"
        var body = "<div id=\"live\">" + (try await crumbs(c, to: item.parent) { Self.folderURL(c, $0) })
        body += " / <span>\(HTML.name(item.name.value))</span></nav>"
        body += "<h1>\(HTML.name(item.name.value))</h1>"
        let csrf = "<input type=\"hidden\" name=\"csrf\" value=\"\(HTML.attribute(s.csrf))\">"
        let at = "\(base)/items/\(id)"
        if item.conflicts > 0 {
            body += "<p class=\"conflict\" id=\"conflict-note\">Edits made at the same time on different devices: \(item.conflicts) conflict version\(item.conflicts == 1 ? "" : "s") beside the current one. Keep one of them, or keep the current version; what you do not keep stays below as an earlier version.</p>"
            body += "<form method=\"post\" action=\"\(at)/resolve\" class=\"bar\">\(csrf)<input type=\"hidden\" name=\"action\" value=\"keep_current\">"
            body += "<button type=\"submit\" id=\"keep-current\">Keep the current version</button></form>"
        }
        body += "<table id=\"versions\"><thead><tr><th>Version</th><th></th><th class=\"num\">Size</th><th>Modified</th><th>By</th><th></th></tr></thead><tbody>"
        for v in page.versions {
            let role: String
            switch v.role {
            case .current: role = "current"
            case .conflict: role = "<span class=\"conflict\">conflict</span>"
            case .previous: role = "<span class=\"muted\">earlier</span>"
            }
            body += "<tr data-version=\"\(v.version)\" data-role=\"\(v.role.rawValue)\"><td>\(v.version)</td><td>\(role)</td>"
            body += "<td class=\"num\">\(v.state.kind == .file ? HTML.size(v.state.size) : "")</td>"
            body += "<td>\(HTML.time(v.state.modified))</td><td>\(HTML.name(v.deviceName))</td><td class=\"actions\">"
            if v.state.kind == .file, !v.state.deleted {
                body += "<a class=\"download\" href=\"\(base)/file/\(id)\(v.role == .current ? "" : "?version=\(v.version)")\" download>Download</a> "
            }
            let action: (name: String, label: String)? = switch v.role {
            case .current: nil
            case .conflict: ("keep_version", "Keep this version")
            case .previous: v.state.deleted ? nil : ("restore", "Restore")
            }
            if let action {
                body += "<form method=\"post\" action=\"\(at)/resolve\">\(csrf)<input type=\"hidden\" name=\"action\" value=\"\(action.name)\">"
                body += "<input type=\"hidden\" name=\"version\" value=\"\(v.version)\"><button type=\"submit\" class=\"\(action.name)\">\(action.label)</button></form>"
            }
            body += "</td></tr>"
        }
        body += "</tbody></table>"
        if let next = page.next { body += "<p><a id=\"older\" href=\"\(at)?before=\(next)\">Older versions</a></p>" }
        body += "<p class=\"muted\">The server keeps earlier versions as its history retention says (unless its administrator chose otherwise: the last 50 of each file, and every one younger than 30 days); restoring one makes it the current version on every device.</p></div>"
        let cursor = try await routes.store.cursor(of: c)
        return Self.html(HTML.page(title: item.name.value, session: s, body: body, data: ["watch": "\(base)/changes", "cursor": "\(cursor)"]))
    }

    /// Restore an earlier version, keep a conflict version, or keep the current one.
    func resolve(_ form: [String: String], _ ctx: NimbusContext, _ s: WebSession) async throws -> Response {
        let c = try await container(ctx, s)
        let id = try Self.itemID(ctx)
        guard let action = form["action"].flatMap(ResolveRequest.Action.init(rawValue:)), action != .discard else {
            throw APIError(.invalidParameter, "the form names no action (restore, keep_version or keep_current); reload the page")
        }
        var version: Int64? = nil
        if action != .keepCurrent {
            guard let v = form["version"].flatMap({ Int64($0) }), v >= 1 else {
                throw APIError(.invalidVersion, "the form lacks the version to keep; reload the page")
            }
            version = v
        }
        let r = try await routes.store.resolve(ResolveRequest(action: action, version: version), item: id, in: c, by: s.device,
                                               now: routes.clock())
        routes.committed(c, r)
        return Self.redirect("/web/c/\(HTML.component(c.name))/items/\(id)")
    }

    /// `GET …/items/ID/move?to=FOLDER`: choose where to move an item, folder by folder.
    func movePage(_ req: Request, _ ctx: NimbusContext, _ s: WebSession) async throws -> Response {
        let c = try await container(ctx, s)
        let id = try Self.itemID(ctx)
        guard let item = try await routes.store.item(id, in: c), !item.deleted else {
            throw APIError(.notFound, "this item is not in \(c.name) any more (deleted, or moved into Recently Deleted)")
        }
        let to: ItemID
        if let t = req.uri.queryParameters.get("to"), !t.isEmpty {
            guard let f = t == "root" ? .root : ItemID(String(t)) else { throw APIError(.invalidParameter, "to must be a folder's id") }
            to = f
        } else {
            to = item.parent
        }
        let after = req.uri.queryParameters.get("after").map { String($0) }
        if let after, after.utf8.count > 1024 { throw APIError(.invalidParameter, "after is a name, at most 1,024 bytes") }
        let base = "/web/c/\(HTML.component(c.name))"
        let at = "\(base)/items/\(id)"
        var body = "<h1>Move <bdi>\(HTML.text(item.name.value))</bdi></h1><p>Into:</p>"
        body += try await crumbs(c, to: to) { "\(at)/move" + ($0.isRoot ? "?to=root" : "?to=\($0)") }
        body += "</nav>"
        let rows = try await routes.store.children(of: to, in: c, after: after, limit: Self.pageSize + 1)
        let folders = rows.prefix(Self.pageSize).filter { $0.kind == .folder && $0.id != id }
        body += "<ul id=\"folders\">"
        for f in folders { body += "<li><a class=\"folder\" href=\"\(at)/move?to=\(f.id)\">\(HTML.name(f.name.value))/</a></li>" }
        body += "</ul>"
        if folders.isEmpty { body += "<p class=\"muted\">No folders here.</p>" }
        if rows.count > Self.pageSize, let last = rows.prefix(Self.pageSize).last {
            body += "<p><a id=\"next\" href=\"\(at)/move?to=\(to.isRoot ? "root" : to.description)&after=\(HTML.component(last.name.value))\">More folders</a></p>"
        }
        body += "<form method=\"post\" action=\"\(at)/move\" class=\"bar\"><input type=\"hidden\" name=\"csrf\" value=\"\(HTML.attribute(s.csrf))\">"
        body += "<input type=\"hidden\" name=\"version\" value=\"\(item.version)\"><input type=\"hidden\" name=\"to\" value=\"\(to.isRoot ? "root" : to.description)\">"
        body += "<button type=\"submit\" id=\"move-here\"\(to == item.parent ? " disabled" : "")>Move here</button> "
        body += "<a href=\"\(Self.folderURL(c, item.parent))\">Cancel</a></form>"
        return Self.html(HTML.page(title: "Move \(item.name.value)", session: s, body: body))
    }

    /// A move of an item as the page showed it (`version`) into folder `to`: a commit on that
    /// base, so an edit made elsewhere since and the move both apply; the server refuses a folder
    /// moved inside itself, and a taken name gets another.
    func move(_ form: [String: String], _ ctx: NimbusContext, _ s: WebSession) async throws -> Response {
        let c = try await container(ctx, s)
        let id = try Self.itemID(ctx)
        guard let version = form["version"].flatMap({ Int64($0) }), version > 0 else {
            throw APIError(.invalidVersion, "the form lacks the version the page showed; reload the page")
        }
        let to: ItemID
        switch form["to"] {
        case "root"?: to = .root
        case let t? where ItemID(t) != nil: to = ItemID(t)!
        default: throw APIError(.invalidParameter, "the form lacks the folder to move into; reload the page")
        }
        guard let current = try await routes.store.item(id, in: c), !current.deleted else {
            throw APIError(.notFound, "this item is not in \(c.name) any more (deleted, or moved into Recently Deleted)")
        }
        var draft = ItemDraft(current)
        draft.parent = to
        let r = try await routes.store.commit(CommitRequest(item: id, baseVersion: version, state: draft), in: c, by: s.device,
                                              now: routes.clock())
        routes.committed(c, r)
        return Self.redirect(Self.folderURL(c, r.item.parent))
    }
}
