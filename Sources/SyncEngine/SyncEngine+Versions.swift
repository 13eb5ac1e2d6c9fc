import Crypto
import Foundation
import FuseIDs
import MountPorts
import NimbusCore
import NimbusProtocol
import NimbusRemote
import Synchronization
import SyncCore

// Conflicts and versions through the mount (docs/sync.md "Conflicts and versions"): the
// conflict count of each item comes with its server record; the version list, a version's
// bytes, resolving and restoring go to the server. Those calls answer through a callback, run as
// engine jobs and are bounded by the read timeout (EIO when the server cannot answer): the FUSE
// thread that asked has long gone back to the kernel's queue (a deferred reply).

extension SyncEngine: VersionSource {
    /// Items with unresolved conflict versions, and how many each has.
    public func conflictedItems() -> [(ItemID, Int)] {
        state.withLock { s in
            guard s.items.conflicted > 0 else { return [] }
            return s.items.bases.compactMap { id, b in b.record.conflicts > 0 && !b.record.deleted ? (id, b.record.conflicts) : nil }
        }
    }

    public func hasConflictVersions(_ item: ItemID) -> Bool {
        state.withLock { s in s.base(item).map { $0.record.conflicts > 0 && !$0.record.deleted } ?? false }
    }

    /// `user.nimbus.versions`: one line per version, newest first:
    /// `VERSION<TAB>ROLE<TAB>DEVICE<TAB>TIME<TAB>SIZE` (TIME: the content's modification time, UTC).
    public func versionsText(_ item: ItemID, done: @escaping @Sendable (Result<String, Errno>) -> Void) {
        guard state.withLock({ $0.base(item) }) != nil else { return done(.success("")) }  // never uploaded: no versions yet
        serverCall(done: done) {
            try await self.client.versions(self.container, item).map { v in
                "\(v.version)\t\(v.role.rawValue)\t\(v.deviceName)\t\(Self.utc(v.state.modified))\t\(v.state.size)\n"
            }.joined()
        }
    }

    /// The other versions of `item` for `.nimbus/versions/` (conflict and earlier ones).
    public func versionEntries(_ item: ItemID, done: @escaping @Sendable (Result<[VersionEntry], Errno>) -> Void) {
        guard state.withLock({ $0.base(item) }) != nil else { return done(.success([])) }
        serverCall(done: done) {
            try await self.client.versions(self.container, item).filter { $0.role != .current && !$0.state.deleted }.map {
                VersionEntry(version: $0.version, device: $0.deviceName, modified: $0.state.modified, size: $0.state.size,
                             conflict: $0.role == .conflict)
            }
        }
    }

    /// One version of `item` for reading: its chunk list now, its bytes as they are read.
    public func openVersion(_ item: ItemID, version: Int64, done: @escaping @Sendable (Result<any VersionReader, Errno>) -> Void) {
        serverCall(done: done) {
            let versions = try await self.client.versions(self.container, item)
            guard let v = versions.first(where: { $0.version == version }), !v.state.deleted else { throw Errno.ENOENT }
            return VersionChunks(engine: self, chunks: v.state.chunks) as any VersionReader
        }
    }

    /// `user.nimbus.resolve` (`current`, or a version number to keep), `user.nimbus.restore` (a
    /// previous version to make current again) and `user.nimbus.discard` (a conflict version to
    /// drop). The server's answer is shown at once; the journal tells the other devices.
    public func resolve(_ name: NimbusXattr, value: String, item: ItemID, done: @escaping @Sendable (Errno?) -> Void) {
        let request: ResolveRequest
        switch ControlPlan.resolve(name, value: value) {
        case .request(let r): request = r
        case .invalid: return done(.EINVAL)
        case .notAllowed: return done(.EPERM)
        }
        guard state.withLock({ $0.base(item) }) != nil else { return done(.ENOENT) }
        serverCall(done: { (r: Result<Void, Errno>) in
            if case .failure(let e) = r { done(e) } else { done(nil) }
        }) {
            let r = try await self.client.resolve(self.container, item, request)
            do { try await self.loop.turn(.resolved(item)) { try self.apply([r.item]) } } catch { self.log("showing the resolved \(item) failed: \(error)") }
        }
    }

    // MARK: Recently Deleted (`.nimbus/trash/`)

    public func trashEntries(done: @escaping @Sendable (Result<[TrashEntryInfo], Errno>) -> Void) {
        serverCall(done: done) {
            let listing = try await self.client.trash(self.container)
            self.noteTrashListing(listing.entries)
            let names = Dictionary((try? await self.client.devices())?.map { ($0.id, $0.name) } ?? [], uniquingKeysWith: { a, _ in a })
            return listing.entries.map { e in
                TrashEntryInfo(id: e.item.id, isFolder: e.item.kind == .folder, path: e.path, deletedAt: e.deletedAt,
                               device: names[e.deletedBy] ?? "unknown device", expires: e.expires, size: e.item.size,
                               mode: e.item.mode, modified: e.item.modified)
            }
        }
    }

    public func trashMembers(_ root: ItemID, done: @escaping @Sendable (Result<[TrashMemberInfo], Errno>) -> Void) {
        serverCall(done: done) {
            try await self.client.trashItems(self.container, root).items.map { i in
                TrashMemberInfo(id: i.id, parent: i.parent, name: i.name.value, isFolder: i.kind == .folder, isSymlink: i.kind == .symlink,
                                size: i.size, mode: i.mode, modified: i.modified)
            }
        }
    }

