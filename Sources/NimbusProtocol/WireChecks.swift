import Foundation
import NimbusCore

/// The one place where numbers and shapes that arrive from the wire are checked.
/// A request body is decoded, then `check()`ed, before anything else reads it; past this point a
/// time, size, version or cursor is inside its range and arithmetic on it cannot trap.
public struct WireProblem: Error, Sendable, Equatable, CustomStringConvertible {
    public let code: APIErrorCode
    public let message: String
    public init(_ code: APIErrorCode, _ message: String) {
        self.code = code
        self.message = message
    }
    public var description: String { "\(code.rawValue): \(message)" }
}

/// A request body that is checked after decoding.
public protocol WireChecked: Decodable {
    func check() throws(WireProblem)
    /// The value a request body holds (`JSONDecoder`'s value or error, however it is read).
    static func decodeBody(_ bytes: [UInt8]) throws -> Self
}

extension WireChecked {
    public static func decodeBody(_ bytes: [UInt8]) throws -> Self { try JSONDecoder().decode(Self.self, from: Data(bytes)) }
}

/// The ranges the protocol accepts.
public enum WireRange {
    /// Modification times, nanoseconds since 1970 (`ItemLimits.time`).
    public static let time: ClosedRange<Int64> = ItemLimits.time
    /// Item versions (journal sequence numbers start at 1).
    public static let version: ClosedRange<Int64> = 1...Int64.max
    /// Journal cursors (0: nothing seen yet).
    public static let cursor: ClosedRange<Int64> = 0...Int64.max
    /// The deepest nesting of arrays and objects inside `extra` (the object itself is level 1).
    public static let extraDepth = 32
    /// Most conflict versions one resolve may name.
    public static let maxResolveVersions = 1_000

    /// `t` moved into `time`: what a client sends for a local time the protocol cannot carry.
    public static func clampTime(_ t: Int64) -> Int64 { min(max(t, time.lowerBound), time.upperBound) }

    /// `t + 1`, staying inside `time`.
    public static func timeAfter(_ t: Int64) -> Int64 { min(clampTime(t), time.upperBound - 1) + 1 }
}

extension CommitRequest: WireChecked {
    public static func decodeBody(_ bytes: [UInt8]) throws -> CommitRequest { try FastJSON.decodeCommitRequest(bytes) }

    public func check() throws(WireProblem) {
        if item.isRoot { throw WireProblem(.badRequest, "the root folder cannot be changed") }
        if let v = baseVersion, !WireRange.version.contains(v) {
            throw WireProblem(.invalidVersion, "baseVersion \(v) is not a version (versions are 1…\(Int64.max)); send the version you last saw, or null for a new item")
        }
        if let c = seenCursor, !WireRange.cursor.contains(c) {
            throw WireProblem(.invalidCursor, "seenCursor \(c) is not a cursor (0…\(Int64.max))")
        }
        if state.parent == .root, !state.deleted, ItemName.same(state.name.value, ItemName.controlFolder) {
            throw WireProblem(.invalidName, "\"\(ItemName.controlFolder)\" at the top of a container is reserved for the control folder every mount shows there; rename the item")
        }
        try state.check()
    }
}

extension CommitBatchRequest: WireChecked {
    public static func decodeBody(_ bytes: [UInt8]) throws -> CommitBatchRequest { try FastJSON.decodeCommitBatch(bytes) }

    public func check() throws(WireProblem) {
        guard (1...ProtocolLimits.maxBatchCommits).contains(commits.count) else {
            throw WireProblem(.badRequest, "a batch carries 1…\(ProtocolLimits.maxBatchCommits) commits, not \(commits.count); split it")
        }
        var ids = Set<ItemID>()
        for c in commits {
            guard ids.insert(c.item).inserted else {
                throw WireProblem(.badRequest, "item \(c.item) is twice in one batch; send its last state once")
            }
            try c.check()
        }
    }
}

