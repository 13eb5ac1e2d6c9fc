import Foundation
import Testing

@Suite("Mount: basics", .enabled(if: MountEnv.usable, "skipped: \(MountEnv.problem ?? "")"))
struct BasicMountTests {
    @Test func filesFoldersAndStableNodeIDsAcrossRemount() throws {
        try withMount("basic") { m in
            try sh("""
                set -e; cd \(q(m.mp))
                echo hello > a.txt; mkdir -p d/e; echo deep > d/e/f.txt; ln -s a.txt link
                test "$(cat a.txt)" = hello; test "$(cat d/e/f.txt)" = deep; test "$(readlink link)" = a.txt
                test "$(cat link)" = hello
                """)
            let before = try sh("cd \(q(m.mp)) && ls -i a.txt d/e/f.txt link && stat -c '%a %s %Y' a.txt")
            try m.unmount()
            #expect(try sh("ls -A \(q(m.mp))").isEmpty)
            try m.mount()
            let after = try sh("cd \(q(m.mp)) && ls -i a.txt d/e/f.txt link && stat -c '%a %s %Y' a.txt")
            #expect(before == after)
        }
    }

    /// `/proc/self/mountinfo` longer than a page (a machine with many mounts): a reader that
    /// reads it once sees only the first 4 KiB, and `nimbus mount` would wait for a mount listed
    /// past it until it gives up. Forty tmpfs mounts with long paths make the table long enough.
    @Test func aMountIsFoundWhenTheMountTableIsLongerThanAPage() throws {
        let dir = try sh("mktemp -d /tmp/nimbus-mt-table-XXXXXX").trimmingCharacters(in: .whitespacesAndNewlines)
        let long = String(repeating: "a-long-mount-point-name-", count: 4)
        defer {
            _ = shStatus("for d in \(q(dir))/\(long)*; do umount -l \"$d\"; done; rm -rf \(q(dir))")
        }
        try sh("set -e; for i in $(seq 1 40); do mkdir \(q(dir))/\(long)$i; mount -t tmpfs -o size=1m tmpfs \(q(dir))/\(long)$i; done")
        #expect(Int(try sh("wc -c < /proc/self/mountinfo").trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0 > 8192)
        try withMount("table") { m in
            try sh("set -e; cd \(q(m.mp)); echo found > a.txt; test \"$(cat a.txt)\" = found")
            try m.unmount()
            try m.mount()
            #expect(try sh("cat \(q(m.mp))/a.txt") == "found\n")
        }
    }

    @Test func controlFolderIsHiddenAndProtected() throws {
        try withMount("control") { m in
            try sh("""
                set -e; cd \(q(m.mp))
                touch x
                ls -a | grep -qx .nimbus && exit 1
                grep -q '^connection: local-only' .nimbus/status
                grep -q '^files: 1' .nimbus/status
                ! rm -f .nimbus/status 2>/dev/null
                ! rmdir .nimbus 2>/dev/null
                ! touch .nimbus/new 2>/dev/null
                ! mkdir .nimbus 2>/dev/null
                ! mv x .nimbus 2>/dev/null
                ! mv .nimbus y 2>/dev/null
                test -d .nimbus
                """)
        }
    }

    /// FIFOs and device nodes are local-only items, and hard links work (docs/posix.md).
    @Test func specialFilesAndHardLinksWork() throws {
        try withMount("errno") { m in
            let out = try sh("""
                cd \(q(m.mp)); touch f
                python3 - <<'PY'
                import os, errno
                def code(f):
                    try: f(); return "ok"
                    except OSError as e: return errno.errorcode[e.errno]
                print(code(lambda: os.mkfifo("fifo")), code(lambda: os.link("f", "g")),
                      code(lambda: os.mknod("dev", 0o600 | 0o020000, os.makedev(1, 3))),
                      code(lambda: os.mknod("reg", 0o600 | 0o100000)))
                PY
                """)
            #expect(out.trimmingCharacters(in: .whitespacesAndNewlines) == "ok ok ok ok")
            #expect(try sh("cd \(q(m.mp)) && stat -c '%F %t:%T' fifo dev") == "fifo 0:0\ncharacter special file 1:3\n")
        }
    }

    @Test func xattrsRoundTripAndSurviveRemount() throws {
        try withMount("xattr") { m in
            try sh("""
                set -e; cd \(q(m.mp)); echo x > f; mkdir d
                setfattr -n user.color -v blue f
                setfattr -n user.note -v "a b c" d
                test "$(getfattr --only-values -n user.color f)" = blue
                getfattr -d f | grep -q 'user.nimbus.status="current"'
                getfattr -d f | grep -q 'user.nimbus.itemid="'
                ! setfattr -n user.nimbus.status -v x f 2>/dev/null
                setfattr -n user.gone -v 1 f; setfattr -x user.gone f
                ! getfattr -n user.gone f 2>/dev/null
                """)
            try m.unmount()
            try m.mount()
            try sh("""
                set -e; cd \(q(m.mp))
                test "$(getfattr --only-values -n user.color f)" = blue
                test "$(getfattr --only-values -n user.note d)" = "a b c"
                """)
        }
    }

    @Test func unlinkedOpenFileStaysReadable() throws {
        try withMount("orphan") { m in
            let out = try sh("""
                cd \(q(m.mp))
                python3 - <<'PY'
                import os
                with open("f", "w") as w: w.write("still here")
                fd = os.open("f", os.O_RDWR)
                os.unlink("f")
                assert not os.path.exists("f")
                os.lseek(fd, 0, 0)
                print(os.read(fd, 100).decode(), os.fstat(fd).st_nlink)
                os.close(fd)
                PY
                """)
            #expect(out.trimmingCharacters(in: .whitespacesAndNewlines) == "still here 0")
        }
    }

    @Test func renamesMovesAndCaseOnly() throws {
        try withMount("rename") { m in
            try sh("""
                set -e; cd \(q(m.mp))
                mkdir -p a/b c; echo 1 > a/b/f; echo 2 > c/g
                mv a/b c/                 # folder across folders
                test "$(cat c/b/f)" = 1; test ! -e a/b
                mv notes Notes 2>/dev/null || true
                echo n > notes; mv notes Notes; test "$(cat Notes)" = n; ls | grep -qx Notes; ! ls | grep -qx notes
                mv c/g c/b/f              # replace a file
                test "$(cat c/b/f)" = 2
                mkdir -p x/y; ! mv x x/y/z 2>/dev/null   # into itself
                test "$(stat -c %h c)" = 3   # c has b: 2 + 1
                python3 -c "
                import ctypes, os
                libc = ctypes.CDLL(None, use_errno=True)
                open('p','w').write('P'); open('q','w').write('Q')
                assert libc.renameat2(-100, b'p', -100, b'q', 2) == 0   # RENAME_EXCHANGE
                assert open('p').read() == 'Q' and open('q').read() == 'P'
                assert libc.renameat2(-100, b'p', -100, b'q', 1) == -1 and ctypes.get_errno() == 17  # NOREPLACE
                "
                """)
        }
    }
}
