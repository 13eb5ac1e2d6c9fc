import Foundation
import NimbusCore

/// A server record in a compact binary form (first byte 1), for the sync engine's bases in
/// LocalStore's `sync_item` table: a few hundred nanoseconds per record, where JSON takes
/// microseconds and a first sync writes one per item. Rows in JSON (first byte `{`) are read too.
public enum BaseCoding {
    public static let binaryTag: UInt8 = 1

    public static func encode(_ r: ItemRecord) -> Data {
        var w = Writer()
        w.out.reserveCapacity(96 + r.name.value.utf8.count + r.chunks.count * 40)
        w.byte(binaryTag)
        w.uuid(r.id.uuid)
        w.int(r.version)
        let kind: UInt8 = switch r.kind { case .file: 0; case .folder: 1; case .symlink: 2 }
        w.byte(kind)
        w.uuid(r.parent.uuid)
        w.string(r.name.value)
        w.int(r.size)
        w.int(Int64(r.chunks.count))
        for c in r.chunks {
            w.hash(c.hash)
            w.int(c.size)
        }
        w.optionalString(r.symlinkTarget)
        w.int(Int64(r.mode))
        w.int(r.modified)
        w.uuid(r.modifiedBy.uuid)
        w.byte(r.deleted ? 1 : 0)
        w.int(Int64(r.conflicts))
        w.optionalString(r.extra?.serialized())
        return Data(w.out)
    }

    public static func decode(_ d: Data) throws -> ItemRecord {
        guard d.first == binaryTag else { return try JSONDecoder().decode(ItemRecord.self, from: d) }
        return try d.withUnsafeBytes { raw throws(BaseCodingError) -> ItemRecord in
            var r = Reader(bytes: raw)
            guard try r.byte() == binaryTag else { throw BaseCodingError() }
            let id = ItemID(try r.uuid())
            let version = try r.int()
            let kind: ItemKind = switch try r.byte() { case 0: .file; case 1: .folder; case 2: .symlink; default: throw BaseCodingError() }
            let parent = ItemID(try r.uuid())
            let name = ItemName(trusted: try r.string())
            let size = try r.int()
            let count = try r.int()
            guard count >= 0, count <= raw.count / 40 else { throw BaseCodingError() }
            var chunks: [ChunkRef] = []
            chunks.reserveCapacity(Int(count))
            for _ in 0..<count { chunks.append(ChunkRef(hash: try r.hash(), size: try r.int())) }
            let target = try r.optionalString()
            let mode = UInt32(truncatingIfNeeded: try r.int())
            let modified = try r.int()
            let by = DeviceID(try r.uuid())
            let deleted = try r.byte() != 0
            let conflicts = Int(try r.int())
            let extra = try r.optionalString()
            guard r.at == raw.count else { throw BaseCodingError() }
            let state = ItemState(kind: kind, location: ItemLocation(parent: parent, name: name),
                                  content: ItemContent(chunks: chunks, symlinkTarget: target), mode: mode,
                                  modified: modified, modifiedBy: by, deleted: deleted, extra: extra)
            var item = ItemRecord(id: id, version: version, state: state, conflicts: conflicts)
            item.size = size
            return item
        }
    }

    public static func bytes(_ p: [Bool]?) -> [UInt8]? { p.map { $0.map { $0 ? 1 : 0 } } }
    public static func bools(_ p: [UInt8]?) -> [Bool]? { p.map { $0.map { $0 != 0 } } }

    private struct Writer {
        var out: [UInt8] = []
        mutating func byte(_ b: UInt8) { out.append(b) }
        mutating func int(_ v: Int64) { withUnsafeBytes(of: v.littleEndian) { out.append(contentsOf: $0) } }
        mutating func uuid(_ u: UUID) { withUnsafeBytes(of: u.uuid) { out.append(contentsOf: $0) } }
        mutating func string(_ s: String) {
            int(Int64(s.utf8.count))
            out.append(contentsOf: s.utf8)
        }
        mutating func optionalString(_ s: String?) {
            if let s { byte(1); string(s) } else { byte(0) }
        }
        /// The 32 digest bytes of the hex.
        mutating func hash(_ h: ContentHash) {
            var hi: UInt8?
            for c in h.hex.utf8 {
                let v = c <= 57 ? c - 48 : c - 87
                if let h0 = hi { out.append(h0 << 4 | v); hi = nil } else { hi = v }
            }
        }
    }

    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        var at = 0
        mutating func take(_ n: Int) throws(BaseCodingError) -> UnsafeRawBufferPointer {
            guard n >= 0, at + n <= bytes.count else { throw BaseCodingError() }
            defer { at += n }
            return UnsafeRawBufferPointer(rebasing: bytes[at..<at + n])
        }
        mutating func byte() throws(BaseCodingError) -> UInt8 { try take(1)[0] }
        mutating func int() throws(BaseCodingError) -> Int64 {
            Int64(littleEndian: try take(8).loadUnaligned(as: Int64.self))
        }
        mutating func uuid() throws(BaseCodingError) -> UUID {
            UUID(uuid: try take(16).loadUnaligned(as: uuid_t.self))
        }
        mutating func string() throws(BaseCodingError) -> String {
            let n = try int()
            guard n >= 0, n <= Int64(bytes.count) else { throw BaseCodingError() }
            return String(decoding: try take(Int(n)), as: UTF8.self)
        }
        mutating func optionalString() throws(BaseCodingError) -> String? {
            try byte() == 0 ? nil : try string()
        }
        mutating func hash() throws(BaseCodingError) -> ContentHash { ContentHash(digest: try take(32)) }
    }
}

public struct BaseCodingError: Error, CustomStringConvertible {
    public var description: String { "a stored base record is damaged (sync_item)" }
}
