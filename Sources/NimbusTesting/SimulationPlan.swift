import NimbusCore

// The pure half of the engine-level simulation (Tests/EngineSimTests, docs/sync.md
// "Simulation"): the seeded generator, the plan of operations and the ledger of contents that
// must survive. No I/O, no clock: a seed gives the same plan on every machine. The half that
// touches ContainerFS and SyncEngine lives in the test target (NimbusTesting builds without the
// FUSE targets, NIMBUS_SERVER_ONLY).

/// SplitMix64 (Steele, Lea, Flood: "Fast splittable pseudorandom number generators", 2014):
/// 64 bits of state, every seed a good stream, the same numbers on every platform.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    public private(set) var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    /// A number in `0..<n` (n > 0). Not `Int.random(in:using:)`: its algorithm is the standard
    /// library's to change, and a replay must draw the same numbers with any toolchain.
    public mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}

/// What one step of the simulation does on one device.
public enum SimAction: String, Sendable, CaseIterable {
    /// Create `folder/name` (or truncate it when it exists) and write the step's content.
    case create
    /// Rewrite a present file (the `pick`-th, in path order) with the step's content.
    case write
    /// Rename a present file within its folder to `toName` (only when that name is free).
    case rename
    /// Move a present file to `toFolder/toName` (only when free).
    case move
    /// Delete a present file.
    case delete
    /// Create folder `folder` (one of `SimPlan.folders`) / remove it when empty.
    case mkdir, rmdir
    /// An editor's atomic save of a present file: write `.NAME.tmp` beside it (fsync), rename
    /// it over the file.
    case saveOver
    /// `rm -r` of folder `folder`: its files, then the folder.
    case rmTree
    /// Open a present file for writing (truncated), write the step's content and keep it open:
    /// the simulation closes it (fsync, close) a few steps later.
    case writeOpen
    /// An editor's save that keeps a backup (vim): rename the file to `NAME~`, write a new file
    /// under its name (fsync), delete the backup.
    case saveAside
    /// Take the device offline on purpose (`nimbus pause`) / back online.
    case pause, resume
    /// The network goes away under the device (open requests drop, new ones fail) / comes back.
    case disconnect, reconnect
    /// Stop the engine, close the store, open it again from the same state directory.
    case restart
    /// As `restart`, but the store's write-behind queue is dropped, not flushed (a `kill -9`).
    case crash
    /// Restore a Recently Deleted entry (the `pick`-th, newest first) where it was.
    case trashRestore
    /// Purge a Recently Deleted entry (the `pick`-th, newest first).
    case trashPurge
    /// Make a FIFO, a local-only item, at `folder/name` (`mkfifo`), or remove the one there.
    case mkfifo
    /// Set a user extended attribute of a present file (`setfattr`): `user.tag`, which every
    /// device sets, or the device's own `user.DEVICE`, to the step's content; now and then
    /// remove it instead (`setfattr -x`).
    case setxattr
    /// Write a `.nimbusignore` in `folder` with one of `SimPlan.ignoreRules` (the `pick`-th), or
    /// now and then remove the one there.
    case ignoreRule
    /// Give a present file (the `pick`-th) another name at `toFolder/toName` (`ln`): a hard link.
    case link
}

public struct SimStep: Sendable, CustomStringConvertible {
    public var round: Int
    public var device: Int
    public var action: SimAction
    public var folder: String
    public var name: String
    public var toFolder: String
    public var toName: String
    /// Which present file a write, rename, move or delete takes: `pick % count`, files in path
    /// order. The plan is fixed by the seed; which file that is depends on the device's tree.
    public var pick: UInt64
    /// Milliseconds to let the engines run before the next step.
    public var pause: Int
    /// Unique per step, so every content written can be found again on the server.
    public var content: String

