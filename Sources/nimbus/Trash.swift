#if canImport(CFuse3)
import ArgumentParser
import CFuse3  // lgetxattr (sys/xattr.h), not in Glibc's module
import Foundation
import Glibc
import NimbusCore
import NimbusProtocol
import NimbusRemote

/// `nimbus trash list|restore|purge` (docs/trash.md): Recently Deleted, as the device of a mount
/// (run inside it, or `--mount PATH`) or of `--state`/`--server` with `--container`.
struct Trash: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Recently Deleted: list what was deleted, restore it with its history, or purge it.",
        discussion: "Deleted items are kept by the server for its --keep-deleted-days (30 by default), then purged (docs/trash.md).",
        subcommands: [List.self, RestoreEntry.self, Purge.self])

    /// The device, the container and (inside a mount) where the mount is.
    struct Where: ParsableArguments {
        @OptionGroup var device: DeviceOptions
        @Option(help: "The container (the mount's own when run inside a mount).") var container: String?

        func resolve() throws -> (client: NimbusClient, container: String, root: String?) {
            let client = try device.client()
            let inside = device.mount ?? FileManager.default.currentDirectoryPath
            let root = device.state == nil && device.server == nil ? try? MountSurface.root(of: inside) : nil
            if let container { return (client, container, root) }
            guard let root else { throw CLIFailure(.usage, "say which container: --container NAME (or run it inside a Nimbus mount)") }
            let status = Dictionary(try MountSurface.statusFile(root), uniquingKeysWith: { a, _ in a })
            guard let c = status["container"], !c.isEmpty else {
                throw CLIFailure(.usage, "\(root) is a local-only mount: it has no Recently Deleted on a server")
            }
            return (client, c, root)
        }
    }

    /// `path` as the container names it ("/a/b"): relative to the mount when run inside one
    /// (it need not exist any more), else taken as a container path.
    static func containerPath(_ path: String, root: String?) throws -> String {
        guard let root else { return "/" + path.split(separator: "/").joined(separator: "/") }
        let abs = URL(fileURLWithPath: path).standardizedFileURL
        // The item is gone: its folder is what exists; compare real paths (links resolved).
        let parent = abs.deletingLastPathComponent().path
        guard let realRoot = MountSurface.realPath(root) else { throw CLIFailure(.usage, "\(root) cannot be read") }
        var rel: String
        if let realParent = MountSurface.realPath(parent) {
            guard realParent == realRoot || realParent.hasPrefix(realRoot + "/") else { throw CLIFailure(.usage, "\(path) is not inside the mount at \(root)") }
            rel = String(realParent.dropFirst(realRoot.count))
        } else {
            // A deleted folder's child: the nearest existing folder, then the rest as named.
            var tail: [String] = []
            var p = URL(fileURLWithPath: parent)
            while MountSurface.realPath(p.path) == nil, p.path != "/" { tail.insert(p.lastPathComponent, at: 0); p.deleteLastPathComponent() }
            guard let real = MountSurface.realPath(p.path), real == realRoot || real.hasPrefix(realRoot + "/") else {
                throw CLIFailure(.usage, "\(path) is not inside the mount at \(root)")
            }
            rel = String(real.dropFirst(realRoot.count)) + (tail.isEmpty ? "" : "/" + tail.joined(separator: "/"))
        }
        let name = abs.lastPathComponent
        if abs.path == realRoot || abs.path == root { return "/" }
        return rel + "/" + name
    }

    /// The entry `arg` names: an item id, or the path it had (the newest deletion of that path).
    static func entry(_ arg: String, in listing: [TrashEntry], root: String?) throws -> (TrashEntry, others: Int) {
        if let id = ItemID(arg) {
            guard let e = listing.first(where: { $0.item.id == id }) else {
                throw CLIFailure(.usage, "\(arg) is not in Recently Deleted (it was restored or purged, or it went with a deleted folder: restore the folder); `nimbus trash list` shows what is")
            }
            return (e, 0)
        }
        let path = try containerPath(arg, root: root)
        let matches = listing.filter { $0.path == path }.sorted { $0.deletedAt > $1.deletedAt }
        guard let newest = matches.first else {
            let inside = listing.filter { $0.path.hasPrefix(path + "/") }
            let hint = inside.isEmpty ? "" : " (\(inside.count) entr\(inside.count == 1 ? "y" : "ies") deleted inside it are; name one)"
            throw CLIFailure(.usage, "nothing in Recently Deleted was at \(path)\(hint); `nimbus trash list` shows what is")
        }
        return (newest, matches.count - 1)
    }

    static func utc(_ ns: Int64) -> String {
        var t = time_t(ns / 1_000_000_000)
        var tmv = tm()
        gmtime_r(&t, &tmv)
        return String(format: "%04d-%02d-%02d %02d:%02d:%02d", tmv.tm_year + 1900, tmv.tm_mon + 1, tmv.tm_mday, tmv.tm_hour, tmv.tm_min, tmv.tm_sec)
    }

    static func size(_ bytes: Int64) -> String {
        let units = ["B", "KB", "MB", "GB", "TB"]
        var v = Double(bytes), u = 0
        while v >= 1000, u < units.count - 1 { v /= 1000; u += 1 }
        return u == 0 ? "\(bytes) B" : String(format: "%.1f %@", v, units[u])
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "What was deleted (at or under PATH), newest first: when, by which device, how much, until when it is kept.")
        @Argument(help: "Only what was at or under this path (default: everything).") var path: String?
        @Flag(help: "One JSON object per entry.") var json = false
        @OptionGroup var place: Where

        func run() async throws {
            let (client, container, root) = try place.resolve()
            let listing = try await talk { try await client.trash(container) }
            let scope = try path.map { try Trash.containerPath($0, root: root) }
            let shown = listing.entries.filter { e in scope.map { $0 == "/" || e.path == $0 || e.path.hasPrefix($0 + "/") } ?? true }
            let names = Dictionary((try? await client.devices())?.map { ($0.id, $0.name) } ?? [], uniquingKeysWith: { a, _ in a })
            if json {
                for e in shown {
                    let obj: [String: Any] = [
                        "id": e.item.id.description, "path": e.path, "kind": e.item.kind.rawValue, "deletedAt": Trash.utc(e.deletedAt),
                        "deletedBy": names[e.deletedBy] ?? e.deletedBy.description, "deviceID": e.deletedBy.description,
                        "expires": Trash.utc(e.expires), "items": e.items, "bytes": e.bytes,
                    ]
                    print(String(decoding: try JSONSerialization.data(withJSONObject: obj, options: [.sortedKeys]), as: UTF8.self))
                }
                return
            }
            guard !shown.isEmpty else { print("Recently Deleted is empty\(scope.map { $0 == "/" ? "" : " under \($0)" } ?? "")"); return }
            let rows = [["DELETED (UTC)", "BY", "ITEMS", "SIZE", "KEPT UNTIL (UTC)", "PATH"]] + shown.map { e in
                [Trash.utc(e.deletedAt), names[e.deletedBy] ?? String(e.deletedBy.description.prefix(8)), String(e.items), Trash.size(e.bytes),
                 Trash.utc(e.expires), e.path + (e.item.kind == .folder ? "/" : "")]
            }
            let widths = (0..<5).map { c in rows.map { $0[c].count }.max() ?? 0 }
            for r in rows {
                print((0..<6).map { c in c == 5 ? r[c] : r[c].padding(toLength: widths[c], withPad: " ", startingAt: 0) }.joined(separator: "  "))
            }
        }
    }

    struct RestoreEntry: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "restore",
            abstract: "Bring a deleted item back with its history and conflict versions, where it was or into --to FOLDER; a taken name becomes NAME 2.",
            discussion: "PATH is where the item was (the newest deletion of that path), or give its id (`nimbus trash list --json`).")
        @Argument(help: "The path the item had, or its id.") var item: String
        @Option(help: "Restore into this folder instead (a path in the mount, or a folder id).") var to: String?
        @OptionGroup var place: Where

        func run() async throws {
            let (client, container, root) = try place.resolve()
            let listing = try await talk { try await client.trash(container) }
            let (e, older) = try Trash.entry(item, in: listing.entries, root: root)
            var folder: ItemID?
            if let to {
                if let id = ItemID(to) { folder = id } else {
                    guard root != nil else { throw CLIFailure(.usage, "--to: give a folder id outside a mount") }
                    var buf = [UInt8](repeating: 0, count: 64)
                    let n = lgetxattr(to, NimbusXattr.itemid.name, &buf, buf.count)
                    guard n > 0, let id = ItemID(String(decoding: buf[0..<n], as: UTF8.self)) else {
                        throw CLIFailure(.usage, "--to \(to): not a folder of the mount (\(String(cString: strerror(errno))))")
                    }
                    folder = id
                }
            }
            let r = try await talk { try await client.restoreTrash(container, e.item.id, to: folder) }
            let name = r.item.name.value
            let was = e.path
            let parentPath = folder == nil ? String(was[..<(was.lastIndex(of: "/") ?? was.startIndex)]) : "the folder given"
            print("restored \(was)\(r.renamed ? " as \(parentPath.isEmpty ? "" : parentPath)/\(name) (the name was taken)" : "")"
                  + (folder != nil && !r.renamed ? " into \(to ?? "")" : "") + ": \(r.restored) item\(r.restored == 1 ? "" : "s")")
            if older > 0 { print("\(older) older deletion\(older == 1 ? "" : "s") of \(was) stay\(older == 1 ? "s" : "") in Recently Deleted") }
        }
    }

    struct Purge: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete for good: the item and every version of it (its bytes go at the server's next chunk collection).")
        @Argument(help: "The path the item had, or its id.") var item: String?
        @Flag(help: "Purge everything in Recently Deleted.") var all = false
        @OptionGroup var place: Where

        func validate() throws {
            if all == (item != nil) { throw ValidationError("give a PATH or id, or --all") }
        }

        func run() async throws {
            let (client, container, root) = try place.resolve()
            let r: TrashPurgeResponse
            var what = "everything in Recently Deleted"
            if all {
                r = try await talk { try await client.purgeTrash(container, nil) }
            } else {
                let listing = try await talk { try await client.trash(container) }
                let (e, _) = try Trash.entry(item ?? "", in: listing.entries, root: root)
                what = e.path
                r = try await talk { try await client.purgeTrash(container, e.item.id) }
            }
            print("purged \(what): \(r.entries) entr\(r.entries == 1 ? "y" : "ies"), \(r.items) item\(r.items == 1 ? "" : "s"), \(Trash.size(r.bytes))")
        }
    }
}
#endif
