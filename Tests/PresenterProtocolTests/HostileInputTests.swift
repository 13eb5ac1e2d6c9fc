import Foundation
import PresenterProtocol
import Testing

// What any local program can write to the socket: every line decodes to a request or to a
// RequestError with a reply that says what is wrong; nothing traps.

@Suite struct HostileInputTests {
    static func problem(_ s: String) -> String? {
        switch request(s) {
        case .success: nil
        case .failure(let e): e.description
        }
    }

    @Test func linesThatAreNotAnObject() {
        for s in ["", " ", "not json", "{", "}", "[1,2]", "42", "\"op\"", "null", "{\"op\":\"hello\"", "\u{FF}\u{FE}"] {
            #expect(Self.problem(s) == "not a JSON object on one line (docs/presenters.md)", "\(s)")
        }
        let invalidUTF8: [UInt8] = Array(#"{"op":"hello","name":""#.utf8) + [0xFF, 0xC0] + Array(#"","version":1}"#.utf8)
        // The parser finds bad UTF-8 when it reads the string, so the field is named.
        if case .failure(let e) = Request.decode(line: invalidUTF8) { #expect(e.description == "name must be a string") } else { Issue.record("decoded invalid UTF-8") }
    }

    @Test func deepNesting() throws {
        for depth in [500, 10_000, 200_000] {
            let deep = String(repeating: "[", count: depth) + String(repeating: "]", count: depth)
            // As an unknown key's value, and as the whole line.
            let s = #"{"op":"unpresent","token":3,"x":"# + deep + "}"
            let r = request(s)
            if depth == 500 { #expect(try r.get() == .unpresent(token: 3)) }
            if case .failure(let e) = r { #expect(e.problem == .notAnObject, "depth \(depth)") }
            else { #expect(try r.get() == .unpresent(token: 3), "depth \(depth)") }
            #expect(Self.problem(deep) == "not a JSON object on one line (docs/presenters.md)")
            let objects = String(repeating: #"{"a":"#, count: depth) + "1" + String(repeating: "}", count: depth)
            #expect(Self.problem(objects) != nil)
            _ = daemon(s)
            _ = daemon(objects)
        }
    }

    @Test func wronglyTypedFieldsAreNamed() {
        let cases: [(String, String)] = [
            (#"{"op":"present","token":"x","path":"/a"}"#, "token must be an integer"),
            (#"{"op":"present","token":5.5,"path":"/a"}"#, "token must be an integer"),
            (#"{"op":"present","token":true,"path":"/a"}"#, "token must be an integer"),
            (#"{"op":"present","token":null,"path":"/a"}"#, "token must be an integer"),
            (#"{"op":"present","token":[5],"path":"/a"}"#, "token must be an integer"),
            (#"{"op":"present","token":5,"path":["/a"]}"#, "path must be a string"),
            (#"{"op":"unpresent","token":{"n":5}}"#, "token must be an integer"),
            (#"{"op":"will-write","token":0,"path":false}"#, "path must be a string"),
            (#"{"op":"did-write","token":"0","path":"/a"}"#, "token must be an integer"),
            (#"{"op":"ack","ask":"17"}"#, "ask must be an integer"),
            (#"{"op":"ack","ask":17,"error":{"why":"x"}}"#, "error must be a string"),
            (#"{"op":"hello","version":"1"}"#, "version must be an integer"),
            (#"{"op":"hello","version":1,"pid":"1234"}"#, "pid must be an integer"),
            (#"{"op":"hello","version":1,"name":5}"#, "name must be a string"),
            (#"{"op":5}"#, "op must be a string"),
            (#"{"op":null}"#, "op must be a string"),
        ]
        for (s, why) in cases { #expect(Self.problem(s) == why, "\(s)") }
    }

    @Test func hugeNumbers() throws {
        #expect(try request(#"{"op":"present","token":9223372036854775807,"path":"/a"}"#).get() == .present(token: Token(Int.max), path: "/a"))
        #expect(try request(#"{"op":"present","token":-9223372036854775808,"path":"/a"}"#).get() == .present(token: Token(Int.min), path: "/a"))
        for n in ["9223372036854775808", "-9223372036854775809", "1e300", "-1e300", "1e400", "123456789012345678901234567890"] {
            #expect(Self.problem(#"{"op":"present","token":\#(n),"path":"/a"}"#) == "token must be an integer", "\(n)")
            #expect(Self.problem(#"{"op":"ack","ask":\#(n)}"#) == "ask must be an integer", "\(n)")
        }
    }

    @Test func missingFields() {
        let cases: [(String, String)] = [
            (#"{}"#, "op is missing"),
            (#"{"token":5}"#, "op is missing"),
            (#"{"op":"hello"}"#, "version is missing"),
            (#"{"op":"present","path":"/a"}"#, "token is missing"),
            (#"{"op":"present","token":5}"#, "path is missing"),
            (#"{"op":"unpresent"}"#, "token is missing"),
            (#"{"op":"will-write","token":5}"#, "path is missing"),
            (#"{"op":"did-write","path":"/a"}"#, "token is missing"),
            (#"{"op":"ack"}"#, "ask is missing"),
        ]
        for (s, why) in cases { #expect(Self.problem(s) == why, "\(s)") }
    }

    @Test func unknownOps() {
        #expect(Self.problem(#"{"op":"rename","token":5}"#) == "unknown op rename (docs/presenters.md)")
        #expect(Self.problem(#"{"op":"","token":5}"#) == "unknown op  (docs/presenters.md)")
        #expect(Self.problem(#"{"op":"HELLO","version":1}"#) == "unknown op HELLO (docs/presenters.md)")
        if case .failure(let e) = request(#"{"op":"rename"}"#) { #expect(e.reply.re == "rename") }
    }

    @Test func oddButReadableLines() throws {
        // Duplicate keys, a BOM-less leading space, escapes: read, never a trap.
        _ = request(#"{"op":"hello","op":"present","token":1,"path":"/a","version":1}"#)
        #expect(try request(#"  {"op":"unpresent","token":1}  "#).get() == .unpresent(token: 1))
        #expect(try request(#"{"op":"present","token":1,"path":"\/a\u0000b"}"#).get() == .present(token: 1, path: "/a\u{0}b"))
        #expect(try request("{\"op\":\"unpresent\",\"token\":1}\r").get() == .unpresent(token: 1))
    }
}
