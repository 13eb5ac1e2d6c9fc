#if canImport(ContainerFS)
import ContainerFS
import Foundation
import FuseKit
import Glibc
import LocalStore
import MountPorts
import NimbusLog
import NimbusRemote
import SyncEngine

/// One mounted container, served in this process until unmounted or signalled.
struct MountDaemon {
    let mountpoint: String
    let state: String
    let cacheTimeout: Double
    /// Started by `nimbus mount` in the background: leave the caller's session and terminal.
    let newSession: Bool
    /// Sync with a server; nil = local-only.
    let remote: RemoteConfig?

    func serve() throws {
        if newSession { setsid() }
        raiseFileLimit()
        let lock = try lockState()
        defer { close(lock) }
        let status = DaemonStatus.start(state: state)

        let store: LocalStore
        do { store = try LocalStore(directory: URL(fileURLWithPath: state)) } catch {
            throw CLIFailure(.storage, "cannot open the state in \(state): \(error)")
        }
        var options = ContainerFS.Options()
        options.entryTimeout = cacheTimeout
        options.attrTimeout = cacheTimeout
        options.negativeTimeout = cacheTimeout
        options.downloadPolicy = DownloadPolicy(file: DownloadPolicy.file(inState: URL(fileURLWithPath: state)))
        options.presenterTimeout = .milliseconds(Int64((remote?.presenterTimeout ?? 2) * 1000))
        var engine: SyncEngine?
        if let remote {
            do {
                var o = SyncEngine.Options()
                o.cacheLimit = remote.cacheSize
                o.hydrationSeconds = Int64(max(1, remote.readTimeout.rounded(.up)))
                o.quietPeriod = .milliseconds(Int64(remote.quietPeriod * 1000))
                let http = try ServerAddress.httpClient(caFile: remote.caFile)
                engine = try SyncEngine(store: store, client: NimbusClient(baseURL: remote.server, token: remote.token, http: http),
                                        container: remote.container, options: o)
            } catch {
                store.close()
                throw CLIFailure(.usage, "\(error)")
            }
        }
        // The coordinator, the event log and the presenter hub: one of each, shared by the
        // filesystem and the engine.
        let services = try MountServices.open(store: store, presenterTimeout: options.presenterTimeout)
        let fs = try ContainerFS(store: store, options: options, content: engine ?? LocalContent(), observer: engine,
                                 syncStatus: engine, control: engine, versions: engine, services: services)
        if let engine, engine.isPaused {
            try engine.attach(fs, services: services)
            log("sync is paused (nimbus resume \(mountpoint) goes online)")
        } else if let engine {
            try engine.attach(fs, services: services)
            if let why = certificateProblem(remote!) {
                store.close()
                throw CLIFailure(.usage, "cannot trust \(remote!.server): \(why)")
            }
            // The first sync before mounting, so the mount shows the container at once. An
            // unreachable server is not fatal: the mount serves what it has and retries.
            let done = DispatchSemaphore(value: 0)
            let outcome = Outcome()
            let first = Task {
                do { try await engine.initialSync() } catch {
                    outcome.set("\(error)", fatal: [.unauthorized, .invalidContainerName].contains((error as? RemoteError)?.code))
                }
                done.signal()
            }
            if done.wait(timeout: .now() + 20) == .timedOut {
                first.cancel()
                log("first sync with \(remote!.server) did not finish within 20 s; continuing in the background")
            } else if let e = outcome.get(), outcome.fatal {
                store.close()
                throw CLIFailure(.usage, "the server refused this mount: \(e) (check the token: nimbus admin add-device prints one)")
            } else if let e = outcome.get() {
                log("first sync failed: \(e); serving local state and retrying in the background")
            }
        }

        var mountOptions = FuseMountOptions()
        // As root, let every user in (pjdfstest switches users); the kernel checks permissions.
        mountOptions.allowOther = getuid() == 0
        mountOptions.defaultPermissions = true
        mountOptions.handlesKillPriv = true
        let session: FuseSession
        do { session = try FuseSession(filesystem: FuseAdapter(fs), mountpoint: mountpoint, options: mountOptions) } catch {
            store.close()
            throw CLIFailure(.storage, "\(error)")
        }
        let signals = session.exitOnSignals()
        do { try services.presenters.listen(at: state + "/presenters.sock") } catch {
            log("presenters are not available: \(error)")
        }
        defer { services.presenters.stop() }
        fs.setKernel(SessionKernelCache(session))
        engine?.start()
        if let remote {
            // What `nimbus device …` run inside this mount needs to act as its device (no token).
            do { try MountIdentity(server: remote.server, caFile: remote.caFile, insecure: remote.insecure, tokenFile: remote.tokenFile).save(state: state) } catch {
                log("device commands inside this mount will need --server and --token-file: \(error)")
            }
        }
        log("mounted \(mountpoint) (state \(state), pid \(getpid())\(remote.map { ", syncing \($0.container) on \($0.server)" } ?? ""))")
        let rc = session.run()
        fs.saveEventSequence()
        _ = signals
        if let engine {
            let stopped = DispatchSemaphore(value: 0)
            Task { await engine.stop(); stopped.signal() }
            _ = stopped.wait(timeout: .now() + 10)
        }
        // Queued invalidations go out before the session does.
        fs.drainKernel()
        // Bounded: a state that cannot be saved (a full disk) is retried for a few seconds, then
        // reported — in the log, to `nimbus unmount` (daemon.status) and as exit status 4.
        if let failure = store.close() {
            let message = "the local state in \(state) could not be saved at unmount: \(failure.message)"
            log(message + "; what was saved before is synced again at the next mount")
            DaemonStatus.finish(status, saved: message)
            throw CLIFailure(.storage, message)
        }
        DaemonStatus.finish(status, saved: nil)
        log("unmounted \(mountpoint) (loop result \(rc))")
    }

