import ArgumentParser
import Foundation

/// The exit codes of the CLI (docs/errors.md). A failure prints "nimbus: MESSAGE" on stderr.
enum ExitStatus: Int32 {
    case usage = 2
    case network = 3
    case storage = 4
    case inconsistent = 5
}

struct CLIFailure: Error, CustomStringConvertible {
    let status: ExitStatus
    let message: String
    init(_ status: ExitStatus, _ message: String) {
        self.status = status
        self.message = message
    }
    var description: String { message }
}

extension Nimbus {
    /// Runs the command tree, mapping `CLIFailure` to its documented exit code.
    static func mainWithExitCodes() async {
        do {
            let given = Array(CommandLine.arguments.dropFirst())
            let names = Set(Nimbus.commands.map { $0._commandName })
            let helper: [String]?
            do { helper = try MountHelper.arguments(given, commands: names) } catch {
                throw CLIFailure(.usage, "\(error)")
            }
            var command = try parseAsRoot(helper ?? given)
            if var async = command as? any AsyncParsableCommand {
                try await async.run()
            } else {
                try command.run()
            }
        } catch let failure as CLIFailure {
            FileHandle.standardError.write(Data("nimbus: \(failure.message)\n".utf8))
            Foundation.exit(failure.status.rawValue)
        } catch {
            exit(withError: error)
        }
    }
}