    /// `setxattr`'s name: `user.tag` or the device's own (from `toName`, so other draws stay).
    public var xattrName: String { toName < "c" ? "user.tag" : "user." + String(UnicodeScalar(UInt8(97 + device))) }
    /// `setxattr` removes the attribute (`toFolder` is the root: one in four).
    public var xattrRemoves: Bool { toFolder.isEmpty }
    /// `ignoreRule`'s rules (from `pick`) and whether it removes the file there instead (one in four).
    public var ignoreText: String { SimPlan.ignoreRules[Int((pick >> 8) % UInt64(SimPlan.ignoreRules.count))] }
    public var ignoreRemoves: Bool { pick % 4 == 0 }

    public var description: String {
        let dev = String(UnicodeScalar(UInt8(97 + device)))
        switch action {
        case .create, .mkfifo: return "\(round): \(dev) \(action) \(SimPlan.path(folder, name))"
        case .mkdir, .rmdir, .rmTree: return "\(round): \(dev) \(action) \(folder)"
        case .rename: return "\(round): \(dev) rename #\(pick) to \(toName)"
        case .link: return "\(round): \(dev) ln #\(pick) \(SimPlan.path(toFolder, toName))"
        case .move: return "\(round): \(dev) move #\(pick) to \(SimPlan.path(toFolder, toName))"
        case .write, .delete, .saveOver, .writeOpen, .saveAside, .trashRestore, .trashPurge: return "\(round): \(dev) \(action) #\(pick)"
        case .setxattr: return "\(round): \(dev) setxattr #\(pick) \(xattrName)\(xattrRemoves ? " removed" : "")"
        case .ignoreRule:
            return "\(round): \(dev) " + (ignoreRemoves ? "rm \(SimPlan.path(folder, ".nimbusignore"))"
                : "\(SimPlan.path(folder, ".nimbusignore")) = \(String(reflecting: ignoreText))")
        case .pause, .resume, .disconnect, .reconnect, .restart, .crash: return "\(round): \(dev) \(action)"
        }
    }
}

/// The whole sequence of steps for one seed: every choice is made here, up front.
public struct SimPlan: Sendable {
    /// Folders the steps use ("" is the root). d1 and d2 exist at the start; d3 comes and goes.
    public static let folders = ["", "d1", "d2", "d3"]
    public static let initialFolders = ["d1", "d2"]
    public static let names = ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"]
    /// How often each action is drawn (out of the sum).
    public static let weights: [(SimAction, Int)] = [
        (.write, 10), (.create, 6), (.rename, 2), (.move, 2), (.delete, 2), (.mkdir, 1), (.rmdir, 1), (.saveOver, 2), (.rmTree, 1), (.writeOpen, 2), (.saveAside, 2),
        (.pause, 1), (.resume, 2), (.disconnect, 1), (.reconnect, 2), (.restart, 1), (.crash, 1),
    ]

    /// With Recently Deleted restores (`trash`), and purges too (`purges`): the same draws, from
    /// these tables.
    public static let trashWeights: [(SimAction, Int)] = weights + [(.trashRestore, 3)]
    public static let purgeWeights: [(SimAction, Int)] = weights + [(.trashRestore, 3), (.trashPurge, 1)]
    /// The desktop's run (`localOnly`): FIFOs made and removed under the names files take, and
    /// user extended attributes set and removed.
    public static let localOnlyWeights: [(SimAction, Int)] = weights + [(.mkfifo, 4), (.setxattr, 5)]
    /// The run with `.nimbusignore` files (`ignore`): rules written and removed in every folder.
    public static let ignoreWeights: [(SimAction, Int)] = weights + [(.ignoreRule, 3)]
    /// The run with hard links (`links`): files given more names, which other devices edit,
    /// rename and delete as the files they are there.
    public static let linkWeights: [(SimAction, Int)] = weights + [(.link, 5)]
    /// What `ignoreRule` writes: rules over the names and folders the steps use.
    public static let ignoreRules = ["b.txt\n", "*.txt\n!a.txt\n", "d2/\n", "c.*\n", "/e.txt\nd3/\n", "*\n!*/\n!d.txt\n"]

