/// The stable error codes of the protocol. Clients branch on `code`, never on the message.
/// docs/protocol.md lists each with its meaning and what to do; keep them in step.
public enum APIErrorCode: String, Sendable, Codable, CaseIterable {
    case badRequest = "bad_request"
    case invalidJSON = "invalid_json"
    case invalidName = "invalid_name"
    case invalidContainerName = "invalid_container_name"
    case invalidParameter = "invalid_parameter"
    case invalidTime = "invalid_time"
    case invalidVersion = "invalid_version"
    case invalidCursor = "invalid_cursor"
    case invalidSize = "invalid_size"
    case invalidMode = "invalid_mode"
    case invalidExtra = "invalid_extra"
    case unauthorized
    case notFound = "not_found"
    case containerNotFound = "container_not_found"
    case itemNotFound = "item_not_found"
    case chunkNotFound = "chunk_not_found"
    case versionNotFound = "version_not_found"
    case deviceNotFound = "device_not_found"
    case deviceNameTaken = "device_name_taken"
    /// A pairing code that is unknown, already used or expired.
    case pairingInvalid = "pairing_invalid"
    /// Too many wrong pairing codes from this address (or from all) in the last minute.
    case rateLimited = "rate_limited"
    case parentNotFound = "parent_not_found"
    case parentNotFolder = "parent_not_folder"
    case kindMismatch = "kind_mismatch"
    case moveCycle = "move_cycle"
    case missingChunks = "missing_chunks"
    case chunkSizeMismatch = "chunk_size_mismatch"
    case hashMismatch = "hash_mismatch"
    case bodyTooLarge = "body_too_large"
    case rangeNotSatisfiable = "range_not_satisfiable"
    case notAConflict = "not_a_conflict"
    /// The item is not an entry of Recently Deleted (live, purged, or deleted as part of a
    /// folder's entry: restore or purge the folder).
    case notInTrash = "not_in_trash"
    case methodNotAllowed = "method_not_allowed"
    case storageFull = "storage_full"
    /// A chunk upload would take the account beyond its quota (`nimbus admin set-quota`); the
    /// error carries the account's `usage` and `quota` in bytes.
    case quotaExceeded = "quota_exceeded"
    case busy
    case unavailable
    case `internal`

    public var httpStatus: Int {
        switch self {
        case .badRequest, .invalidJSON, .invalidName, .invalidContainerName, .hashMismatch, .kindMismatch, .chunkSizeMismatch,
             .invalidParameter, .invalidTime, .invalidVersion, .invalidCursor, .invalidSize, .invalidMode, .invalidExtra:
            return 400
        case .unauthorized: return 401
        case .notFound, .containerNotFound, .itemNotFound, .chunkNotFound, .versionNotFound, .deviceNotFound, .notInTrash: return 404
        case .methodNotAllowed: return 405
        case .parentNotFound, .parentNotFolder, .moveCycle, .missingChunks, .notAConflict, .deviceNameTaken: return 409
        case .pairingInvalid: return 403
        case .bodyTooLarge: return 413
        case .rateLimited: return 429
        case .rangeNotSatisfiable: return 416
        case .storageFull, .quotaExceeded: return 507
        case .unavailable, .busy: return 503
        case .internal: return 500
        }
    }
}
