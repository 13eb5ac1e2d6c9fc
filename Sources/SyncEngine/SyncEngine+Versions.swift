import ContainerFS
import Foundation
import FuseKit
import NimbusCore
import NimbusProtocol
import NimbusRemote

// Conflicts and versions through the mount (docs/sync.md "Conflicts and versions"): the
// conflict count of each item comes with its server record; the version list, resolving and
// restoring go to the server, bounded by the read timeout (EIO when it cannot answer).

extension SyncEngine {
    /// Items with unresolved conflict versions, and how many each has.
    public func conflictedItems() -> [(ItemID, Int)] {
        state.withLock { s in s.bases.compactMap { id, b in b.record.conflicts > 0 && !b.record.deleted ? (id, b.record.conflicts) : nil } }
    }

    public func hasConflictVersions(_ item: ItemID) -> Bool {
        state.withLock { s in s.bases[item].map { $0.record.conflicts > 0 && !$0.record.deleted } ?? false }
    }

    /// `user.nimbus.versions`: one line per version, newest first:
    /// `VERSION<TAB>ROLE<TAB>DEVICE<TAB>TIME<TAB>SIZE` (TIME: the content's modification time, UTC).
    public func fetchItemAttribute(_ name: String, item: ItemID) throws(Errno) -> String? {
        guard name == "versions" else { return nil }
        guard state.withLock({ $0.bases[item] }) != nil else { return "" }  // never uploaded: no versions yet
        let versions = try bounded { try await self.client.versions(self.container, item) }
        return versions.map { v in
            "\(v.version)\t\(v.role.rawValue)\t\(v.deviceName)\t\(Self.utc(v.state.modified))\t\(v.state.size)\n"
        }.joined()
    }

    /// The other versions of `item` for `.nimbus/versions/` (conflict and earlier ones).
    public func versionEntries(_ item: ItemID) throws(Errno) -> [VersionEntry] {
        guard state.withLock({ $0.bases[item] }) != nil else { return [] }
        let versions = try bounded { try await self.client.versions(self.container, item) }
        return versions.filter { $0.role != .current && !$0.state.deleted }.map {
            VersionEntry(version: $0.version, device: $0.deviceName, modified: $0.state.modified, size: $0.state.size,
                         conflict: $0.role == .conflict)
        }
    }

    /// The bytes of one version, fetched chunk by chunk (at most 256 MiB: it is served from
    /// memory), waiting at most the read timeout plus a second per 8 MB.
    public func versionContent(_ item: ItemID, version: Int64) throws(Errno) -> [UInt8] {
        let versions = try bounded { try await self.client.versions(self.container, item) }
        guard let v = versions.first(where: { $0.version == version }) else { throw .ENOENT }
        guard v.state.size <= 256 << 20 else { throw .EFBIG }
        let chunks = v.state.chunks
        return try bounded(extra: Int(v.state.size / 8_000_000)) {
            var out: [UInt8] = []
            out.reserveCapacity(Int(v.state.size))
            for c in chunks { out += try await self.fetchClient.getChunk(c.hash) }
            return out
        }
    }

    /// `user.nimbus.resolve` (`current`, or a version number to keep) and `user.nimbus.restore`
    /// (a previous version to make current again), and `user.nimbus.discard` (a conflict version
    /// to drop). The server's answer is shown at once; the journal tells the other devices.
    func resolveAttribute(_ name: String, value: String, item: ItemID) throws(Errno) {
        let request: ResolveRequest
        switch (name, value) {
        case ("resolve", "current"): request = ResolveRequest(action: .keepCurrent)
        case ("resolve", _):
            guard let v = Int64(value) else { throw .EINVAL }
            request = ResolveRequest(action: .keepVersion, version: v)
        case ("restore", _):
            guard let v = Int64(value) else { throw .EINVAL }
            request = ResolveRequest(action: .restore, version: v)
        case ("discard", _):
            guard let v = Int64(value) else { throw .EINVAL }
            request = ResolveRequest(action: .discard, versions: [v])
        default: throw .EPERM
        }
        guard state.withLock({ $0.bases[item] }) != nil else { throw .ENOENT }
        let r = try bounded { try await self.client.resolve(self.container, item, request) }
        do { try apply([r.item]) } catch { log("showing the resolved \(item) failed: \(error)") }
    }

    /// Runs a server call from a FUSE thread, waiting at most the read timeout: EIO when the
    /// server cannot answer in time or sync is paused, EINVAL/ENOENT for requests it refuses.
    func bounded<T: Sendable>(extra: Int = 0, _ call: @escaping @Sendable () async throws -> T) throws(Errno) -> T {
        if isPaused { throw .EIO }
        let box = ResultBox<T>()
        let done = DispatchSemaphore(value: 0)
        let task = Task {
            do { box.set(.success(try await call())) } catch { box.set(.failure(error)) }
            done.signal()
        }
        if done.wait(timeout: .now() + .seconds(Int(options.hydrationSeconds) + extra)) == .timedOut {
            task.cancel()
            throw .EIO
        }
        switch box.get() {
        case .success(let v)?: return v
        case .failure(let e)?:
            log("server call failed: \(e)")
            switch (e as? RemoteError)?.code {
            case .notFound, .itemNotFound: throw .ENOENT
            case .badRequest, .invalidJSON, .notAConflict, .versionNotFound: throw .EINVAL
            default: throw .EIO
            }
        case nil: throw .EIO
        }
    }

    static func utc(_ ns: Int64) -> String {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime]
        return f.string(from: Date(timeIntervalSince1970: Double(ns) / 1e9))
    }
}

final class ResultBox<T: Sendable>: @unchecked Sendable {
    // @unchecked: guarded by `lock`.
    private let lock = NSLock()
    private var value: Result<T, any Error>?
    func set(_ v: Result<T, any Error>) { lock.lock(); value = v; lock.unlock() }
    func get() -> Result<T, any Error>? { lock.lock(); defer { lock.unlock() }; return value }
}
