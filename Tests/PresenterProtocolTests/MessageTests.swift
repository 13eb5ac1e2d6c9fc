import Foundation
import PresenterProtocol
import Testing

// Every message of docs/presenters.md both ways against the literal lines there: decoding the
// doc's line gives the value, encoding the value gives the doc's object (compared as JSON, since
// the encoder sorts keys), and every encoded line is one line.

/// The line `m` encodes to, without its `\n` (checked to be the only newline).
func line(_ m: some Encodable) throws -> String {
    let bytes = try #require(PresenterLine.encode(m))
    #expect(bytes.last == UInt8(ascii: "\n"))
    #expect(bytes.dropLast().contains(UInt8(ascii: "\n")) == false)
    return String(decoding: bytes.dropLast(), as: UTF8.self)
}

/// `a` and `b` are the same JSON object.
func sameJSON(_ a: String, _ b: String) throws -> Bool {
    let x = try JSONSerialization.jsonObject(with: Data(a.utf8)) as? NSDictionary
    let y = try JSONSerialization.jsonObject(with: Data(b.utf8)) as? NSDictionary
    return x != nil && x == y
}

func request(_ s: String) -> Result<Request, RequestError> { Request.decode(line: Array(s.utf8)) }
func daemon(_ s: String) -> DaemonMessage? { DaemonMessage.decode(line: Array(s.utf8)) }

