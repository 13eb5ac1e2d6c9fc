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
    /// `quota_exceeded`: the account's usage and quota, sent as structured fields.
    public var quota: QuotaFigures?

    public init(_ code: APIErrorCode, _ message: String, missing: [ContentHash]? = nil, quota: QuotaFigures? = nil) {
        self.code = code
        self.message = message
        self.missing = missing
        self.quota = quota
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
    /// A chunk upload of `size` bytes that the account's quota has no room for: nothing is stored.
    static func quotaExceeded(usage: Int64, quota: Int64, size: Int64) -> APIError {
        APIError(.quotaExceeded, "this account stores \(usage) bytes of its quota of \(quota) bytes, and this chunk of \(size) bytes would exceed it; nothing was stored — free space by deleting files (their bytes count until the server's history retention and garbage collection free them) or ask the server's admin to raise the quota (nimbus admin set-quota)",
                 quota: QuotaFigures(usage: usage, quota: quota))
    }
    static func quotaExceededByCommit(usage: Int64, quota: Int64, size: Int64) -> APIError {
        APIError(.quotaExceeded, "this account stores \(usage) bytes of its quota of \(quota) bytes (content, versions and their chunk lists), and this commit's \(size) bytes of metadata would exceed it; nothing was changed — free space by deleting files (their bytes count until the server's history retention and garbage collection free them) or ask the server's admin to raise the quota (nimbus admin set-quota)",
                 quota: QuotaFigures(usage: usage, quota: quota))
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
