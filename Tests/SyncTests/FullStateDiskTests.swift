import Foundation
import Glibc
import NimbusTesting
import Testing

/// Device A's state directory on a small tmpfs that the test fills: nothing a program did is
/// dropped, programs are told ENOSPC, recovery needs no restart, `rm` frees space, an unmount
/// that cannot save says so, and both devices converge (docs/errors.md "Full disk").
@Suite(.serialized, .enabled(if: SyncEnv.usable && getuid() == 0, "needs FUSE and root (tmpfs)"))
struct FullStateDiskTests {
    /// A tmpfs of `megabytes` for A's state (`DISK/state`, linked as the world's `a-state`).
    final class StateDisk: @unchecked Sendable {
        // @unchecked: used by one test at a time.
        let path: String
        init(megabytes: Int) throws {
            path = try sh("mktemp -d /tmp/nimbus-statedisk-XXXXXX").trimmingCharacters(in: .whitespacesAndNewlines)
            try sh("mount -t tmpfs -o size=\(megabytes)m,mode=0700 tmpfs \(q(path)) && mkdir \(q(path))/state")
        }

        func remove() {
            _ = shStatus("umount \(q(path)) 2>/dev/null || umount -l \(q(path)); rmdir \(q(path))")
        }

        /// Writes `fill-N` files until the disk refuses another byte (1 MiB writes, then 4 KiB, 512 B).
        func fill() {
            var n = 0
            while FileManager.default.fileExists(atPath: path + "/fill-\(n)") { n += 1 }
            let fd = open(path + "/fill-\(n)", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
            guard fd >= 0 else { return }
            defer { close(fd) }
            for size in [1 << 20, 4096, 512] {
                let block = [UInt8](repeating: 0x5a, count: size)
                while block.withUnsafeBytes({ write(fd, $0.baseAddress, size) }) > 0 {}
            }
        }

        /// Deletes the fill files: space is back.
        func free() { _ = shStatus("rm -f \(q(path))/fill-*") }

        var available: Int64 {
            var sv = statvfs()
            return statvfs(path, &sv) == 0 ? Int64(sv.f_bavail) * Int64(sv.f_frsize) : -1
        }
    }

    /// A world whose device `a` keeps its state on a fresh tmpfs; everything is unmounted after.
    func run(_ label: String, megabytes: Int = 64, _ body: (SyncWorld, StateDisk, String, String) async throws -> Void) async throws {
        let disk = try StateDisk(megabytes: megabytes)
        do {
            try await SyncWorld.run(label) { w in
                try sh("ln -s \(q(disk.path))/state \(q(w.base))/a-state")
                let a = try await w.mount("a"), b = try await w.mount("b")
                try await body(w, disk, a, b)
            }
        } catch {
            disk.remove()
            throw error
        }
        disk.remove()
    }

    /// fsync of a folder on the mount: 0 or the errno.
    func fsyncDir(_ path: String) -> Int32 {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return errno }
        defer { close(fd) }
        return fsync(fd) == 0 ? 0 : errno
    }

    /// Fills the disk until a metadata commit of A fails (the space reserve lets the first ones
    /// through): returns the errno fsync answered then (0: it never failed).
    func makeStateFail(_ disk: StateDisk, _ a: String) -> Int32 {
        for i in 0..<60 {
            disk.fill()
            for j in 0..<10 { mkdir(a + "/probe-\(i)-\(j)", 0o755) }
            let r = fsyncDir(a)
            if r != 0 { print("FullStateDiskTests: state failed after \(i + 1) fills"); return r }
        }
        return 0
    }

