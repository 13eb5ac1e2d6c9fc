/// The engine's connection to the server, as `.nimbus/status` shows it (its `connection:` line).
enum ConnectionState: Sendable, Equatable, CustomStringConvertible {
    /// Not answered yet since the start or a resume.
    case connecting
    case online
    /// The last request could not reach the server; `retryIn`: the pull's next try, in seconds.
    case offline(retryIn: Int?)
    /// The server refused this device's token (401): uploads wait, changes stay queued.
    case unauthorized
    /// `nimbus pause`: no request to the server until `nimbus resume`.
    case paused

    /// Downloads asked for now would only fail (the long-poll found the server gone or the
    /// token refused).
    var isDisconnected: Bool {
        switch self {
        case .offline, .unauthorized: true
        case .connecting, .online, .paused: false
        }
    }

    var description: String {
        switch self {
        case .connecting: "connecting"
        case .online: "online"
        case .offline(let s?): "offline (retrying in \(s) s)"
        case .offline(nil): "offline (retrying)"
        case .unauthorized:
            "unauthorized (the server refused this device's token: it was revoked or is wrong; changes stay queued — mount again with a valid --token-file)"
        case .paused: "paused (nimbus resume goes online)"
        }
    }
}
