/// The daemon's answer to a request (`re`). Every request but `ack` gets one; an `ack` gets one
/// only when it could not be read.
public struct Reply: Sendable, Equatable {
    /// The op answered, as the client sent it: an unknown op is echoed; `error` when the line
    /// had no op to echo (not JSON, or no `op` string).
    public var re: String
    public var token: Token?
    public var path: String?
    public var outcome: Outcome

    public enum Outcome: Sendable, Equatable {
        case ok
        /// `hello`: the daemon's protocol version.
        case hello(version: Int)
        /// `will-write`: how many presenters did not answer within the bound.
        case willWrite(late: Int)
        case failed(String)
    }

    /// The `re` of a line that had no op.
    public static let noOp = "error"

    public init(re: String, token: Token? = nil, path: String? = nil, outcome: Outcome) {
        self.re = re
        self.token = token
        self.path = path
        self.outcome = outcome
    }

    public var op: Op? { Op(rawValue: re) }
    public var ok: Bool {
        if case .failed = outcome { return false }
        return true
    }
    public var error: String? {
        if case .failed(let e) = outcome { return e }
        return nil
    }

    public static func hello() -> Reply { Reply(re: Op.hello.rawValue, outcome: .hello(version: presenterProtocolVersion)) }
    public static func ok(_ op: Op, token: Token? = nil, path: String? = nil) -> Reply {
        Reply(re: op.rawValue, token: token, path: path, outcome: .ok)
    }
    public static func willWrite(path: String, late: Int) -> Reply {
        Reply(re: Op.willWrite.rawValue, path: path, outcome: .willWrite(late: late))
    }
    public static func failed(_ re: String, token: Token? = nil, path: String? = nil, _ error: String) -> Reply {
        Reply(re: re, token: token, path: path, outcome: .failed(error))
    }
}

extension Reply: Codable {
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: WireKey.self)
        try c.encode(re, forKey: .re)
        try c.encodeIfPresent(token, forKey: .token)
        try c.encodeIfPresent(path, forKey: .path)
        try c.encode(ok, forKey: .ok)
        switch outcome {
        case .ok: break
        case .hello(let version): try c.encode(version, forKey: .version)
        case .willWrite(let late): try c.encode(late, forKey: .late)
        case .failed(let error): try c.encode(error, forKey: .error)
        }
    }

    /// Needs `re` and `ok`; the other fields are read when they have the documented type and
    /// ignored otherwise (a newer daemon may add or change them).
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: WireKey.self)
        re = try c.field(.re)
        token = c.lenientField(.token)
        path = c.lenientField(.path)
        let ok: Bool = try c.field(.ok)
        if !ok {
            outcome = .failed(c.lenientField(.error) ?? "refused without a reason")
        } else if re == Op.hello.rawValue {
            outcome = .hello(version: c.lenientField(.version) ?? presenterProtocolVersion)
        } else if re == Op.willWrite.rawValue {
            outcome = .willWrite(late: c.lenientField(.late) ?? 0)
        } else {
            outcome = .ok
        }
    }
}
