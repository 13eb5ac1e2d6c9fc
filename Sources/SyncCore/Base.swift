import NimbusCore
import NimbusProtocol

/// What this device knows of an item on the server, in memory: the state it last synced (the
/// base of its next commit) and which chunks of it are in the cache file.
public struct Base: Sendable, Equatable {
    public var record: ServerItem
    /// Where each chunk of `record` starts.
    public private(set) var map: ChunkMap
    /// Start offset of each chunk of `record`, plus the total size at the end.
    public var offsets: [Int64] { map.offsets }
    /// Per chunk: in the cache file. `nil`: the whole file is present.
    public var present: [Bool]?

    public init(record: ServerItem, present: [Bool]?) {
        self.record = record
        map = ChunkMap(record.chunks)
        self.present = present.flatMap { $0.count == record.chunks.count && !$0.allSatisfy({ $0 }) ? $0 : nil }
    }

    /// A fresh placeholder: nothing present (an empty file is trivially complete).
    public static func placeholder(_ r: ServerItem) -> Base {
        Base(record: r, present: r.chunks.isEmpty ? nil : [Bool](repeating: false, count: r.chunks.count))
    }

    public var version: Int64 { record.version }

    /// Bytes of the content in the cache file.
    public var presentBytes: Int64 {
        guard let present else { return offsets[offsets.count - 1] }
        var n: Int64 = 0
        for i in present.indices where present[i] { n += offsets[i + 1] - offsets[i] }
        return n
    }
    public var complete: Bool { present == nil }

    /// After a program changed the file's content here: the whole file is in the cache file
    /// (content is written only into fully present files, which are downloaded first, or after
    /// O_TRUNC). Nil when nothing changes (the base was complete already). The engine applies it
    /// on the change's notice, and at start to every content change queued before the stop
    /// (the notice's own effect may not have reached the disk).
    public func wholeAfterLocalContent() -> Base? {
        guard !complete else { return nil }
        var b = self
        b.present = nil
        return b
    }

    /// Indices of the chunks overlapping `range` (clamped to the file).
    public func chunks(covering range: Range<Int64>) -> Range<Int> { map.covering(range) }

    public func missing(in range: Range<Int64>) -> [Int] {
        guard let present else { return [] }
        return chunks(covering: range).filter { !present[$0] }
    }
}

extension Base {
    /// The base to write for an item when `passed` was handed to the writer (nil: removed) and
    /// memory holds `memory` now: memory's when it is the same version (its presence may have
    /// changed since: a write into a placeholder marks it whole, and an older copy must not
    /// undo that on disk), else what was passed (a different version in memory is written by
    /// its own writer, after its tree change).
    public static func toWrite(passed: Base?, memory: Base?) -> Base? {
        guard let passed, let memory, memory.version == passed.version else { return passed }
        return memory
    }
}

extension Base {
    /// What a start after an unclean stop (kill -9, a full disk) does with a synced file shown
    /// here at `sizeHere` bytes: bytes may have reached it without their change being recorded.
    public enum AfterUncleanStop: Sendable, Equatable {
        /// A placeholder of its version's size: nothing was written to it.
        case leave
        /// A whole file: pushed once (unchanged, it has nothing to send).
        case push
        /// A placeholder of another size was written here (a program writes one only after
        /// downloading it whole, or after truncating it): its bytes are the program's, so it is
        /// whole and pushed too; shown as a placeholder of the other size, its reads would mix
        /// its version's bytes with zeros for good.
        case pushWhole(Base)
    }

    public func afterUncleanStop(sizeHere: Int64) -> AfterUncleanStop {
        if complete { return .push }
        if sizeHere != record.size, !Mutation.placeholderSizeAfterCrash.isOn, let whole = wholeAfterLocalContent() { return .pushWhole(whole) }
        return .leave
    }
}
