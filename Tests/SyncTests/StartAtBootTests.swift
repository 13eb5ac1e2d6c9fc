import Foundation
import Glibc
import NimbusTesting
import Testing

/// What docs/install.md sets up to start at boot: the systemd units (checked by
/// `systemd-analyze verify`, and the mount unit's command run as systemd would run it), and an
/// fstab-style mount through mount(8) and mount.fuse3.
@Suite(.serialized, .enabled(if: SyncEnv.usable, "needs FUSE"))
struct StartAtBootTests {
    /// The repository's dist/systemd, found from this source file.
    static let unitDir = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("dist/systemd").path

    @Test func theUnitsPassSystemdAnalyzeVerify() throws {
        guard shStatus("command -v systemd-analyze").0 == 0 else {
            print("*** SKIPPING unit verification: systemd-analyze is not installed ***")
            return
        }
        let dir = try sh("mktemp -d /tmp/nimbus-units-XXXXXX").trimmingCharacters(in: .whitespacesAndNewlines)
        defer { _ = shStatus("rm -rf \(q(dir))") }
        // The units name /usr/local/bin/nimbus (docs/install.md); verify needs the binary to exist.
        try sh("""
            cp \(q(Self.unitDir))/*.service \(q(dir))/ && cd \(q(dir)) && sed -i "s|/usr/local/bin/nimbus|\(NimbusBinary.path)|" *.service && \
            cp nimbus-mount@.service nimbus-mount@Nimbus.service && mkdir -m 700 run
            """)
        let serve = shStatus("cd \(q(dir)) && systemd-analyze verify ./nimbus-serve.service 2>&1")
        #expect(serve.0 == 0 && serve.1.isEmpty, "nimbus-serve.service: \(serve.1)")
        let mount = shStatus("cd \(q(dir)) && XDG_RUNTIME_DIR=\(q(dir))/run systemd-analyze --user verify ./nimbus-mount@Nimbus.service 2>&1")
        #expect(mount.0 == 0 && mount.1.isEmpty, "nimbus-mount@.service: \(mount.1)")
        // A broken unit is caught (the check checks something).
        try sh("cd \(q(dir)) && sed 's/^Type=exec/Type=nonsense/' nimbus-serve.service > broken.service")
        #expect(!shStatus("cd \(q(dir)) && systemd-analyze verify ./broken.service 2>&1").1.isEmpty)
    }

    /// nimbus-mount@.service's ExecStart, run as systemd runs it (the instance's env file read,
    /// `$NIMBUS_MOUNT_OPTIONS` split into words), mounts and syncs; SIGTERM — `systemctl stop` —
    /// unmounts within a second and what was written is on the server.
    @Test func theMountUnitsCommandMountsAndStopsOnSIGTERM() async throws {
        try await SyncWorld.run("unit") { w in
            _ = try await w.mount("a")
            let token = try await w.admin("add-device", ["--account", "alice", "--device", "unit"])
            let home = w.base + "/home"
            try sh("mkdir -p \(q(home))/.config/nimbus && printf %s \(q(token)) > \(q(home))/.config/nimbus/token && chmod 600 \(q(home))/.config/nimbus/token")
            try "NIMBUS_MOUNT_OPTIONS=\"--server \(w.server.url) --container docs --token-file \(home)/.config/nimbus/token\"\n"
                .write(toFile: home + "/.config/nimbus/Nimbus.env", atomically: true, encoding: .utf8)
            // The unit's lines with %h, %I, %i, %S and %E filled in as for `nimbus-mount@Nimbus`.
            let unit = try String(contentsOfFile: Self.unitDir + "/nimbus-mount@.service", encoding: .utf8)
            func line(_ key: String) -> String {
                let l = unit.split(separator: "\n").first { $0.hasPrefix(key + "=") }.map { String($0.dropFirst(key.count + 1)) } ?? ""
                return l.replacingOccurrences(of: "%h", with: home).replacingOccurrences(of: "%I", with: "Nimbus")
                    .replacingOccurrences(of: "%i", with: "Nimbus").replacingOccurrences(of: "%S", with: home + "/.local/state")
                    .replacingOccurrences(of: "%E", with: home + "/.config")
                    .replacingOccurrences(of: "/usr/local/bin/nimbus", with: NimbusBinary.path)
            }
            let mp = home + "/Nimbus"
            try sh(line("ExecStartPre"))
            let daemon = try Background("set -a; . \(q(line("EnvironmentFile")))\nexec \(line("ExecStart"))")
            defer { daemon.stop(); _ = shStatus("fusermount3 -uz \(q(mp)) 2>/dev/null") }
            try await eventually("mounted by the unit's command", seconds: 30, "grep -qF \(q(" " + mp + " ")) /proc/self/mountinfo && test -d \(q(mp))/.nimbus")
            try sh("printf 'from the unit' > \(q(mp))/u.txt")
            try await eventually("the unit's file on device a", "test \"$(cat \(q(w.base))/a/u.txt)\" = 'from the unit'")
            let t0 = ContinuousClock.now
            try sh("kill -TERM \(daemon.pid)")
            while daemon.isRunning, ContinuousClock.now - t0 < .seconds(10) { try await Task.sleep(for: .milliseconds(10)) }
            let took = ContinuousClock.now - t0
            #expect(!daemon.isRunning && took < .seconds(3), "the mount daemon took \(took) to stop after SIGTERM")
            #expect(shStatus("grep -qF \(q(" " + mp + " ")) /proc/self/mountinfo").0 != 0, "unmounted")
            #expect(daemon.output.contains("unmounted \(mp)"), "\(daemon.output)")
        }
    }

