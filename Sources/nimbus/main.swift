// Entry point: parse, run, map failures to documented exit codes (docs/errors.md).
await Nimbus.mainWithExitCodes()