    public let seed: UInt64
    public let devices: Int
    public let steps: [SimStep]
    /// Device a sends the content of every file of more than 16 bytes apart from the upload
    /// queue, as big files go (`SyncEngine.Options.contentApartBytes`).
    public var contentApart = false
    /// Devices restore Recently Deleted entries (`trash`).
    public let restores: Bool

    /// Devices write `.nimbusignore` files (`ignore`); the rules go at the end.
    public let ignores: Bool

    public init(seed: UInt64, rounds: Int, devices: Int = 3, trash: Bool = false, purges: Bool = false, localOnly: Bool = false,
                ignore: Bool = false, links: Bool = false) {
        self.seed = seed
        self.ignores = ignore
        self.restores = trash || purges
        self.devices = devices
        var rng = SplitMix64(seed: seed)
        let weights = links ? Self.linkWeights : ignore ? Self.ignoreWeights : localOnly ? Self.localOnlyWeights : purges ? Self.purgeWeights : trash ? Self.trashWeights : Self.weights
        let total = weights.reduce(0) { $0 + $1.1 }
        var steps: [SimStep] = []
        steps.reserveCapacity(rounds)
        for r in 0..<rounds {
            // Always the same draws per step, whatever the action, so one change to the weights
            // or to an action's use of them does not shift every later step.
            let device = rng.below(devices)
            var w = rng.below(total)
            let action = weights.first { w -= $0.1; return w < 0 }!.0
            let folder = Self.folders[rng.below(Self.folders.count)]
            let name = Self.names[rng.below(Self.names.count)]
            let toFolder = Self.folders[rng.below(Self.folders.count)]
            let toName = Self.names[rng.below(Self.names.count)]
            let pick = rng.next()
            // Mostly back to back; now and then long enough for a push or a pull to land.
            let pause = rng.below(4) == 0 ? rng.below(40) : 0
            let mkdirFolder = Self.folders[1 + rng.below(Self.folders.count - 1)]
            steps.append(SimStep(round: r, device: device, action: action,
                                 folder: action == .mkdir || action == .rmdir || action == .rmTree ? mkdirFolder : folder, name: name,
                                 toFolder: toFolder, toName: toName, pick: pick, pause: pause,
                                 content: "seed \(seed) round \(r) device \(device)\n"))
        }
        self.steps = steps
    }

    public static func path(_ folder: String, _ name: String) -> String { folder.isEmpty ? name : folder + "/" + name }
}

/// The contents that must survive: per device and item, the last content that device wrote to
/// that item, unless the device deleted the item itself. An earlier write the same device
/// overwrote may be gone (a device syncs states, not every write: scripts/sim.py says the
/// same), and a delete elsewhere does not excuse anything: the server keeps every version.
public struct SimLedger: Sendable {
    public struct Key: Hashable, Sendable {
        public var device: Int
        public var item: ItemID
        public init(device: Int, item: ItemID) {
            self.device = device
            self.item = item
        }
    }
    public private(set) var last: [Key: String] = [:]
    public private(set) var writes = 0
    /// Per device and item it deleted: the newest server version it showed when it did (0 when
    /// it showed none). A write that survives only in the history of a deleted item was given up
    /// rightly only when the device whose delete took it had shown a version holding it.
    public private(set) var deletedShowing: [Key: Int64] = [:]
    /// Items a device purged from Recently Deleted on purpose: nothing in them need survive.
    public private(set) var purged: Set<ItemID> = []

    public init() {}

    public mutating func purged(_ items: [ItemID]) { purged.formUnion(items) }

    public mutating func wrote(device: Int, item: ItemID, content: String) {
        last[Key(device: device, item: item)] = content
        writes += 1
    }

    /// The device deleted the item itself: what it wrote there need not survive.
    public mutating func deleted(device: Int, item: ItemID) {
        last[Key(device: device, item: item)] = nil
        // An edit elsewhere may bring it back, where that device last saw it.
        placed[item] = .some(nil)
        forgetXattrs(item)
    }

