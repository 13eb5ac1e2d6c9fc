import ArgumentParser
import Foundation
import Logging
import NimbusServer

struct Admin: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Administer a server's data directory (works while the server runs).",
        subcommands: [AddDevice.self, ListDevices.self, RevokeDevice.self, SetQuota.self, Quota.self, Check.self, GC.self])

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
            let token = TokenHash.newToken()
            _ = try await Admin.withStore(data: data, database: database) {
                try await $0.addDevice(account: account, deviceName: device, tokenHash: TokenHash.of(token))
            }
            print(token)
        }
    }

    /// Opens the metadata store of `--data` or `--database` for a device command.
    static func openStore(data: String?, database: String?) async throws -> any ServerStore {
        // The chunks are not needed for devices; "-" only completes the options.
        let storage = StorageOptions(dataDir: data, database: database, chunks: database == nil ? nil : "-")
        if let problem = storage.problem { throw ValidationError(problem) }
        do {
            return try await storage.openStore(logger: Logger(label: "nimbus.admin"))
        } catch {
            throw CLIFailure(.storage, "cannot open the metadata store (\(storage.summary)): \(error)")
        }
    }

    /// Runs `body` on the store and closes it, whatever happens; an `APIError` becomes a usage failure.
    static func withStore<T>(data: String?, database: String?, _ body: (any ServerStore) async throws -> T) async throws -> T {
        let store = try await openStore(data: data, database: database)
        do {
            let r = try await body(store)
            await (store as? PostgresStore)?.shutdown()
            return r
        } catch let e as APIError {
            await (store as? PostgresStore)?.shutdown()
            throw CLIFailure(.usage, e.message)
        } catch {
            await (store as? PostgresStore)?.shutdown()
            throw CLIFailure(.storage, "the metadata store failed: \(error)")
        }
    }

    static func seconds(_ t: Int64) -> String {
        let f = ISO8601DateFormatter()
        return f.string(from: Date(timeIntervalSince1970: TimeInterval(t)))
    }

    struct ListDevices: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "list-devices",
            abstract: "List devices: account, name, id, when added, and when revoked (tokens are never shown).")

        @Option(help: "The server's data directory.") var data: String?
        @Option(help: "The server's PostgreSQL database (postgres://…), when it uses one.") var database: String?
        @Option(help: "Only this account's devices.") var account: String?

        func run() async throws {
            let devices = try await Admin.withStore(data: data, database: database) { try await $0.devices(account: account) }
            for d in devices {
                let revoked = d.revoked.map { "revoked \(Admin.seconds($0))" } ?? "active"
                print("\(d.account)\t\(d.name)\t\(d.id)\tadded \(Admin.seconds(d.created))\t\(revoked)")
            }
        }
    }

    struct RevokeDevice: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "revoke-device",
            abstract: "Revoke a device's token: within a second every server instance refuses it.",
            discussion: "The device's versions and history stay. The device keeps its local changes and shows that it is unauthorized; enroll it again with `nimbus admin add-device` and mount with the new token.")

        @Option(help: "The server's data directory.") var data: String?
        @Option(help: "The server's PostgreSQL database (postgres://…), when it uses one.") var database: String?
        @Option(help: "The device's account.") var account: String
        @Option(help: "The device's name, or its id when several share the name.") var device: String

        func run() async throws {
            let now = Int64(Date().timeIntervalSince1970)
            let d = try await Admin.withStore(data: data, database: database) {
                try await $0.revokeDevice(account: account, device: device, now: now)
            }
            print("revoked \(d.account)/\(d.name) (\(d.id))")
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

    struct GC: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "gc",
            abstract: "Free the chunks no version refers to and nobody touched for --grace seconds; prints what was freed.",
            discussion: """
                Safe while servers run: uploads and commits in flight keep their chunks (docs/deploy.md, "Chunk garbage collection"). \
                One collection runs at a time over a store; if another is running (a server's periodic one), this one does nothing and says so.
                """)

        @Option(help: "The server's data directory.") var data: String?
        @Option(help: "The server's PostgreSQL database (postgres://…), when it uses one.") var database: String?
        @Option(help: "The server's chunk directory or s3://BUCKET/PREFIX, when not DATA/chunks.") var chunks: String?
        @Flag(name: .customLong("dry-run"), help: "Only report what would be freed.") var dryRun = false
        @Option(help: ArgumentHelp("Keep chunks uploaded, or reported present to a device, less than this long ago.", valueName: "SECONDS"))
        var grace: Int64 = 3_600

        func validate() throws {
            guard (0...ChunkCollector.maxGraceSeconds).contains(grace) else {
                throw ValidationError("--grace takes 0…\(ChunkCollector.maxGraceSeconds) seconds (got \(grace))")
            }
        }

        func run() async throws {
            let storage = StorageOptions(dataDir: data, database: database, chunks: chunks)
            if let problem = storage.problem { throw ValidationError(problem) }
            var app: NimbusServerApp
            do { app = try await storage.openApp(logger: Logger(label: "nimbus.admin")) } catch {
                throw CLIFailure(.storage, "cannot open the storage (\(storage.summary)): \(error)")
            }
            app.gcGraceSeconds = grace
            let outcome: Result<CollectionReport, any Error>
            do { outcome = .success(try await app.collectGarbage(dryRun: dryRun)) } catch { outcome = .failure(error) }
            await (app.store as? PostgresStore)?.shutdown()
            switch outcome {
            case .success(let report): print(report)
            case .failure(let e as APIError): throw CLIFailure(.storage, "garbage collection failed: \(e.message)")
            case .failure(let e): throw CLIFailure(.storage, "garbage collection failed: \(e)")
            }
        }
    }
}
