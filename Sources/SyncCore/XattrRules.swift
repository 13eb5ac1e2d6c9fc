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

    /// Whether a server state's attributes `remote` replace the item's attributes `here`: not
    /// for a symlink (it carries none), not while a change of them made here is on its way to
    /// the engine (`changeOnItsWay`), not when they changed here since the commit this state
    /// answers (`sent`: what that commit sent) — those go up next and the server merges them name
    /// by name — and not when the item's attributes pass the budget (set before it held: they
    /// stay on this device).
    public static func showRemote(_ remote: [String: [UInt8]], here: [String: [UInt8]], isSymlink: Bool, changeOnItsWay: Bool,
                                  sent: [String: [UInt8]]?) -> Bool {
        guard remote != here, !isSymlink else { return false }
        if changeOnItsWay && !Mutation.pullOverwritesUnnoticedXattrs.isOn { return false }
        return (sent.map { $0 == here } ?? true) && UserXattrs.size(here) <= UserXattrs.budget
    }
}
