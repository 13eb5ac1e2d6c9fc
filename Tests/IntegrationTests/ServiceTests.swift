import Foundation
import NimbusCore
import NimbusProtocol
import NimbusRemote
import NimbusTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `nimbus serve` under a service manager: it ends promptly on SIGTERM and SIGINT, also while
/// devices hold long-polls open, and every poll gets an answer (not a dropped connection); its
/// log lines fit the systemd journal.
@Suite struct ServiceTests {
    @Test(arguments: [SIGTERM, SIGINT])
    func serveStopsAtOnceWithLongPollsOpen(signal: Int32) async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-stop-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let add = try await NimbusBinary.run(["admin", "add-device", "--data", dir, "--account", "alice", "--device", "laptop"])
        #expect(add.status == 0, "add-device: \(add.stderr)")
        let token = add.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let server = ServerProcess(dataDir: dir)
        defer { server.stop() }
        try await server.start()
        let client = NimbusClient(baseURL: server.url, token: token)
        let start = try await client.createContainer("docs")
        // Five devices wait for changes; none will come.
        let polls = (0..<5).map { _ in
            Task { try await client.changes("docs", since: start.cursor, wait: ProtocolLimits.maxWaitSeconds) }
        }
        // Wait until the server holds all five (its metrics count the open polls).
        let deadline = ContinuousClock.now + .seconds(10)
        while try await openPolls(client) < 5, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(try await openPolls(client) == 5)

        let t0 = ContinuousClock.now
        await server.kill(signal)
        let took = ContinuousClock.now - t0
        // Bounded well below a poll's wait (25 s): the polls did not hold the stop.
        #expect(took < .seconds(5), "nimbus serve took \(took) to stop after signal \(signal)")
        #expect(server.exitStatus == 0, "a graceful stop exits 0 (got \(server.exitStatus.map(String.init) ?? "running"))")
        for p in polls {
            let page = try await p.value
            #expect(page.changes.isEmpty && page.cursor == start.cursor, "each poll is answered with what the server has")
        }
    }

    /// With stderr being the journal (`JOURNAL_STREAM` names it, as systemd sets it) lines carry
    /// a syslog priority and no timestamp of their own; on a plain pipe they start with the time.
    @Test(arguments: [true, false])
    func logLinesFitTheJournal(journal: Bool) async throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("nimbus-journal-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: NimbusBinary.path)
        p.arguments = ["serve", "--data", dir, "--listen", "127.0.0.1:0"]
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        var env = ProcessInfo.processInfo.environment
        env["JOURNAL_STREAM"] = nil
        if journal {
            var st = stat()
            #expect(fstat(err.fileHandleForWriting.fileDescriptor, &st) == 0)
            env["JOURNAL_STREAM"] = "\(st.st_dev):\(st.st_ino)"
        }
        p.environment = env
        try p.run()
        defer { if p.isRunning { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() } }
        // Started: the stdout line says so. Then a graceful stop, and all of stderr is read.
        let first = out.fileHandleForReading.availableData
        #expect(String(decoding: first, as: UTF8.self).contains("listening on http://"))
        kill(p.processIdentifier, SIGTERM)
        try? err.fileHandleForWriting.close()
        p.waitUntilExit()
        let lines = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self).split(separator: "\n")
        #expect(lines.contains { $0.contains("Server started and listening") }, "\(lines)")
        for line in lines {
            if journal {
                #expect(line.hasPrefix("<6>nimbus.serve: info [") || line.hasPrefix("<5>") || line.hasPrefix("<4>"), "\(line)")
                #expect(!line.contains(/\d{4}-\d\d-\d\dT\d\d:\d\d/), "no timestamp of its own: \(line)")
            } else {
                #expect(line.wholeMatch(of: /\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z nimbus\.serve: \w+ \[.*/) != nil, "\(line)")
            }
        }
    }

    private func openPolls(_ client: NimbusClient) async throws -> Int {
        let text = try await client.send(.GET, "/metrics", authorized: false).text
        let line = text.split(separator: "\n").first { $0.hasPrefix("nimbus_longpolls_waiting ") }
        return line.flatMap { Double($0.split(separator: " ")[1]) }.map { Int($0) } ?? -1
    }
}
