import Foundation
@testable import NimbusServer
import Testing

/// What the web view writes of users' text (WebPages.swift) and how it names a download.
@Suite struct WebPagesTests {
    @Test func usersTextIsEscapedAndControlCharactersShowAsPictures() {
        #expect(HTML.text("<script>alert(1)</script>") == "&lt;script&gt;alert(1)&lt;/script&gt;")
        #expect(HTML.text("\"onerror='x' & y") == "&quot;onerror=&#39;x&#39; &amp; y")
        #expect(HTML.text("new\nline\ttab\u{7F}") == "new\u{240A}line\u{2409}tab\u{2421}")
        #expect(HTML.name("\u{202E}txt.exe") == "<bdi>\u{202E}txt.exe</bdi>", "isolated, so the override ends with the name")
        #expect(HTML.text("é 日本") == "é 日本")
        #expect(HTML.attribute("a\"b'<c>&\nd") == "a&quot;b&#39;&lt;c&gt;&amp;&#10;d", "an attribute keeps the characters themselves")
    }

    @Test func componentsArePercentEncoded() {
        #expect(HTML.component("a b/c?d&e=f#g") == "a%20b%2Fc%3Fd%26e%3Df%23g")
        #expect(HTML.component("é") == "%C3%A9")
        #expect(HTML.component("Az09-._~") == "Az09-._~")
    }

    @Test func aDownloadIsAnAttachmentUnderItsOwnName() {
        #expect(WebRoutes.attachment("report.pdf") == "attachment; filename=\"report.pdf\"; filename*=UTF-8''report.pdf")
        #expect(WebRoutes.attachment("a\"b\\c\nd é.txt")
            == "attachment; filename=\"a_b_c_d _.txt\"; filename*=UTF-8''a%22b%5Cc%0Ad%20%C3%A9.txt")
    }

    @Test func sizesAndTimesAsPeopleReadThem() {
        #expect(HTML.size(999) == "999 B")
        #expect(HTML.size(1_500) == "1.5 kB")
        #expect(HTML.size(9_000_003) == "9.0 MB")
        #expect(HTML.size(Int64.max) == "9.2 EB")
        #expect(HTML.time(0) == "1970-01-01 00:00 UTC")
        #expect(HTML.time(1_795_875_274_000_000_000) == "2026-11-28 14:14 UTC")
        #expect(HTML.time(-1) == "1969-12-31 23:59 UTC")
    }

    @Test func theCSRFValueIsTheSessionsOwn() {
        let a = WebRoutes.csrf("nim_a"), b = WebRoutes.csrf("nim_b")
        #expect(a.count == 32 && a != b && a == WebRoutes.csrf("nim_a"))
    }
}
