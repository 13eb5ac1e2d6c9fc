import Foundation

/// A question to a presenter, answered with `ack` (docs/presenters.md "Daemon → client").
public struct Ask: Sendable, Equatable {
    public var id: AskID
    public var token: Token
    /// The path the question is about (below the presented folder, for a folder's presentation).
    public var path: String
    public var what: What

    public enum What: Sendable, Equatable {
        case save
        /// nil: no reason given, or one this client does not know.
        case relinquish(RelinquishReason?)
    }

    public init(id: AskID, token: Token, path: String, what: What) {
        (self.id, self.token, self.path, self.what) = (id, token, path, what)
    }

    public var kind: AskKind {
        switch what {
        case .save: .save
        case .relinquish: .relinquish
        }
    }
}

/// Something a presenter is told; it needs no answer.
public struct Event: Sendable, Equatable {
    public var token: Token
    /// The presented item, or the item below a presented folder that changed; for `moved` the
    /// path before the move.
    public var path: String
    public var change: Change

    public enum Change: Sendable, Equatable {
        /// The change that needed the file is done (or abandoned): open it again.
        case reacquire
        /// Content or attributes changed; `to` when the change was a move within the presented
        /// folder. `origin` nil: a cause this client does not know.
        case changed(origin: Origin?, to: String?, seq: UInt64)
        /// The presented item moved to `to`; the presentation follows it.
        case moved(to: String, seq: UInt64)
        /// The presented item is gone; the presentation has ended.
        case deleted(seq: UInt64)
        /// A new server version of the item is shown.
        case version(Int, seq: UInt64)
        /// An upload of the item became a conflict version.
        case conflict(seq: UInt64)
    }

    public init(token: Token, path: String, change: Change) {
        (self.token, self.path, self.change) = (token, path, change)
    }

    public var kind: EventKind {
        switch change {
        case .reacquire: .reacquire
        case .changed: .changed
        case .moved: .moved
        case .deleted: .deleted
        case .version: .version
        case .conflict: .conflict
        }
    }

    /// The line's number in `.nimbus/events`; nil for `reacquire`.
    public var seq: UInt64? {
        switch change {
        case .reacquire: nil
        case .changed(_, _, let s), .moved(_, let s), .deleted(let s), .version(_, let s), .conflict(let s): s
        }
    }
}

/// One line from the daemon.
public enum DaemonMessage: Sendable, Equatable {
    case reply(Reply)
    case ask(Ask)
    case event(Event)
    /// A line this client does not understand: a newer daemon's ask or event, or fields of the
    /// wrong type. `ask` is set when it was an ask with a readable id, which the client acks so
    /// the daemon goes on.
    case other(ask: AskID?)
}

extension DaemonMessage: Codable {
    public func encode(to encoder: any Encoder) throws {
        switch self {
        case .reply(let r):
            try r.encode(to: encoder)
        case .ask(let a):
            var c = encoder.container(keyedBy: WireKey.self)
            try c.encode(a.id, forKey: .ask)
            try c.encode(a.kind, forKey: .kind)
            try c.encode(a.token, forKey: .token)
            try c.encode(a.path, forKey: .path)
            if case .relinquish(let reason?) = a.what { try c.encode(reason, forKey: .reason) }
        case .event(let e):
            var c = encoder.container(keyedBy: WireKey.self)
            try c.encode(e.kind, forKey: .event)
            try c.encode(e.token, forKey: .token)
            try c.encode(e.path, forKey: .path)
            try c.encodeIfPresent(e.seq, forKey: .seq)
            switch e.change {
            case .changed(let origin, let to, _):
                try c.encodeIfPresent(origin, forKey: .origin)
                try c.encodeIfPresent(to, forKey: .to)
            case .moved(let to, _):
                try c.encode(to, forKey: .to)
            case .version(let v, _):
                try c.encode(v, forKey: .version)
            case .reacquire, .deleted, .conflict:
                break
            }
        case .other(let ask):
            var c = encoder.container(keyedBy: WireKey.self)
            try c.encodeIfPresent(ask, forKey: .ask)
        }
    }

    /// Throws only when the line is not a JSON object; anything else this client cannot use
    /// decodes as `.other`.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: WireKey.self)
        if c.contains(.re) {
            self = (try? Reply(from: decoder)).map(DaemonMessage.reply) ?? .other(ask: nil)
        } else if c.contains(.ask) {
            let id: AskID? = c.lenientField(.ask)
            guard let id, let ask = try? Self.ask(id, c) else {
                self = .other(ask: id)
                return
            }
            self = .ask(ask)
        } else if c.contains(.event) {
            self = (try? Self.event(c)).map(DaemonMessage.event) ?? .other(ask: nil)
        } else {
            self = .other(ask: nil)
        }
    }

    private static func ask(_ id: AskID, _ c: KeyedDecodingContainer<WireKey>) throws -> Ask? {
        guard let kind = c.lenientField(.kind).flatMap(AskKind.init(rawValue:)) else { return nil }
        let token: Token = try c.field(.token), path: String = try c.field(.path)
        switch kind {
        case .save: return Ask(id: id, token: token, path: path, what: .save)
        case .relinquish:
            let reason = c.lenientField(.reason).flatMap(RelinquishReason.init(rawValue:))
            return Ask(id: id, token: token, path: path, what: .relinquish(reason))
        }
    }

    private static func event(_ c: KeyedDecodingContainer<WireKey>) throws -> Event? {
        guard let kind = c.lenientField(.event).flatMap(EventKind.init(rawValue:)) else { return nil }
        let token: Token = try c.field(.token), path: String = try c.field(.path)
        let change: Event.Change
        switch kind {
        case .reacquire:
            change = .reacquire
        case .changed:
            let origin = c.lenientField(.origin).flatMap(Origin.init(rawValue:))
            change = .changed(origin: origin, to: c.lenientField(.to), seq: try c.field(.seq))
        case .moved:
            change = .moved(to: try c.field(.to), seq: try c.field(.seq))
        case .deleted:
            change = .deleted(seq: try c.field(.seq))
        case .version:
            change = .version(try c.field(.version), seq: try c.field(.seq))
        case .conflict:
            change = .conflict(seq: try c.field(.seq))
        }
        return Event(token: token, path: path, change: change)
    }

    /// Reads one line (without its `\n`); nil when it is not a JSON object.
    public static func decode(line: some Collection<UInt8>) -> DaemonMessage? {
        try? JSONDecoder().decode(DaemonMessage.self, from: Data(line))
    }
}
