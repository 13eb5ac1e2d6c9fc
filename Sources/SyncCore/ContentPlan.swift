import NimbusCore
import NimbusProtocol

// The rules of an item's content here: which chunks to fetch ahead of a reader, what a shown
// server state leaves of the content here, whether a downloaded chunk still belongs, and what
// base a commit's answer that cannot be shown leaves. Pure.

extension CacheUse {
    /// A read of `range`: one that starts where the last ended extends the sequential run.
    /// Returns the bytes read in a row so far.
    public mutating func read(_ range: Range<Int64>) -> Int64 {
        readRun = readEnd == range.lowerBound ? readRun + (range.upperBound - range.lowerBound) : 0
        readEnd = range.upperBound
        return readRun
    }
}

extension Base {
    /// Bytes read in a row before prefetch starts (a random read of one range never prefetches).
    public static var prefetchAfter: Int64 { 4 << 20 }

    /// The missing chunks to fetch ahead of a reader that read `run` bytes in a row ending with
    /// `range`: none before `prefetchAfter`, then a window that grows with the run, 2 chunks
    /// after 4 MiB up to 16.
    public func readAhead(after range: Range<Int64>, run: Int64) -> [Int] {
        guard run >= Self.prefetchAfter, let present else { return [] }
        let window = Int(min(16, max(2, run / (2 << 20))))
        let from = chunks(covering: range).upperBound
        return (from..<min(from + window, record.chunks.count)).filter { !present[$0] }
    }

    /// The base once server state `item` is shown over `old` (nil: none here): its presence
    /// stays when the content is the same, else nothing of it is here yet. A delete has none.
    public static func afterShowing(_ item: ServerItem, over old: Base?) -> Base? {
        if item.deleted { return nil }
        guard let old, old.record.chunks == item.chunks else { return .placeholder(item) }
        return Base(record: item, present: old.present)
    }

    /// Whether chunk `index` with `hash` at `offset` is still part of this content (a newer
    /// version may have replaced it while it was being fetched).
    public func holds(chunk index: Int, hash: ContentHash, at offset: Int64) -> Bool {
        index < record.chunks.count && record.chunks[index].hash == hash && offsets[index] == offset
    }

    /// The base a commit's answer leaves when it cannot be shown here (its place taken, or the
    /// file written since the content was read): the previous one, so the answer still counts
    /// as news and a write goes on the base it was made on. A first commit keeps `answer` when
    /// it holds the content sent (`answerIsSent`), and none when it does not — a create sent
    /// again after its answer was lost, answered with another device's edit of it: the bytes
    /// here are not that content, so it must stay news (shown with its content when the way is
    /// free) and a write here must not go on it as if it had been seen (the server finds the
    /// item's first version as the base of a create it has, and keeps both edits).
    /// A file whose bytes are all here — written since, or whole when the push began — is
    /// marked whole, or reads would fetch the server's content over the write and the next push
    /// would find nothing to send.
    public static func keptWhenNotShown(previous: Base?, answer: Base, answerIsSent: Bool, isFile: Bool, wholeHere: Bool) -> Base? {
        guard var kept = previous ?? (answerIsSent || Mutation.answerKeptOverOtherBytes.isOn ? answer : nil) else { return nil }
        if isFile, wholeHere { kept.present = nil }
        return kept
    }
}

/// A chunk to download: where it sits in the content and what it must hash to.
public struct ChunkWant: Sendable, Equatable {
    public var index: Int
    public var hash: ContentHash
    public var offset: Int64
}

/// What a read of a file needs from the server.
public enum ReadNeed: Sendable, Equatable {
    /// Every byte of the range is here (or the item has no synced content).
    case here
    /// Chunks are missing and downloads are refused now (paused, or the server just proved
    /// unreachable): the read fails at once.
    case refused
    /// These chunks are downloaded first.
    case fetch([ChunkWant])
}

extension Base {
    /// The chunks `indices` as downloads.
    public func wants(_ indices: [Int]) -> [ChunkWant] {
        indices.map { ChunkWant(index: $0, hash: record.chunks[$0].hash, offset: offsets[$0]) }
    }

    /// Every chunk not here.
    public var missingChunks: [Int] { present.map { p in p.indices.filter { !p[$0] } } ?? [] }

    /// What a read of `range` of `base` needs (`refused`: downloads cannot go now).
    public static func need(_ base: Base?, _ range: Range<Int64>, refused: @autoclosure () -> Bool) -> ReadNeed {
        guard let base, case let missing = base.missing(in: range), !missing.isEmpty else { return .here }
        return refused() ? .refused : .fetch(base.wants(missing))
    }

    /// Before a read of `range` of `base`: whether its bytes are all here, and the chunks to
    /// fetch ahead of a sequential reader (none when downloads are `refused`). `run` notes the
    /// read in the file's cache use and answers the bytes read in a row; it is called only for
    /// a file not wholly here.
    public static func beforeRead(_ base: Base?, _ range: Range<Int64>, refused: @autoclosure () -> Bool,
                                  run: () -> Int64) -> (present: Bool, ahead: [ChunkWant]) {
        guard let base, !base.complete else { return (true, []) }
        let ahead = base.readAhead(after: range, run: run())
        return (base.missing(in: range).isEmpty, ahead.isEmpty || refused() ? [] : base.wants(ahead))
    }
}