    /// A server whose certificate this device does not trust is a setting to fix, like a bad
    /// token: the mount fails at once and says why, instead of retrying in the background. One
    /// request without connection retries, bounded (a server that cannot be reached now is not
    /// a problem here: the mount starts offline).
    func certificateProblem(_ remote: RemoteConfig) -> String? {
        guard remote.server.lowercased().hasPrefix("https:"),
              let http = try? ServerAddress.httpClient(caFile: remote.caFile, retryConnects: false) else { return nil }
        var client = NimbusClient(baseURL: remote.server, token: remote.token, http: http)
        client.timeout = .seconds(10)
        let done = DispatchSemaphore(value: 0)
        let outcome = Outcome()
        Task {
            do { _ = try await client.whoami() } catch RemoteError.certificate(let why) { outcome.set(why, fatal: true) } catch {}
            done.signal()
        }
        _ = done.wait(timeout: .now() + 12)
        return outcome.fatal ? outcome.get() : nil
    }

    func log(_ s: String) {
        LogLine.write("nimbus mount", s)
    }

    /// One daemon per state directory: an exclusive lock on STATE/lock, waited for briefly (a
    /// daemon that was just unmounted may still be committing).
    func lockState() throws -> Int32 {
        try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
        let fd = Glibc.open(state + "/lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw CLIFailure(.storage, "cannot open \(state)/lock: \(String(cString: strerror(errno)))") }
        for _ in 0..<500 {
            if flock(fd, LOCK_EX | LOCK_NB) == 0 { return fd }
            usleep(20_000)
        }
        close(fd)
        throw CLIFailure(.usage, "the state directory \(state) is in use by another nimbus mount")
    }

    /// Every open file is a descriptor here; allow as many as the hard limit.
    func raiseFileLimit() {
        var r = rlimit()
        if getrlimit(Int32(RLIMIT_NOFILE.rawValue), &r) == 0 {
            r.rlim_cur = r.rlim_max
            setrlimit(Int32(RLIMIT_NOFILE.rawValue), &r)
        }
    }
}

/// A result handed from a task to the waiting main thread.
final class Outcome: @unchecked Sendable {
    // @unchecked: guarded by `lock`.
    private let lock = NSLock()
    private var value: String?
    private var isFatal = false
    func set(_ v: String, fatal: Bool) { lock.lock(); value = v; isFatal = fatal; lock.unlock() }
    var fatal: Bool { lock.lock(); defer { lock.unlock() }; return isFatal }
    func get() -> String? { lock.lock(); defer { lock.unlock() }; return value }
}
#endif