    public func openTrashFile(_ root: ItemID, item: ItemID, done: @escaping @Sendable (Result<any VersionReader, Errno>) -> Void) {
        serverCall(done: done) {
            guard let i = try await self.client.trashItems(self.container, root).items.first(where: { $0.id == item }), i.kind == .file else {
                throw Errno.ENOENT
            }
            return VersionChunks(engine: self, chunks: i.chunks) as any VersionReader
        }
    }

    public func purgeTrash(_ root: ItemID, done: @escaping @Sendable (Errno?) -> Void) {
        serverCall(done: { (r: Result<Void, Errno>) in
            if case .failure(let e) = r { done(e) } else { done(nil) }
        }) {
            _ = try await self.client.purgeTrash(self.container, root)
            self.refreshTrashFigures()
        }
    }

    /// Runs a server call as an engine job and answers `done` exactly once: with its result, or
    /// EIO when sync is paused, the engine is stopping or the call outlasts the read timeout;
    /// ENOENT/EINVAL for requests the server refuses.
    func serverCall<T: Sendable>(done: @escaping @Sendable (Result<T, Errno>) -> Void,
                                 _ call: @escaping @Sendable () async throws -> T) {
        if isPaused { return done(.failure(.EIO)) }
        let answer = Once(done)
        let seconds = options.hydrationSeconds
        let started = jobs.spawn {
            let result: Result<T, any Error> = await withTaskGroup(of: Result<T, any Error>?.self) { group in
                group.addTask {
                    do { return .success(try await call()) } catch { return .failure(error) }
                }
                group.addTask {
                    await self.options.clock.sleepReal(for: .seconds(seconds))
                    return nil
                }
                let first = await group.next() ?? nil
                group.cancelAll()
                return first ?? .failure(Deadline(seconds: seconds))
            }
            switch result {
            case .success(let v): answer(.success(v))
            case .failure(let e as Errno): answer(.failure(e))
            case .failure(let d as Deadline):
                self.log("server call: no answer within \(d.seconds) s (the read timeout); answered EIO")
                answer(.failure(.EIO))
            case .failure(let e):
                self.log("server call failed: \(e)")
                switch (e as? RemoteError)?.code {
                case .notFound, .itemNotFound, .notInTrash: answer(.failure(.ENOENT))
                case .badRequest, .invalidJSON, .notAConflict, .versionNotFound: answer(.failure(.EINVAL))
                default: answer(.failure(.EIO))
                }
            }
        }
        if !started { answer(.failure(.EIO)) }
    }

    static func utc(_ ns: Int64) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime]
        return f.string(from: Date(timeIntervalSince1970: Double(ns) / 1e9))
    }
}

/// A server call outlasted the read timeout.
struct Deadline: Error { let seconds: Int64 }

/// Calls its function the first time only (answers that may race a deadline).
final class Once<T: Sendable>: Sendable {
    private let f: Mutex<(@Sendable (T) -> Void)?>
    init(_ f: @escaping @Sendable (T) -> Void) { self.f = Mutex(f) }
    func callAsFunction(_ v: T) { f.withLock { g in defer { g = nil }; return g }?(v) }
}

/// The bytes of one version, fetched a chunk at a time as they are read and checked against
/// their hash. The reader keeps the last few chunks it fetched (three at most, 4 MiB each: SyncCore `HeldChunks`) and
/// fetches the next one while the current one is read, so `cat` of a large version streams in
/// bounded memory.
final class VersionChunks: VersionReader {
    typealias Answer = @Sendable (Result<[UInt8], Errno>) -> Void
    let engine: SyncEngine
    let chunks: [ChunkRef]
    let map: ChunkMap
    public var size: Int64 { map.size }
    private let state = Mutex(HeldChunks<Answer>(kept: 3))

    init(engine: SyncEngine, chunks: [ChunkRef]) {
        self.engine = engine
        self.chunks = chunks
        map = ChunkMap(chunks)
    }

    func read(_ range: Range<Int64>, done: @escaping Answer) {
        let span = map.covering(range)
        for next in map.readAhead(after: span) { fetch(next) { _ in } }
        gather(Array(span), range: range, into: [], done: done)
    }

    private func gather(_ left: [Int], range: Range<Int64>, into out: [UInt8], done: @escaping Answer) {
        guard let i = left.first else { return done(.success(out)) }
        fetch(i) { [self] r in
            switch r {
            case .failure(let e): done(.failure(e))
            case .success(let bytes): gather(Array(left.dropFirst()), range: range, into: out + bytes[map.part(of: i, in: range)], done: done)
            }
        }
    }

    /// Calls `done` with chunk `i`'s bytes: held, joining a fetch under way, or fetched now.
    private func fetch(_ i: Int, done: @escaping Answer) {
        switch state.withLock({ $0.ask(i, done) }) {
        case .held(let b): return done(.success(b))
        case .joined: return
        case .fetch: break
        }
        let chunk = chunks[i]
        engine.serverCall(done: { [self] (r: Result<[UInt8], Errno>) in
            for w in state.withLock({ $0.ended(i, bytes: try? r.get()) }) { w(r) }
        }) { [engine] in
            let bytes = try await engine.fetchClient.getChunk(chunk.hash)
            guard bytes.count == chunk.size, ContentHash(digest: Array(SHA256.hash(data: bytes))) == chunk.hash else {
                throw SyncError("chunk \(chunk.hash) of a version arrived with other bytes")
            }
            return bytes
        }
    }
}
