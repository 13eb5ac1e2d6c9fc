import NimbusCore
import NimbusProtocol

/// User extended attributes sync as part of an item's state (docs/sync.md "Extended attributes").
public enum XattrRules {
    /// The `extra` a commit sends: the base's, with the item's attributes as they are here. An
    /// item whose attributes pass the budget (set before it held) sends the base's as they are:
    /// they stay on this device.
    public static func draftExtra(base: JSONValue?, here: [String: [UInt8]]) -> JSONValue? {
        let synced = here.filter { UserXattrs.synced($0.key) }
        guard !Mutation.xattrsStayLocal.isOn, UserXattrs.size(synced) <= UserXattrs.budget else { return base }
        return SyncedXattrs.extra(base, with: synced)
    }
}
