import Foundation
import Testing

/// Hard links on a real mount (docs/posix.md "Hard links"): one inode, its link count, one
/// content through every name, names that come and go on their own, and a remount that keeps it.
@Suite("Mount: hard links", .enabled(if: MountEnv.usable, "skipped: \(MountEnv.problem ?? "")"))
struct HardLinkMountTests {
    @Test func namesShareOneInodeTheirContentAndAttributesAndSurviveRemount() throws {
        try withMount("links") { m in
            try sh("""
                set -e; cd \(q(m.mp))
                echo one > a; mkdir d; ln a b; ln b d/c
                test "$(stat -c '%i %h' a)" = "$(stat -c '%i %h' b)"
                test "$(stat -c '%i %h' a)" = "$(stat -c '%i %h' d/c)"
                test "$(stat -c %h a)" = 3
                echo two >> b
                test "$(cat a)" = "$(printf 'one\\ntwo')"; test "$(cat d/c)" = "$(printf 'one\\ntwo')"
                chmod 640 d/c; test "$(stat -c %a a)" = 640
                setfattr -n user.tag -v x b; test "$(getfattr --only-values -n user.tag a)" = x
                rm a
                test ! -e a; test "$(stat -c %h b)" = 2; test "$(cat b)" = "$(printf 'one\\ntwo')"
                mv b e; test "$(stat -c %h e)" = 2
                # A rename onto another name of the same file does nothing (POSIX).
                mv -T d/c e 2>/dev/null || python3 -c 'import os; os.rename("d/c", "e")'
                test -e d/c; test -e e
                # Directories cannot be linked.
                ! ln -d d dd 2>/dev/null
                """)
            let before = try sh("cd \(q(m.mp)) && stat -c '%n %i %h %s %a' e d/c && cat e && getfattr --only-values -n user.tag d/c")
            try m.unmount()
            try m.mount()
            let after = try sh("cd \(q(m.mp)) && stat -c '%n %i %h %s %a' e d/c && cat e && getfattr --only-values -n user.tag d/c")
            #expect(before == after)
            // After the remount the names still share their content and go one by one.
            try sh("""
                set -e; cd \(q(m.mp))
                printf three > e; test "$(cat d/c)" = three
                rm e; test "$(stat -c %h d/c)" = 1; test "$(cat d/c)" = three
                """)
        }
    }

    /// An open file keeps its bytes after every name goes, and a name made while it is open
    /// reads what the handle writes.
    @Test func openHandlesFollowTheInodeAcrossLinkAndUnlink() throws {
        try withMount("links-open") { m in
            let out = try sh("""
                cd \(q(m.mp))
                python3 - <<'PY'
                import os
                fd = os.open("f", os.O_CREAT | os.O_RDWR, 0o644)
                os.write(fd, b"hello")
                os.link("f", "g")
                os.write(fd, b" world")
                print(open("g").read(), os.fstat(fd).st_nlink)
                os.unlink("f"); os.unlink("g")
                os.lseek(fd, 0, 0)
                print(os.read(fd, 100).decode(), os.fstat(fd).st_nlink, os.listdir("."))
                os.close(fd)
                PY
                """)
            #expect(out == "hello world 2\nhello world 0 []\n")
        }
    }
}
