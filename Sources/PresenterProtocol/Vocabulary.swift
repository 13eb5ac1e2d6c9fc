// PresenterProtocol: the messages of a mount's presenter socket (docs/presenters.md), shared by
// the daemon (ContainerFS PresenterHub) and the client (NimbusKit). Foundation only.

/// A number that is a type of its own on the wire (a token, an ask's id): a plain integer in
/// JSON (RawRepresentable's Codable), written as one in code and text.
public protocol WireNumber: RawRepresentable, Hashable, Sendable, Codable, ExpressibleByIntegerLiteral, CustomStringConvertible
where RawValue == Int, IntegerLiteralType == Int {
    init(rawValue: Int)
}

extension WireNumber {
    public init(_ rawValue: Int) { self.init(rawValue: rawValue) }
    public init(integerLiteral value: Int) { self.init(rawValue: value) }
    public var description: String { "\(rawValue)" }
}

/// A presentation's number, chosen by the client, unique on its connection (0 in `will-write`
/// and `did-write`: the writer presents nothing).
public struct Token: WireNumber {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }
}

/// An ask's number, chosen by the daemon; the client's `ack` names it.
public struct AskID: WireNumber {
    public let rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }
}

/// The `op` of a client request.
public enum Op: String, Sendable, CaseIterable, Codable {
    case hello, present, unpresent
    case willWrite = "will-write"
    case didWrite = "did-write"
    case ack
}

/// The `kind` of an ask.
public enum AskKind: String, Sendable, CaseIterable, Codable {
    /// Write unsaved changes now: the file is about to be uploaded.
    case save
    /// Finish writing and close the file: something is about to replace it (`reason`).
    case relinquish
}

/// Why a presenter is asked to relinquish (`reason` of a `relinquish` ask).
public enum RelinquishReason: String, Sendable, CaseIterable, Codable {
    /// Another version is about to replace the file.
    case replace
    /// The file is about to be deleted (by another device).
    case delete
    /// Another program's coordinated write starts.
    case write
}

/// The `event` of a daemon line.
public enum EventKind: String, Sendable, CaseIterable, Codable {
    case reacquire, changed, moved, deleted, version, conflict
}

/// Who made a `changed` event happen (`origin`).
public enum Origin: String, Sendable, CaseIterable, Codable {
    /// A program on this machine.
    case local
    /// Another device.
    case remote
    /// The sync engine itself (a download or an upload it finished).
    case sync
}

/// The protocol version this build speaks (`hello`).
public let presenterProtocolVersion = 1
