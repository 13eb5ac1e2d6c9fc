import ArgumentParser
import Foundation
import NimbusServer

struct Admin: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Administer a server's data directory (works while the server runs).",
        subcommands: [AddDevice.self, Check.self])

    struct AddDevice: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "add-device",
            abstract: "Create a device (and its account if new); prints its token on one line.",
            discussion: "The token is shown once and stored only as a SHA-256 hash. Keep it in a file readable only by you.")

        @Option(help: "The server's data directory.") var data: String
        @Option(help: "Account name (created if new).") var account: String
        @Option(help: "A name for the device, shown in version lists.") var device: String

        func run() async throws {
            let store: SQLiteStore
            do {
                try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true)
                store = try SQLiteStore(path: data + "/metadata.sqlite")
            } catch {
                throw CLIFailure(.storage, "cannot open the data directory \(data): \(error)")
            }
            let token = TokenHash.newToken()
            do {
                _ = try await store.addDevice(account: account, deviceName: device, tokenHash: TokenHash.of(token))
            } catch let e as APIError {
                throw CLIFailure(.usage, e.message)
            }
            print(token)
        }
    }

    struct Check: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check the store's invariants and that every referenced chunk exists; exit 0 when consistent.")

        @Option(help: "The server's data directory.") var data: String

        func run() async throws {
            let app: NimbusServerApp
            do { app = try NimbusServerApp.embedded(dataDir: data) } catch {
                throw CLIFailure(.storage, "cannot open the data directory \(data): \(error)")
            }
            let problems = try await StoreCheck.problems(store: app.store, chunks: app.chunks)
            if problems.isEmpty {
                print("consistent")
                return
            }
            for p in problems { print(p) }
            throw CLIFailure(.inconsistent, "\(problems.count) problem(s) found")
        }
    }
}
