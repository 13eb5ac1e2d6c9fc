import NimbusCore
import NimbusProtocol

/// What a failed upload means for what happens next (docs/sync.md "upload refused"). No failure
/// drops a queued change: each kind only says when it is tried again. Pure.
public enum UploadFailure: Sendable, Equatable {
    /// Server trouble (5xx, 413, 429, `busy`, `storage_full`), a lost connection, or an ordering
    /// race (`missing_chunks`, `parent_not_found`, `item_not_found`, `container_not_found`: the
    /// chunk, folder or container is on its way): backed off 1 s doubling to 30 s.
    case transient
    /// The server refuses this state as it is (`invalid_name`, `kind_mismatch`, …), or the file
    /// cannot be read here: shown on the item (`error`), tried again when it changes, at the next
    /// start, or after `refusedRetrySeconds`.
    case refused
    /// The server refused this device's token (401): uploads wait for a valid one.
    case unauthorized
    /// A move refused as a cycle with another device's move (`move_cycle`): it leaves the queue
    /// and the item is put back where the server has it.
    case moveRefused
    /// A chunk refused for the account's quota (`quota_exceeded`, with the server's figures):
    /// tried again after `UploadState.quotaRetrySeconds`.
    case overQuota(QuotaFigures?)

    /// How long a refused state waits before it is tried again unchanged.
    public static var refusedRetrySeconds: Int { 300 }

    /// The failure of a request: `status` nil when no answer came (a transport failure), else
    /// the HTTP status with the server's error code and quota figures if it sent them.
    public static func of(status: Int?, code: APIErrorCode? = nil, quota: QuotaFigures? = nil) -> UploadFailure {
        guard let status else { return .transient }
        if code == .unauthorized || status == 401 { return .unauthorized }
        if code == .quotaExceeded { return .overQuota(quota) }
        if status >= 500 || status == 413 || status == 429 { return .transient }
        switch code {
        case .moveCycle?: return .moveRefused
        case .missingChunks?, .parentNotFound?, .itemNotFound?, .containerNotFound?: return .transient
        default: return Mutation.retryRefusedForever.isOn ? .transient : .refused
        }
    }
}
