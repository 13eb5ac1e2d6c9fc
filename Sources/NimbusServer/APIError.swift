import NimbusCore
import NimbusProtocol

/// The one error type of the server boundary: a stable code (see `APIErrorCode`) and a message that
/// says what happened and what to do. Stores throw it; the HTTP layer turns it into an `ErrorBody`.
/// Anything else that escapes a handler becomes `internal` with a generic message — internals never
/// reach a client.
public struct APIError: Error, Sendable, CustomStringConvertible {
    public var code: APIErrorCode
    public var message: String
    public var missing: [ContentHash]?

    public init(_ code: APIErrorCode, _ message: String, missing: [ContentHash]? = nil) {
        self.code = code
        self.message = message
        self.missing = missing
    }

    public var description: String { "\(code.rawValue): \(message)" }

    static func containerNotFound(_ name: String) -> APIError {
        APIError(.containerNotFound, "no container named \(name.debugDescription) for this account; create it with PUT /v1/containers/{name}")
    }
    /// An upload of a chunk whose bytes the garbage collector is deleting (or whose upload it
    /// reclaimed as stale): a second later the upload goes through.
    static func chunkBeingFreed(_ hash: ContentHash) -> APIError {
        APIError(.busy, "chunk \(hash) is being freed by the server's garbage collection; upload it again in a second")
    }
    static func itemNotFound(_ id: ItemID) -> APIError {
        APIError(.itemNotFound, "no item \(id) in this container; pull changes and retry")
    }
}

/// Who is making a request: the device behind a token.
public struct DeviceRecord: Hashable, Sendable {
    public var id: DeviceID
    public var name: String
    public var accountID: Int64
    public var accountName: String
    public init(id: DeviceID, name: String, accountID: Int64, accountName: String) {
        self.id = id
        self.name = name
        self.accountID = accountID
        self.accountName = accountName
    }
}

/// A container of one account.
public struct ContainerRecord: Hashable, Sendable {
    public var id: Int64
    public var accountID: Int64
    public var name: String
    public init(id: Int64, accountID: Int64, name: String) {
        self.id = id
        self.accountID = accountID
        self.name = name
    }
}
