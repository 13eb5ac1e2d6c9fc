import Foundation

/// A client's request (docs/presenters.md "Client → daemon").
public enum Request: Sendable, Equatable {
    /// Must be first on a connection; `pid` and `name` only label the client in `.nimbus/claims`.
    case hello(version: Int, pid: Int?, name: String?)
    /// Present the item at `path` (a folder: everything below it).
    case present(token: Token, path: String)
    case unpresent(token: Token)
    /// A coordinated write of `path` starts: the other presenters of it relinquish.
    case willWrite(token: Token, path: String)
    /// The coordinated write of `path` ended: the other presenters reacquire.
    case didWrite(token: Token, path: String)
    /// The answer to an ask; `error` says the presenter could not do what it was asked.
    case ack(AskID, error: String?)

    public var op: Op {
        switch self {
        case .hello: .hello
        case .present: .present
        case .unpresent: .unpresent
        case .willWrite: .willWrite
        case .didWrite: .didWrite
        case .ack: .ack
        }
    }

    /// This process's `hello`.
    public static func hello(pid: Int, name: String) -> Request {
        .hello(version: presenterProtocolVersion, pid: pid, name: name)
    }
}

/// Why a line is not a request, with what the daemon answers (the connection stays open).
public struct RequestError: Error, Equatable, Sendable, CustomStringConvertible {
    public enum Problem: Equatable, Sendable {
        /// Not JSON, or JSON but not an object (nesting too deep counts as not JSON).
        case notAnObject
        case field(FieldError)
        case unknownOp(String)
    }
    /// The `op` as the client sent it, when it was a string.
    public let op: String?
    /// The token, when the line had a well-typed one (an error reply carries it back).
    public let token: Token?
    public let problem: Problem

    public var description: String {
        switch problem {
        case .notAnObject: "not a JSON object on one line (docs/presenters.md)"
        case .field(let f): f.description
        case .unknownOp(let op): "unknown op \(op) (docs/presenters.md)"
        }
    }

    /// The error reply: `re` is the op as sent (`error` when the line had none).
    public var reply: Reply { .failed(op ?? Reply.noOp, token: token, description) }
}

extension Request: Codable {
    /// Throws a `RequestError` for anything that is not a request this version knows; unknown
    /// keys are ignored.
    public init(from decoder: any Decoder) throws {
        let c: KeyedDecodingContainer<WireKey>
        do {
            c = try decoder.container(keyedBy: WireKey.self)
        } catch {
            throw RequestError(op: nil, token: nil, problem: .notAnObject)
        }
        let name: String
        do {
            name = try c.field(.op)
        } catch let f as FieldError {
            throw RequestError(op: nil, token: nil, problem: .field(f))
        }
        guard let op = Op(rawValue: name) else { throw RequestError(op: name, token: nil, problem: .unknownOp(name)) }
        var token: Token?
        do {
            switch op {
            case .hello:
                self = .hello(version: try c.field(.version), pid: try c.optionalField(.pid), name: try c.optionalField(.name))
            case .present:
                let t: Token = try c.field(.token)
                token = t
                self = .present(token: t, path: try c.field(.path))
            case .unpresent:
                let t: Token = try c.field(.token)
                token = t
                self = .unpresent(token: t)
            case .willWrite:
                let t: Token = try c.field(.token)
                token = t
                self = .willWrite(token: t, path: try c.field(.path))
            case .didWrite:
                let t: Token = try c.field(.token)
                token = t
                self = .didWrite(token: t, path: try c.field(.path))
            case .ack:
                self = .ack(try c.field(.ask), error: try c.optionalField(.error))
            }
        } catch let f as FieldError {
            throw RequestError(op: name, token: token, problem: .field(f))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: WireKey.self)
        try c.encode(op, forKey: .op)
        switch self {
        case .hello(let version, let pid, let name):
            try c.encode(version, forKey: .version)
            try c.encodeIfPresent(pid, forKey: .pid)
            try c.encodeIfPresent(name, forKey: .name)
        case .present(let token, let path), .willWrite(let token, let path), .didWrite(let token, let path):
            try c.encode(token, forKey: .token)
            try c.encode(path, forKey: .path)
        case .unpresent(let token):
            try c.encode(token, forKey: .token)
        case .ack(let ask, let error):
            try c.encode(ask, forKey: .ask)
            try c.encodeIfPresent(error, forKey: .error)
        }
    }

    /// Reads one line (without its `\n`); every failure is a `RequestError`.
    public static func decode(line: some Collection<UInt8>) -> Result<Request, RequestError> {
        do {
            return .success(try JSONDecoder().decode(Request.self, from: Data(line)))
        } catch let e as RequestError {
            return .failure(e)
        } catch {
            return .failure(RequestError(op: nil, token: nil, problem: .notAnObject))  // not JSON at all
        }
    }
}