    /// `mount -t fuse.nimbus`-style mounts and fstab lines go through mount.fuse3, which runs
    /// `nimbus CONTAINER MOUNTPOINT -o OPTIONS`. (mount(8) finds `nimbus` on its own PATH;
    /// here the binary is named in the source, `PATH#CONTAINER`, the other spelling it accepts.)
    @Test func mountThroughMountFuse3WithFstabOptions() async throws {
        try await SyncWorld.run("fstab") { w in
            let a = try await w.mount("a")
            let token = try await w.admin("add-device", ["--account", "alice", "--device", "fstab"])
            try sh("printf %s \(q(token)) > \(q(w.base))/fstab.token && chmod 600 \(q(w.base))/fstab.token")
            let mp = w.base + "/fstab"
            try sh("mkdir -p \(q(mp))")
            defer { _ = shStatus("\(q(NimbusBinary.path)) unmount \(q(mp)) 2>/dev/null || fusermount3 -uz \(q(mp)) 2>/dev/null") }
            let options = "state=\(w.base)/fstab-state,server=\(w.server.url),token-file=\(w.base)/fstab.token,cache-size=1G,_netdev,nofail,x-systemd.automount,noatime"
            try sh("mount -t fuse \(q(NimbusBinary.path + "#docs")) \(q(mp)) -o \(q(options))")
            try sh("printf 'via fstab' > \(q(mp))/f.txt")
            try await eventually("fstab mount's file on a", "test \"$(cat \(q(a))/f.txt)\" = 'via fstab'")
            #expect(try sh("cat \(q(mp))/.nimbus/status").contains("cache-limit: 1073741824"))
            try sh("\(q(NimbusBinary.path)) unmount \(q(mp))")

            // Options it does not know, and ro, are refused by name; no state: refused.
            let bad = shStatus("mount -t fuse \(q(NimbusBinary.path + "#docs")) \(q(mp)) -o \(q("state=\(w.base)/s2,colour=blue")) 2>&1")
            #expect(bad.0 != 0 && bad.1.contains("unknown mount option \"colour=blue\""), "\(bad)")
            let ro = shStatus("mount -t fuse \(q(NimbusBinary.path + "#docs")) \(q(mp)) -o \(q("state=\(w.base)/s2,ro")) 2>&1")
            #expect(ro.0 != 0 && ro.1.contains("read-write"), "\(ro)")
            let nostate = shStatus("mount -t fuse \(q(NimbusBinary.path + "#docs")) \(q(mp)) -o \(q("server=\(w.server.url)")) 2>&1")
            #expect(nostate.0 != 0 && nostate.1.contains("state=DIR"), "\(nostate)")
            #expect(shStatus("grep -qF \(q(" " + mp + " ")) /proc/self/mountinfo").0 != 0, "no mount left by the refusals")
        }
    }
}
