import NimbusCore
import NimbusProtocol

/// What a finished chunk download does to the item's content here.
public enum ChunkArrival: Sendable, Equatable {
    /// The chunk is marked present; the file is not whole yet.
    case present(Base)
    /// The chunk is marked present and the file is whole now.
    case whole(Base)
    /// The content was replaced since the fetch began (a newer version, or nothing of this
    /// content's file is here any more): the reads waiting for it were for the old version and
    /// fail, so no read is answered with bytes of another version.
    case replaced
    /// A program truncated the file meanwhile: its bytes rule, nothing is marked, and the reads
    /// go on.
    case overwritten
}

extension ItemTable {
    /// Chunk `index` with `hash` at `offset` of `id` arrived, checked, into the cache file of
    /// content `generation` (nil: no file of this content was open to write it). `use`: the
    /// logical clock of `CacheUse.lastUse` (just downloaded counts as used).
    public mutating func chunkArrived(_ id: ItemID, index: Int, hash: ContentHash, offset: Int64, generation: UInt64?,
                                      truncated: Bool, use: UInt64, at now: Instant,
                                      rules: UploadPacing<Instant>.Rules) -> ChunkArrival {
        guard let generation else { return .replaced }
        if truncated { return .overwritten }
        guard self[id]?.cache.generation == generation, var base = self[id]?.base,
              base.holds(chunk: index, hash: hash, at: offset) else { return .replaced }
        guard var present = base.present else { return .overwritten }
        present[index] = true
        base = Base(record: base.record, present: present)
        self[id]?.base = base
        _ = withCache(id) { $0.lastUse = use }
        guard base.complete else { return .present(base) }
        self[id]?.upload.on(.download(failed: nil), at: now, rules: rules)
        return .whole(base)
    }
}
