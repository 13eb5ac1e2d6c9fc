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

    /// The attributes a server state `remote` leaves on the item whose attributes are `here`, or
    /// nil when they stay as they are: `remote`, name by name, except the names changed here and
    /// not sent yet — those whose change is on its way to the engine (`onItsWay`) and those that
    /// changed here since the commit this state answers (`sent`: what that commit sent). Those
    /// keep their value here (or their absence) and go up next; the server merges them name by
    /// name. Every other name takes the server's value: the item's base moves to this state, so
    /// a name left behind here would read, in the next commit, as removed or set back here.
    /// Nothing for a symlink (it carries none), nor when the item's attributes pass the budget
    /// (set before it held: they stay on this device) or would with the server's.
    public static func shown(_ remote: [String: [UInt8]], here: [String: [UInt8]], isSymlink: Bool, onItsWay: Set<String>,
                             sent: [String: [UInt8]]?) -> [String: [UInt8]]? {
        guard remote != here, !isSymlink, UserXattrs.size(here) <= UserXattrs.budget else { return nil }
        var changedHere = Mutation.pullOverwritesUnnoticedXattrs.isOn ? [] : onItsWay
        if let sent {
            for name in Set(sent.keys).union(here.keys) where sent[name] != here[name] { changedHere.insert(name) }
        }
        if changedHere.isEmpty { return remote }
        if Mutation.xattrsKeptWholeBesideChange.isOn { return nil }
        var merged = remote
        for name in changedHere { merged[name] = here[name] }
        guard merged != here, UserXattrs.size(merged) <= UserXattrs.budget else { return nil }
        return merged
    }
}
