import NimbusCore
import NimbusProtocol

/// What the control xattrs a program sets on an item ask of the engine. Pure.
public enum ControlPlan {
    /// What `user.nimbus.resolve|restore|discard` = `value` asks of the server.
    public enum Resolve: Hashable, Sendable {
        case request(ResolveRequest)
        /// Not a version number (`EINVAL`).
        case invalid
        /// Not a resolving xattr (`EPERM`).
        case notAllowed
    }

    /// `resolve` = `current` or a version to keep; `restore` = a previous version to make current
    /// again; `discard` = a conflict version to drop.
    public static func resolve(_ name: NimbusXattr, value: String) -> Resolve {
        if name == .resolve, value == "current" { return .request(ResolveRequest(action: .keepCurrent)) }
        let action: ResolveRequest.Action
        switch name {
        case .resolve: action = .keepVersion
        case .restore: action = .restore
        case .discard: action = .discard
        default: return .notAllowed
        }
        guard let v = Int64(value) else { return .invalid }
        return .request(action == .discard ? ResolveRequest(action: .discard, versions: [v]) : ResolveRequest(action: action, version: v))
    }

    /// A flag set through an xattr (`pinned`, `evict`, `download`, `paused`): 1/yes/true/on or
    /// 0/no/false/off, any case; nil for anything else (`EINVAL`).
    public static func flag(_ value: String) -> Bool? {
        switch value.lowercased() {
        case "1", "yes", "true", "on": true
        case "0", "no", "false", "off": false
        default: nil
        }
    }
}
