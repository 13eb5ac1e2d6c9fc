import Foundation
import NimbusCore

/// An item's user extended attributes (`UserXattrs`) as they travel: inside the state's `extra`
/// object, under `"xattrs"`, each name with its value in base64
/// (docs/protocol.md "Items and versions"). A state without the key says nothing about them
/// (a device that never synced any); `{}` says the item has none.
public enum SyncedXattrs {
    public static let key = "xattrs"

    /// The attributes a state carries; nil when it says nothing of them. Entries that are not
    /// well formed (a name not synced, a value not base64) are left out.
    public static func of(_ extra: JSONValue?) -> [String: [UInt8]]? {
        guard case .object(let fields)? = extra, case .object(let entries)? = fields[key] else { return nil }
        var out: [String: [UInt8]] = [:]
        for (name, value) in entries where UserXattrs.synced(name) {
            guard case .string(let b64) = value, let bytes = Data(base64Encoded: b64) else { continue }
            out[name] = [UInt8](bytes)
        }
        return out
    }

    /// `extra` with the attributes set to `xattrs` (every other field kept as it is). With no
    /// attributes and a state that never had the key, `extra` stays as it is.
    public static func extra(_ extra: JSONValue?, with xattrs: [String: [UInt8]]) -> JSONValue? {
        var fields: [String: JSONValue] = [:]
        if case .object(let f)? = extra { fields = f }
        if xattrs.isEmpty && fields[key] == nil { return extra }
        fields[key] = .object(xattrs.mapValues { .string(Data($0).base64EncodedString()) })
        return .object(fields)
    }
}

/// The server's merge of a commit's `extra` with the current one, given the committer's base
/// (`ConflictRules.decide`): field by field, and inside an object field (the item's
/// attributes) name by name, what the committer changed since its base is theirs, everything
/// else stays as it is now. So two devices that set different attributes of one item keep both,
/// and an attribute set on one device and a content edit on another both survive.
public enum ExtraMerge {
    public static func threeWay(base: String?, current: String?, incoming: String?) -> String? {
        let b = base.flatMap(JSONValue.parse), c = current.flatMap(JSONValue.parse), i = incoming.flatMap(JSONValue.parse)
        return merge(base: b, current: c, incoming: i, depth: 0)?.serialized()
    }

    static func merge(base: JSONValue?, current: JSONValue?, incoming: JSONValue?, depth: Int) -> JSONValue? {
        if incoming == base { return current }
        guard depth < 2 else { return incoming }
        var b: [String: JSONValue] = [:], c: [String: JSONValue] = [:], i: [String: JSONValue] = [:]
        switch (base, incoming) {
        case (_, .object(let o)?): i = o
        // An object the committer no longer has (its state is of before it had the field) is
        // taken as empty: what the base had is removed, what others added since stays.
        case (.object?, nil): break
        default: return incoming
        }
        if case .object(let o)? = base { b = o }
        if case .object(let o)? = current { c = o } else if current != nil && current != .null { return incoming }
        var out = c
        for k in Set(i.keys).union(b.keys) {
            if let v = merge(base: b[k], current: c[k], incoming: i[k], depth: depth + 1) { out[k] = v } else { out[k] = nil }
        }
        return .object(out)
    }
}
