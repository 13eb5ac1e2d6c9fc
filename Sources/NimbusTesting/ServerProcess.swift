import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The built `nimbus` executable: `$NIMBUS_BIN`, or the one beside the running test bundle.
public enum NimbusBinary {
    public static var path: String {
        if let p = ProcessInfo.processInfo.environment["NIMBUS_BIN"] { return p }
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
        // Inside an .xctest bundle on some layouts: walk up to the build folder.
        for _ in 0..<4 {
            let candidate = dir.appendingPathComponent("nimbus").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            dir = dir.deletingLastPathComponent()
        }
        return "nimbus"
    }

    /// Runs the binary to completion (bounded by `timeout`) and returns its exit status and output.
    public static func run(_ args: [String], timeout: Duration = .seconds(60)) async throws -> (status: Int32, stdout: String, stderr: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: path)
        p.arguments = args
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let deadline = ContinuousClock.now + timeout
        while p.isRunning {
            if ContinuousClock.now > deadline {
                p.terminate()
                throw FixtureError("nimbus \(args.joined(separator: " ")) did not finish within \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        let o = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let e = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        return (p.terminationStatus, o, e)
    }
}

/// `nimbus serve` as a child process on 127.0.0.1 with a kernel-chosen port.
/// `stop()` (or deinit) always ends it, so a failing test leaves no server behind.
public final class ServerProcess: @unchecked Sendable {
    // @unchecked: the Process is only touched by the owning test task; the output buffer has its own lock.
    let process = Process()
    public private(set) var url = ""
    private var output: OutputReader?

    public init(dataDir: String, extraArgs: [String] = []) {
        process.executableURL = URL(fileURLWithPath: NimbusBinary.path)
        process.arguments = ["serve", "--data", dataDir, "--listen", "127.0.0.1:0", "--log-level", "warning"] + extraArgs
    }

    /// Starts the server and waits (at most `timeout`) until it accepts connections.
    public func start(timeout: Duration = .seconds(30)) async throws {
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.standardError
        try process.run()
        let buffer = OutputReader(pipe.fileHandleForReading)
        output = buffer
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if let line = buffer.text.split(separator: "\n").first(where: { $0.contains("listening on http") }),
               let range = line.range(of: "https://") ?? line.range(of: "http://") {
                url = String(line[range.lowerBound...].split(separator: " ")[0])
                return
            }
            if !process.isRunning { throw FixtureError("nimbus serve exited with \(process.terminationStatus): \(buffer.text)") }
            try await Task.sleep(for: .milliseconds(20))
        }
        stop()
        throw FixtureError("nimbus serve did not report its address within \(timeout)")
    }

    public var pid: Int32 { process.processIdentifier }

    /// Sends `signal` and waits for the process to end (SIGKILL after 10 s if it does not).
    public func kill(_ signal: Int32 = SIGKILL) async {
        guard process.isRunning else { return }
        Glibc.kill(process.processIdentifier, signal)
        let deadline = ContinuousClock.now + .seconds(10)
        while process.isRunning {
            if ContinuousClock.now > deadline { Glibc.kill(process.processIdentifier, SIGKILL) }
            try? await Task.sleep(for: .milliseconds(10))
        }
    }

    public var exitStatus: Int32? { process.isRunning ? nil : process.terminationStatus }

    public func stop() {
        if process.isRunning {
            Glibc.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    deinit { stop() }
}
