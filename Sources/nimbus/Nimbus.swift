import ArgumentParser

/// The one executable. Each subcommand is a thin shell over a library target; the command tree is
/// the contract of README's CLI section.
struct Nimbus: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "nimbus",
        abstract: "Nimbus: a synced document container for Linux, mounted with FUSE.",
        subcommands: commands
    )

    #if !NIMBUS_SERVER_ONLY && canImport(CFuse3)
    static let commands: [any ParsableCommand.Type] = [Serve.self, Admin.self, Login.self, Device.self, Mount.self, Unmount.self, Status.self, Download.self,
                                                        Evict.self, Pin.self, Unpin.self, Pause.self, Resume.self,
                                                        Versions.self, Resolve.self, Restore.self, Trash.self, Policy.self,
                                                        Coordinate.self, Watch.self, Debug.self]
    #else
    // Built with NIMBUS_SERVER_ONLY=1: no FUSE targets, so no mount commands.
    static let commands: [any ParsableCommand.Type] = [Serve.self, Admin.self, Login.self, Device.self]
    #endif
}