    func statusLine(_ mp: String, _ key: String) -> String {
        ((try? sh("sed -n 's/^\(key): //p' \(q(mp))/.nimbus/status")) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Polls fsync of `path` until it answers 0 (bounded); returns the last answer.
    func fsyncRecovers(_ path: String) async throws -> Int32 {
        var r = fsyncDir(path)
        for _ in 0..<50 where r != 0 {
            try await Task.sleep(for: .milliseconds(100))
            r = fsyncDir(path)
        }
        return r
    }

    @Test func aWriteGetsENOSPCAndFsyncSaysSoUntilSpaceIsFreedThenSucceedsWithoutRestart() async throws {
        try await run("enospc") { w, disk, a, b in
            try sh("printf before > \(q(a))/before.txt")
            #expect(makeStateFail(disk, a) == ENOSPC, "fsync on a full state disk answers ENOSPC")
            // A program writing is told, not silently dropped.
            let fd = open(a + "/big.bin", O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
            try #require(fd >= 0)
            let block = [UInt8](repeating: 1, count: 64 << 10)
            var writeErrno: Int32 = 0
            for _ in 0..<256 where writeErrno == 0 {
                if block.withUnsafeBytes({ write(fd, $0.baseAddress, block.count) }) < 0 { writeErrno = errno }
            }
            #expect(writeErrno == ENOSPC)
            #expect(fsync(fd) != 0)
            close(fd)
            try sh("mkdir \(q(a))/made-while-full")
            #expect(fsyncDir(a) == ENOSPC, "still failing: asked again, answered again")
            #expect(statusLine(a, "store-error") != "none")
            // Space comes back: the next fsync succeeds, without a restart.
            disk.free()
            #expect(try await fsyncRecovers(a) == 0)
            #expect(statusLine(a, "store-error") == "none")
            try await eventually("the folder made while full on B", seconds: 30, "test -d \(q(b))/made-while-full")
            try sh("\(q(NimbusBinary.path)) unmount \(q(a))")
            try w.remount("a")
            #expect(FileManager.default.fileExists(atPath: a + "/made-while-full"))
            #expect(try sh("cat \(q(a))/before.txt") == "before")
        }
    }

    @Test func mkdirRenameAndRmWhileFullAreKeptAndBothDevicesConverge() async throws {
        try await run("converge") { w, disk, a, b in
            try sh("mkdir \(q(a))/old-name && printf keep > \(q(a))/old-name/inside.txt && printf bye > \(q(a))/gone.txt")
            try await eventually("A's files on B", seconds: 30, "test -f \(q(b))/old-name/inside.txt && test -f \(q(b))/gone.txt")
            try await eventually("A's uploads done", seconds: 30, "grep -q '^upload-queue: 0' \(q(a))/.nimbus/status")
            #expect(makeStateFail(disk, a) == ENOSPC)
            try sh("mkdir \(q(a))/new-folder && mv \(q(a))/old-name \(q(a))/new-name && rm \(q(a))/gone.txt")
            try sh("printf from-b > \(q(b))/from-b.txt && mkdir \(q(b))/b-folder")
            #expect(fsyncDir(a) == ENOSPC)
            // A keeps syncing from memory meanwhile.
            try await eventually("A's changes on B", seconds: 30,
                                 "test -d \(q(b))/new-folder && test -f \(q(b))/new-name/inside.txt && ! test -e \(q(b))/old-name && ! test -e \(q(b))/gone.txt")
            try await eventually("B's changes on A", seconds: 30, "test -f \(q(a))/from-b.txt && test -d \(q(a))/b-folder")
            disk.free()
            #expect(try await fsyncRecovers(a) == 0)
            try await eventually("A settled", seconds: 30, "grep -q '^upload-queue: 0' \(q(a))/.nimbus/status")
            try sh("\(q(NimbusBinary.path)) unmount \(q(a))")
            try w.remount("a")
            let expected = "b-folder\nfrom-b.txt\nnew-folder\nnew-name\n"
            let list = "ls \(q(a)) | grep -v '^probe-'"
            #expect(try sh(list) == expected, "after the remount A still has what it did and saw while full")
            #expect(try sh("cat \(q(a))/new-name/inside.txt") == "keep")
            try await eventually("A settled after the remount", seconds: 30, "grep -q '^upload-queue: 0' \(q(a))/.nimbus/status")
            try await eventually("both devices list the same", seconds: 30, "test \"$(ls \(q(a)))\" = \"$(ls \(q(b)))\"")
            #expect(try sh("ls \(q(b)) | grep -v '^probe-'") == expected, "nothing came back on B")
            #expect(try sh(list) == expected, "nothing came back on A")
        }
    }

    @Test func rmOfABigFileFreesSpaceOnAFullStateDisk() async throws {
        try await run("rm") { _, disk, a, _ in
            try sh("dd if=/dev/urandom of=\(q(a))/big.bin bs=1M count=24 conv=fsync 2>&1")
            try await eventually("the upload done", seconds: 60, "grep -q '^upload-queue: 0' \(q(a))/.nimbus/status")
            disk.fill()
            let before = disk.available
            try sh("rm \(q(a))/big.bin")
            try await eventually("the file's space back", seconds: 20, "test $(df -B1 --output=avail \(q(disk.path)) | tail -1) -ge \(before + 20 << 20)")
            disk.free()
            #expect(try await fsyncRecovers(a) == 0)
            #expect(statusLine(a, "store-error") == "none")
        }
    }

    @Test func unmountSaysSoWhenTheLastSaveFailsAndTheNextMountConverges() async throws {
        try await run("unmount") { w, disk, a, b in
            try sh("printf one > \(q(a))/one.txt")
            #expect(makeStateFail(disk, a) == ENOSPC)
            try sh("mkdir \(q(a))/at-the-end")
            let (status, out) = shStatus("\(q(NimbusBinary.path)) unmount \(q(a))")
            #expect(status == 4, "unmount must fail when the state could not be saved: \(out)")
            #expect(out.contains("could not be saved"), "\(out)")
            #expect(shStatus("grep -qF \(q(" " + a + " ")) /proc/self/mountinfo").0 != 0, "unmounted all the same")
            disk.free()
            try w.remount("a")
            try await eventually("A settled", seconds: 30,
                                 "grep -q '^upload-queue: 0' \(q(a))/.nimbus/status && grep -q '^store-error: none' \(q(a))/.nimbus/status")
            try await eventually("both devices list the same", seconds: 30, "test \"$(ls \(q(a)))\" = \"$(ls \(q(b)))\"")
            #expect(try sh("cat \(q(a))/one.txt") == "one")
            #expect(try sh("cat \(q(b))/one.txt") == "one")
        }
    }

    /// A placeholder bigger than the state disk: the read fails with ENOSPC (not EIO), the disk
    /// keeps room for the local state (its space reserve is there and a write still saves),
    /// `store-error` and the file's `user.nimbus.error` say what happened and what to do, and
    /// the message goes once a download fits again.
    @Test func aDownloadThatDoesNotFitFailsWithENOSPCAndLeavesTheStateRoom() async throws {
        try await run("download-room", megabytes: 40) { _, disk, a, b in
            try sh("dd if=/dev/urandom of=\(q(b))/big.bin bs=1M count=100 conv=fsync 2>&1")
            try sh("printf small > \(q(b))/small.txt")
            try await eventually("the files listed on A", seconds: 60, "test -f \(q(a))/big.bin && test -f \(q(a))/small.txt")
            let (status, out) = shStatus("cat \(q(a))/big.bin > /dev/null")
            #expect(status != 0 && out.contains("No space left on device"), "the reader is told ENOSPC: \(out)")
            // Downloads stop 8 MiB short of full (twice the space reserve, `keptForState`); the
            // state's own writes since the refusal (its log line, the database) may use a little
            // of that room, which is what it is kept for.
            #expect(disk.available >= (8 << 20) - (512 << 10), "downloads leave the local state its room: \(disk.available) bytes free")
            #expect(shStatus("test -f \(q(disk.path))/state/space-reserve").0 == 0, "the space reserve is there")
            let storeError = statusLine(a, "store-error")
            #expect(storeError.contains("no room") && storeError.contains("nimbus evict"), "store-error says so: \(storeError)")
            let itemError = (try? sh("getfattr --only-values -n user.nimbus.error \(q(a))/big.bin 2>/dev/null")) ?? ""
            #expect(itemError.contains("no room"), "user.nimbus.error says so: \(itemError)")
            // The local state still saves.
            try sh("printf after > \(q(a))/after.txt")
            #expect(fsyncDir(a) == 0)
            try await eventually("after.txt on B", seconds: 30, "test \"$(cat \(q(b))/after.txt)\" = after")
            // What came of big.bin is dropped once it is closed, and a read that fits ends the
            // message.
            try await eventually("big.bin's partial content dropped", seconds: 20, "test $(df -B1 --output=avail \(q(disk.path)) | tail -1) -ge \(20 << 20)")
            // small.txt may have come with its bytes inside the journal page (nothing to
            // download): evicted first, its read is a download, and one that fits.
            try sh("\(q(NimbusBinary.path)) evict \(q(a))/small.txt")
            #expect(try sh("cat \(q(a))/small.txt") == "small")
            try await eventually("store-error cleared", seconds: 10, "grep -qx 'store-error: none' \(q(a))/.nimbus/status")
        }
    }

    /// Downloaded files are a cache: a read that does not fit beside them has the least recently
    /// read ones evicted (they stay placeholders, readable again).
    @Test func aReadThatNeedsRoomEvictsOtherDownloadedFiles() async throws {
        try await run("download-evicts", megabytes: 40) { _, _, a, b in
            for name in ["x", "y"] { try sh("dd if=/dev/urandom of=\(q(b))/\(name).bin bs=1M count=16 conv=fsync 2>&1") }
            try await eventually("the files listed on A", seconds: 60, "test -f \(q(a))/x.bin && test -f \(q(a))/y.bin")
            #expect(try sh("cmp \(q(a))/x.bin \(q(b))/x.bin && echo same") == "same\n")
            #expect(try sh("cmp \(q(a))/y.bin \(q(b))/y.bin && echo same") == "same\n", "y.bin fits once x.bin is evicted")
            #expect(try sh("getfattr --only-values -n user.nimbus.status \(q(a))/x.bin 2>/dev/null") == "cloud")
            #expect(try sh("cmp \(q(a))/x.bin \(q(b))/x.bin && echo same") == "same\n", "and x.bin is read again")
        }
    }
}