@Suite struct RequestTests {
    static let docs: [(String, Request)] = [
        (#"{"op":"hello","version":1,"pid":1234,"name":"editor"}"#, .hello(version: 1, pid: 1234, name: "editor")),
        (#"{"op":"present","token":5,"path":"/docs/a.txt"}"#, .present(token: 5, path: "/docs/a.txt")),
        (#"{"op":"unpresent","token":5}"#, .unpresent(token: 5)),
        (#"{"op":"will-write","token":5,"path":"/docs/a.txt"}"#, .willWrite(token: 5, path: "/docs/a.txt")),
        (#"{"op":"will-write","token":0,"path":"/docs/a.txt"}"#, .willWrite(token: 0, path: "/docs/a.txt")),
        (#"{"op":"did-write","token":5,"path":"/docs/a.txt"}"#, .didWrite(token: 5, path: "/docs/a.txt")),
        (#"{"op":"ack","ask":17}"#, .ack(17, error: nil)),
        (#"{"op":"ack","ask":17,"error":"disk full"}"#, .ack(17, error: "disk full")),
    ]

    @Test(arguments: docs.indices) func theDocsLinesBothWays(_ i: Int) throws {
        let (text, message) = Self.docs[i]
        #expect(try request(text).get() == message)
        let encoded = try line(message)
        #expect(try sameJSON(encoded, text), "\(encoded)")
    }

    @Test func unknownKeysAreIgnored() throws {
        #expect(try request(#"{"op":"present","token":5,"path":"/a","future":{"x":[1,2]},"z":null}"#).get() == .present(token: 5, path: "/a"))
        #expect(try request(#"{"op":"hello","version":1}"#).get() == .hello(version: 1, pid: nil, name: nil))
    }

    @Test func aSlashIsNotEscapedAndANewlineIsEscaped() throws {
        let text = try line(Request.present(token: 1, path: "/a\nb/c"))
        #expect(text == #"{"op":"present","path":"/a\nb/c","token":1}"#)
        #expect(try request(text).get() == .present(token: 1, path: "/a\nb/c"))
    }
}

@Suite struct DaemonMessageTests {
    static let docs: [(String, DaemonMessage)] = [
        (#"{"re":"hello","ok":true,"version":1}"#, .reply(.hello())),
        (#"{"re":"present","token":5,"ok":true}"#, .reply(.ok(.present, token: 5))),
        (#"{"re":"present","token":5,"ok":false,"error":"path must be a container path like /docs/a.txt"}"#,
         .reply(.failed("present", token: 5, "path must be a container path like /docs/a.txt"))),
        (#"{"re":"unpresent","token":5,"ok":true}"#, .reply(.ok(.unpresent, token: 5))),
        (#"{"re":"will-write","path":"/docs/a.txt","ok":true,"late":0}"#, .reply(.willWrite(path: "/docs/a.txt", late: 0))),
        (#"{"re":"did-write","path":"/docs/a.txt","ok":true}"#, .reply(.ok(.didWrite, path: "/docs/a.txt"))),
        (#"{"re":"present","ok":false,"error":"token must be an integer"}"#, .reply(.failed("present", "token must be an integer"))),
        (#"{"ask":17,"kind":"save","token":5,"path":"/docs/a.txt"}"#, .ask(Ask(id: 17, token: 5, path: "/docs/a.txt", what: .save))),
        (#"{"ask":18,"kind":"relinquish","token":5,"path":"/docs/a.txt","reason":"replace"}"#,
         .ask(Ask(id: 18, token: 5, path: "/docs/a.txt", what: .relinquish(.replace)))),
        (#"{"ask":19,"kind":"relinquish","token":5,"path":"/docs/a.txt","reason":"delete"}"#,
         .ask(Ask(id: 19, token: 5, path: "/docs/a.txt", what: .relinquish(.delete)))),
        (#"{"ask":20,"kind":"relinquish","token":5,"path":"/docs/a.txt","reason":"write"}"#,
         .ask(Ask(id: 20, token: 5, path: "/docs/a.txt", what: .relinquish(.write)))),
        (#"{"event":"reacquire","token":5,"path":"/docs/a.txt"}"#, .event(Event(token: 5, path: "/docs/a.txt", change: .reacquire))),
        (#"{"event":"changed","token":5,"path":"/docs/a.txt","origin":"remote","seq":41}"#,
         .event(Event(token: 5, path: "/docs/a.txt", change: .changed(origin: .remote, to: nil, seq: 41)))),
        (#"{"event":"changed","token":5,"path":"/docs/a.txt","to":"/docs/b.txt","origin":"local","seq":41}"#,
         .event(Event(token: 5, path: "/docs/a.txt", change: .changed(origin: .local, to: "/docs/b.txt", seq: 41)))),
        (#"{"event":"moved","token":5,"path":"/docs/a.txt","to":"/old/a.txt","seq":42}"#,
         .event(Event(token: 5, path: "/docs/a.txt", change: .moved(to: "/old/a.txt", seq: 42)))),
        (#"{"event":"deleted","token":5,"path":"/docs/a.txt","seq":43}"#, .event(Event(token: 5, path: "/docs/a.txt", change: .deleted(seq: 43)))),
        (#"{"event":"version","token":5,"path":"/docs/a.txt","version":7,"seq":44}"#,
         .event(Event(token: 5, path: "/docs/a.txt", change: .version(7, seq: 44)))),
        (#"{"event":"conflict","token":5,"path":"/docs/a.txt","seq":45}"#, .event(Event(token: 5, path: "/docs/a.txt", change: .conflict(seq: 45)))),
    ]

    @Test(arguments: docs.indices) func theDocsLinesBothWays(_ i: Int) throws {
        let (text, message) = Self.docs[i]
        #expect(daemon(text) == message)
        let encoded = try line(message)
        #expect(try sameJSON(encoded, text), "\(encoded)")
    }

    @Test func errorRepliesOfRequestsThatCannotBeRead() throws {
        #expect(try line(request("[1]").failure!.reply) == #"{"error":"not a JSON object on one line (docs/presenters.md)","ok":false,"re":"error"}"#)
        #expect(try line(request(#"{"op":"present","token":"x","path":"/a"}"#).failure!.reply)
            == #"{"error":"token must be an integer","ok":false,"re":"present"}"#)
        // A readable token goes back with an error about a later field.
        #expect(try line(request(#"{"op":"present","token":5,"path":7}"#).failure!.reply)
            == #"{"error":"path must be a string","ok":false,"re":"present","token":5}"#)
        #expect(try line(request(#"{"op":"rename","token":5}"#).failure!.reply)
            == #"{"error":"unknown op rename (docs/presenters.md)","ok":false,"re":"rename"}"#)
    }

    /// What a newer daemon may send: ignored, and an unknown ask still has an id to ack.
    @Test func aNewerDaemonsLinesAreIgnoredNotFatal() {
        #expect(daemon(#"{"event":"renamed","token":5,"path":"/a","seq":1}"#) == .other(ask: nil))
        #expect(daemon(#"{"ask":21,"kind":"evict","token":5,"path":"/a"}"#) == .other(ask: 21))
        #expect(daemon(#"{"ask":22,"kind":"save","path":"/a"}"#) == .other(ask: 22))
        #expect(daemon(#"{"ask":"x","kind":"save","token":5,"path":"/a"}"#) == .other(ask: nil))
        #expect(daemon(#"{"news":true}"#) == .other(ask: nil))
        #expect(daemon(#"{"ask":18,"kind":"relinquish","token":5,"path":"/a","reason":"evict"}"#)
            == .ask(Ask(id: 18, token: 5, path: "/a", what: .relinquish(nil))))
        #expect(daemon(#"{"event":"changed","token":5,"path":"/a","origin":"satellite","seq":1,"extra":[{}]}"#)
            == .event(Event(token: 5, path: "/a", change: .changed(origin: nil, to: nil, seq: 1))))
        #expect(daemon(#"{"re":"hello","ok":true,"version":2,"features":["x"]}"#) == .reply(Reply(re: "hello", outcome: .hello(version: 2))))
        // A reply with oddly typed extras still answers its request.
        #expect(daemon(#"{"re":"present","token":"5","ok":true}"#) == .reply(.ok(.present)))
        #expect(daemon(#"{"re":"present","ok":false}"#) == .reply(.failed("present", "refused without a reason")))
        #expect(daemon(#"{"re":"present","ok":"yes"}"#) == .other(ask: nil))
        #expect(daemon("not json") == nil)
        #expect(daemon("[]") == nil)
        #expect(daemon(#"{"event":"version","token":5,"path":"/a","version":1e300,"seq":1}"#) == .other(ask: nil))
        #expect(daemon(#"{"event":"deleted","token":9223372036854775808,"path":"/a","seq":1}"#) == .other(ask: nil))
    }
}

extension Result {
    var failure: Failure? {
        if case .failure(let e) = self { return e }
        return nil
    }
}
