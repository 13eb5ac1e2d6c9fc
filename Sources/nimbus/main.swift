import Logging

// Entry point: log lines shaped for a terminal, a file or the systemd journal (LineLogHandler);
// parse, run, map failures to documented exit codes (docs/errors.md).
LoggingSystem.bootstrap { LineLogHandler(label: $0) }
await Nimbus.mainWithExitCodes()