extension ItemDraft {
    public func check() throws(WireProblem) {
        if mode > 0o7777 { throw WireProblem(.invalidMode, "mode \(mode) has bits outside 0o7777; send permission bits only") }
        if !WireRange.time.contains(modified) {
            throw WireProblem(.invalidTime, "modified \(modified) is outside the times the protocol carries (\(WireRange.time.lowerBound)…\(WireRange.time.upperBound) ns since 1970); clamp it")
        }
        switch kind {
        case .file:
            if symlinkTarget != nil { throw WireProblem(.badRequest, "a file has no symlinkTarget") }
        case .folder:
            if !chunks.isEmpty || symlinkTarget != nil { throw WireProblem(.badRequest, "a folder has no chunks and no symlinkTarget") }
        case .symlink:
            guard let t = symlinkTarget, !t.isEmpty else { throw WireProblem(.badRequest, "a symlink needs a non-empty symlinkTarget") }
            if t.utf8.count > ProtocolLimits.maxSymlinkTarget {
                throw WireProblem(.badRequest, "a symlink target can be at most \(ProtocolLimits.maxSymlinkTarget) bytes")
            }
            if t.utf8.contains(0) { throw WireProblem(.badRequest, "a symlink target cannot contain NUL") }
            if !chunks.isEmpty { throw WireProblem(.badRequest, "a symlink has no chunks") }
        }
        if chunks.count > ProtocolLimits.maxChunksPerItem {
            throw WireProblem(.invalidSize, "a version can have at most \(ProtocolLimits.maxChunksPerItem) chunks; use larger chunks")
        }
        for c in chunks where c.size <= 0 || c.size > Int64(ProtocolLimits.maxChunkSize) {
            throw WireProblem(.invalidSize, "chunk \(c.hash) has size \(c.size); sizes must be 1…\(ProtocolLimits.maxChunkSize)")
        }
        if let extra { try extra.checkAsExtra() }
    }
}

extension JSONValue {
    /// `extra` is a JSON object of at most `ProtocolLimits.maxExtraBytes` bytes and
    /// `WireRange.extraDepth` levels.
    public func checkAsExtra() throws(WireProblem) {
        guard case .object = self else { throw WireProblem(.invalidExtra, "\"extra\" must be a JSON object") }
        if depth > WireRange.extraDepth {
            throw WireProblem(.invalidExtra, "\"extra\" can nest at most \(WireRange.extraDepth) levels of arrays and objects")
        }
        if serialized().utf8.count > ProtocolLimits.maxExtraBytes {
            throw WireProblem(.invalidExtra, "\"extra\" can be at most \(ProtocolLimits.maxExtraBytes) bytes of JSON")
        }
    }

    /// Levels of arrays and objects (a scalar is 0). Iterative: a deep value costs no stack.
    public var depth: Int {
        var deepest = 0
        var stack: [(JSONValue, Int)] = [(self, 0)]
        while let (v, d) = stack.popLast() {
            switch v {
            case .array(let a):
                deepest = max(deepest, d + 1)
                for x in a { stack.append((x, d + 1)) }
            case .object(let o):
                deepest = max(deepest, d + 1)
                for x in o.values { stack.append((x, d + 1)) }
            default: break
            }
        }
        return deepest
    }
}

extension TrashRestoreRequest: WireChecked {
    /// An item id decodes only as one; nothing else to check.
    public func check() throws(WireProblem) {}
}

extension ResolveRequest: WireChecked {
    public func check() throws(WireProblem) {
        if let v = version, !WireRange.version.contains(v) {
            throw WireProblem(.invalidVersion, "version \(v) is not a version (1…\(Int64.max)); list them with GET …/versions")
        }
        if let vs = versions {
            if vs.count > WireRange.maxResolveVersions {
                throw WireProblem(.invalidVersion, "a resolve can name at most \(WireRange.maxResolveVersions) versions; send several")
            }
            for v in vs where !WireRange.version.contains(v) {
                throw WireProblem(.invalidVersion, "version \(v) is not a version (1…\(Int64.max)); list them with GET …/versions")
            }
        }
    }
}

extension ChunkList: WireChecked {
    public func check() throws(WireProblem) {
        if hashes.count > ProtocolLimits.maxChunksPerItem {
            throw WireProblem(.invalidSize, "ask about at most \(ProtocolLimits.maxChunksPerItem) chunks at a time")
        }
    }
}

extension PairingRequest: WireChecked {
    public func check() throws(WireProblem) {
        if let p = DeviceNames.problem(device) { throw WireProblem(.badRequest, "device: \(p)") }
    }
}

extension PairRequest: WireChecked {
    public func check() throws(WireProblem) {
        if code.utf8.count > 64 { throw WireProblem(.pairingInvalid, "that is not a pairing code (XXXX-XXXX-XXXX)") }
        if let device, let p = DeviceNames.problem(device) { throw WireProblem(.badRequest, "device: \(p)") }
    }
}

/// Device names: what people call their machines, shown in lists and logs.
public enum DeviceNames {
    public static func problem(_ name: String) -> String? {
        if name.isEmpty || name.utf8.count > 255 { return "a device name is 1…255 bytes" }
        if name.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) { return "a device name has no control characters" }
        return nil
    }
}
