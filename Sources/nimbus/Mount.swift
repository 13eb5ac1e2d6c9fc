import ArgumentParser
import Foundation

/// `nimbus mount MOUNTPOINT --state DIR [--foreground]` (DESIGN §6, docs/mount.md).
///
/// Without `--foreground` it starts itself again as a background daemon (new session, output
/// to `STATE/mount.log`) and returns once the mount answers, or fails with the daemon's error.
/// A mount left dead by a crashed daemon ("Transport endpoint is not connected") is cleared first.
struct Mount: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount a container folder (FUSE) and keep serving it in the background.")

    @Argument(help: "An empty directory to mount the container on.")
    var mountpoint: String

    @Option(help: "The client state directory (local database and content cache).")
    var state: String

    @Flag(help: "Serve in this process until unmounted or interrupted (logs to stderr).")
    var foreground = false

    @Flag(help: .hidden)
    var daemonizeChild = false

    @Option(help: "Seconds to wait for the mount to become ready.")
    var timeout: Double = 30

    @Option(help: "Kernel cache timeout for names and attributes, in seconds.")
    var cacheTimeout: Double = 1

    func run() throws {
        let mp = URL(fileURLWithPath: mountpoint).standardizedFileURL.path
        let stateDir = URL(fileURLWithPath: state).standardizedFileURL.path
        #if canImport(ContainerFS)
        try MountSupport.clearDeadMount(mp)
        if foreground {
            try MountDaemon(mountpoint: mp, state: stateDir, cacheTimeout: cacheTimeout, newSession: daemonizeChild).serve()
        } else {
            try MountSupport.startDaemon(mountpoint: mp, state: stateDir, cacheTimeout: cacheTimeout, timeout: timeout)
        }
        #else
        throw CLIFailure(.usage, "this nimbus was built without FUSE support")
        #endif
    }
}

/// `nimbus unmount MOUNTPOINT`: unmounts and waits for the daemon to finish writing its state.
struct Unmount: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Unmount a container folder.")

    @Argument(help: "The mountpoint.")
    var mountpoint: String

    @Flag(help: "Detach now even if the mount is busy (lazy unmount); it goes away when no longer used.")
    var lazy = false

    func run() throws {
        let mp = URL(fileURLWithPath: mountpoint).standardizedFileURL.path
        #if canImport(ContainerFS)
        try MountSupport.unmount(mp, lazy: lazy)
        #else
        throw CLIFailure(.usage, "this nimbus was built without FUSE support")
        #endif
    }
}
