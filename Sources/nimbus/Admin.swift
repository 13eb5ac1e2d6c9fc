import ArgumentParser
import Foundation
import Logging
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

        @Option(help: "The server's data directory.") var data: String?
        @Option(help: "The server's PostgreSQL database (postgres://…), when it uses one.") var database: String?
        @Option(help: "Account name (created if new).") var account: String
        @Option(help: "A name for the device, shown in version lists.") var device: String

        func run() async throws {
            // The chunks are not needed to add a device; "-" only completes the options.
            let storage = StorageOptions(dataDir: data, database: database, chunks: database == nil ? nil : "-")
            if let problem = storage.problem { throw ValidationError(problem) }
            let store: any ServerStore
            do {
                store = try await storage.openStore(logger: Logger(label: "nimbus.admin"))
            } catch {
                throw CLIFailure(.storage, "cannot open the metadata store (\(storage.summary)): \(error)")
            }
            let token = TokenHash.newToken()
            do {
                _ = try await store.addDevice(account: account, deviceName: device, tokenHash: TokenHash.of(token))
                await (store as? PostgresStore)?.shutdown()
            } catch let e as APIError {
                await (store as? PostgresStore)?.shutdown()
                throw CLIFailure(.usage, e.message)
            }
            print(token)
        }
    }

    struct Check: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check the store's invariants and that every referenced chunk exists; exit 0 when consistent.")

        @Option(help: "The server's data directory.") var data: String?
        @Option(help: "The server's PostgreSQL database (postgres://…), when it uses one.") var database: String?
        @Option(help: "The server's chunk directory or s3://BUCKET/PREFIX, when not DATA/chunks.") var chunks: String?

        func run() async throws {
            let storage = StorageOptions(dataDir: data, database: database, chunks: chunks)
            if let problem = storage.problem { throw ValidationError(problem) }
            let app: NimbusServerApp
            do { app = try await storage.openApp(logger: Logger(label: "nimbus.admin")) } catch {
                throw CLIFailure(.storage, "cannot open the storage (\(storage.summary)): \(error)")
            }
            let found: Result<[String], any Error>
            do { found = .success(try await StoreCheck.problems(store: app.store, chunks: app.chunks)) } catch { found = .failure(error) }
            await (app.store as? PostgresStore)?.shutdown()
            let problems = try found.get()
            if problems.isEmpty {
                print("consistent")
                return
            }
            for p in problems { print(p) }
            throw CLIFailure(.inconsistent, "\(problems.count) problem(s) found")
        }
    }
}