    /// The same, when the device showed server version `version` of the item (nil: none).
    public mutating func deleted(device: Int, item: ItemID, showing version: Int64?) {
        deleted(device: device, item: item)
        let key = Key(device: device, item: item)
        deletedShowing[key] = max(deletedShowing[key] ?? 0, version ?? 0)
    }

    /// The device overwrote its last write to the item, but the program was told the new bytes
    /// may not be kept (fsync failed): neither must survive.
    public mutating func unpromised(device: Int, item: ItemID) {
        last[Key(device: device, item: item)] = nil
    }

    /// A file took another item's identity here (an editor's safe save: the item renamed away is
    /// deleted and the new file becomes it): what the device wrote to `from` now lives in `to`.
    public mutating func identityMoved(device: Int, from: ItemID, to: ItemID) {
        guard let c = last.removeValue(forKey: Key(device: device, item: from)) else { return }
        last[Key(device: device, item: to)] = c
    }

    /// Where the one device that moved an item last put it (`moved`); nil for an item more than
    /// one device moved, or whose place an editor's save or an identity change touched.
    public struct Place: Sendable, Equatable {
        public var device: Int
        public var parent: ItemID
        public var name: String
    }
    public private(set) var placed: [ItemID: Place?] = [:]

    /// The device renamed or moved the item there.
    public mutating func moved(device: Int, item: ItemID, parent: ItemID, name: String) {
        if let known = placed[item], known?.device != device { placed[item] = .some(nil); return }
        placed[item] = Place(device: device, parent: parent, name: name)
    }

    /// Where the item ends is no one device's choice any more.
    public mutating func placeUnknown(_ item: ItemID) {
        placed[item] = .some(nil)
        forgetXattrs(item)
    }

    /// The device was killed: renames it made without an fsync of their folder may be gone, and
    /// so may attributes it set.
    public mutating func crashed(device: Int) {
        for (id, p) in placed where p?.device == device { placed[id] = .some(nil) }
        for (k, x) in xattrs where x?.device == device { xattrs[k] = .some(nil) }
    }

    public struct XattrKey: Hashable, Sendable, Comparable {
        public var item: ItemID
        public var name: String
        public static func < (a: Self, b: Self) -> Bool { (a.item.description, a.name) < (b.item.description, b.name) }
    }
    public struct XattrSet: Sendable, Equatable {
        public var device: Int
        /// nil: removed.
        public var value: String?
    }
    /// Per item and attribute name that exactly one device set or removed: the last value it
    /// gave (`.some(nil)`: more than one device did, or the item's identity changed).
    public private(set) var xattrs: [XattrKey: XattrSet?] = [:]

    /// Items some device deleted or whose identity a save moved: attribute changes made after
    /// may go with the delete (an attribute change does not bring a deleted item back; an edit
    /// elsewhere does, with that editor's attributes).
    public private(set) var xattrsForgotten: Set<ItemID> = []

    public mutating func setXattr(device: Int, item: ItemID, name: String, value: String?) {
        guard !xattrsForgotten.contains(item) else { return }
        let k = XattrKey(item: item, name: name)
        if let known = xattrs[k], known?.device != device { xattrs[k] = .some(nil); return }
        xattrs[k] = XattrSet(device: device, value: value)
    }

    /// The item's attributes are no one device's any more (deleted, or its identity moved by a
    /// save: the saved file has the new file's attributes, as POSIX has it).
    public mutating func forgetXattrs(_ item: ItemID) {
        xattrsForgotten.insert(item)
        for k in xattrs.keys where k.item == item { xattrs[k] = .some(nil) }
    }

    /// Sorted for stable reports.
    public var mustSurvive: [(key: Key, content: String)] {
        last.map { ($0.key, $0.value) }.sorted { ($0.key.device, $0.key.item.description) < ($1.key.device, $1.key.item.description) }
    }
}
