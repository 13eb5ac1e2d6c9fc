import Foundation
import NimbusCore
import NimbusProtocol

/// HTML of the web view (docs/web.md), written by hand: every piece of text that comes from a
/// user (a file name, a device name, a container name, an error's message) goes through
/// `HTML.text` or `HTML.attribute`, and a name is wrapped in `<bdi>` so a right-to-left override
/// in it cannot turn the text around it. No inline script or style: the page's one stylesheet
/// is `/web/style.css`, and the Content-Security-Policy allows nothing else.
enum HTML {
    /// Text content: the markup characters escaped; control characters (a newline, a tab in a
    /// name) shown as the Unicode picture of their code, so a name keeps its look on one line.
    static func text(_ s: String) -> String {
        escape(s) { $0 == 0x7F ? "\u{2421}" : String(Unicode.Scalar(0x2400 + $0)!) }
    }

    /// An attribute's value (always written in double quotes): the characters themselves, with
    /// the markup ones and control characters as character references.
    static func attribute(_ s: String) -> String {
        escape(s) { "&#\($0);" }
    }

    private static func escape(_ s: String, control: (UInt32) -> String) -> String {
        var out = ""
        out.reserveCapacity(s.utf8.count)
        for u in s.unicodeScalars {
            switch u {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default:
                if u.value < 0x20 || u.value == 0x7F { out += control(u.value) } else { out.unicodeScalars.append(u) }
            }
        }
        return out
    }

    /// A user's name of something, isolated from the text around it.
    static func name(_ s: String) -> String { "<bdi>\(text(s))</bdi>" }

    /// A query or path component, percent-encoded (only unreserved characters stay).
    static func component(_ s: String) -> String {
        var allowed = CharacterSet.alphanumerics.intersection(CharacterSet(charactersIn: Unicode.Scalar(0)..<Unicode.Scalar(128)))
        allowed.insert(charactersIn: "-._~")
        return s.addingPercentEncoding(withAllowedCharacters: allowed) ?? ""
    }

    /// A whole page: the header with the account and sign-out (when signed in) and `body`.
    /// `data`: attributes of `<main>` for the script (`data-NAME="value"`, values escaped here).
    static func page(title: String, session: WebSession?, body: String, data: KeyValuePairs<String, String> = [:]) -> String {
        var header = "<header><a class=\"brand\" href=\"/\">Nimbus</a>"
        if let session {
            header += "<nav><a href=\"/web/devices\">Devices</a> <a href=\"/web/usage\">Usage</a>"
            header += " <span class=\"who\">\(text(session.device.accountName)) · \(name(session.device.name))</span>"
            header += "<form method=\"post\" action=\"/web/sign-out\">"
            header += "<input type=\"hidden\" name=\"csrf\" value=\"\(attribute(session.csrf))\">"
            header += "<button type=\"submit\" id=\"sign-out\">Sign out</button></form></nav>"
        }
        header += "</header>"
        let attributes = data.map { " data-\($0.key)=\"\(attribute($0.value))\"" }.joined()
        return """
            <!doctype html>
            <html lang="en"><head><meta charset="utf-8">
            <meta name="viewport" content="width=device-width, initial-scale=1">
            <title>\(text(title)) — Nimbus</title>
            <link rel="stylesheet" href="/web/style.css?v=\(styleVersion)"><script src="/web/app.js?v=\(WebScript.version)" defer></script></head>
            <body>\(header)<main\(attributes)>\(body)</main></body></html>
            """
    }

    /// Bytes as people read them (1,000-based units, as `ls -lh --si` and the file managers do).
    static func size(_ n: Int64) -> String {
        if n < 1000 { return "\(n) B" }
        let units = ["kB", "MB", "GB", "TB", "PB", "EB"]
        var v = Double(n) / 1000
        var i = 0
        while v >= 1000, i < units.count - 1 { v /= 1000; i += 1 }
        return String(format: v < 10 ? "%.1f %@" : "%.0f %@", v, units[i])
    }

    /// A time in nanoseconds since 1970, in UTC.
    static func time(_ ns: Int64) -> String {
        var t = time_t(ns / 1_000_000_000 - (ns % 1_000_000_000 < 0 ? 1 : 0))
        var tm = tm()
        guard gmtime_r(&t, &tm) != nil else { return "?" }
        func two(_ v: Int32) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return "\(Int(tm.tm_year) + 1900)-\(two(tm.tm_mon + 1))-\(two(tm.tm_mday)) \(two(tm.tm_hour)):\(two(tm.tm_min)) UTC"
    }

    /// A digest of the stylesheet: its address changes with it, so a browser never keeps an old
    /// one (they are cached for an hour).
    static let styleVersion = WebScript.digest(style)

    static let style = """
        :root { color-scheme: light dark; font-family: system-ui, sans-serif; }
        body { margin: 0; }
        header { display: flex; align-items: center; justify-content: space-between; padding: .6rem 1rem;
                 border-bottom: 1px solid #8884; }
        header nav { display: flex; gap: 1rem; align-items: center; }
        header form { display: inline; margin: 0; }
        .brand { font-weight: 600; text-decoration: none; }
        main { padding: 1rem; max-width: 72rem; }
        table { border-collapse: collapse; width: 100%; }
        th, td { text-align: left; padding: .3rem .6rem; border-bottom: 1px solid #8882; white-space: nowrap; }
        td.name { white-space: pre; overflow-wrap: anywhere; }
        td.num, th.num { text-align: right; }
        .crumbs { margin-bottom: .8rem; }
        .crumbs a, .crumbs span { margin-right: .3rem; }
        .conflict { color: #b50; font-weight: 600; }
        .error { color: #b00; }
        .muted { color: #888; }
        #code { font-size: 1.2rem; letter-spacing: .1rem; }
        form.bar { margin-bottom: .8rem; }
        td.actions form { display: inline; margin-right: .4rem; }
        td.actions input[type=text] { width: 12rem; }
        #upload { border: 1px dashed #8886; padding: .6rem; margin-bottom: .8rem; }
        #upload.drop { border-color: #36c; background: #36c1; }
        #uploads { list-style: none; padding: 0; margin: .4rem 0 0; }
        #uploads li.failed .state { color: #b00; }
        #uploads progress { width: 10rem; }
        .usage progress { width: 20rem; }
        """
}

/// A signed-in browser: the device its cookie's token names, and the token's CSRF value.
struct WebSession: Sendable {
    var device: DeviceRecord
    var csrf: String
}
