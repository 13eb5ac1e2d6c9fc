import NimbusCore

/// The journal cursor a delete tells the server this device has seen (`seenCursor`).
///
/// The server deletes, with a folder, every item below it whose version is at most that cursor;
/// items changed after it survive, and so does the folder. The cursor a device holds covers
/// states it received but did not show: held for the item's own push, for a writer or a lock,
/// or skipped (a taken name, a missing folder). Claiming those as seen would let the folder
/// delete take another device's write that this device never showed, so the claim stays below
/// every one of them. Pure.
public enum SeenCursor {
    /// `cursor` lowered below each version in `notShown` (never below 0).
    public static func forDelete(cursor: Int64, notShown: some Sequence<Int64>) -> Int64 {
        if Mutation.deleteClaimsHeldStates.isOn { return cursor }
        var seen = cursor
        for v in notShown where v <= seen { seen = v - 1 }
        return max(0, seen)
    }

    /// The lowest version among remote states skipped here (`current`, and the versions of
    /// those just skipped): a folder delete's cursor stays below it.
    public static func lowestSkipped(_ current: Int64?, adding skipped: some Sequence<Int64>) -> Int64? {
        skipped.reduce(current) { low, v in min(low ?? v, v) }
    }
}
