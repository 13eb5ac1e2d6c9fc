import Logging
import NimbusLog

/// swift-log's lines for `nimbus serve`, shaped like the mount's (`LogLine`): a timestamp on a
/// terminal or in a file, a syslog priority and no timestamp in the systemd journal.
struct LineLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(level: Logger.Level, message: Logger.Message, metadata extra: Logger.Metadata?,
             source: String, file: String, function: String, line: UInt) {
        var all = metadata
        if let extra { all.merge(extra) { $1 } }
        let meta = all.isEmpty ? "" : " " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        LogLine.write(label, "\(level) [\(source)] \(message)\(meta)", level: Self.priority(level))
    }

    static func priority(_ l: Logger.Level) -> LogLine.Level {
        switch l {
        case .trace, .debug: .debug
        case .info: .info
        case .notice: .notice
        case .warning: .warning
        case .error, .critical: .error
        }
    }
}
