import Foundation
import Testing

/// POSIX behaviour checked with the real tools people use on a synced folder (DESIGN §7).
@Suite("Mount: real tools", .enabled(if: MountEnv.usable, "skipped: \(MountEnv.problem ?? "")"))
struct ToolMountTests {
    /// A small tree with nested folders, modes, symlinks, times and a binary file.
    static func makeTree(_ dir: String) throws {
        try sh("""
            set -e; mkdir -p \(q(dir))/src/sub/deeper \(q(dir))/empty; cd \(q(dir))
            for i in $(seq 1 40); do echo "line $i" > src/file$i.txt; done
            head -c 300000 /dev/urandom > src/sub/blob.bin
            printf '#!/bin/sh\\necho hi\\n' > src/sub/run.sh; chmod 750 src/sub/run.sh
            echo deep > src/sub/deeper/x; chmod 600 src/sub/deeper/x
            ln -s ../file1.txt src/sub/rel-link; ln -s /etc/hostname abs-link
            touch -d '2001-02-03 04:05:06' src/file2.txt
            """)
    }

    @Test func cpTarRsyncPreserveEverything() throws {
        try withMount("tools") { m in
            let src = m.base + "/tree"
            try Self.makeTree(src)
            try sh("""
                set -e; cd \(q(m.mp))
                cp -a \(q(src)) cp-copy
                diff -r --no-dereference \(q(src)) cp-copy
                test "$(stat -c '%a %Y' cp-copy/src/sub/run.sh)" = "$(stat -c '%a %Y' \(q(src))/src/sub/run.sh)"
                test "$(stat -c %Y cp-copy/src/file2.txt)" = "$(stat -c %Y \(q(src))/src/file2.txt)"
                tar -C \(q(src)) -cf \(q(m.base))/t.tar . ; mkdir tar-x; tar -C tar-x -xpf \(q(m.base))/t.tar
                diff -r --no-dereference \(q(src)) tar-x
                tar -C tar-x -cf - . | tar -tvf - > /dev/null
                rsync -a \(q(src))/ rsync-copy/
                diff -r --no-dereference \(q(src)) rsync-copy
                rsync -a --delete -c \(q(src))/ rsync-copy/ --itemize-changes > \(q(m.base))/rs.out
                test ! -s \(q(m.base))/rs.out   # a second run finds nothing to do
                rsync -a rsync-copy/ \(q(m.base))/back/ && diff -r --no-dereference \(q(src)) \(q(m.base))/back
                rm -r cp-copy tar-x rsync-copy; test -z "$(ls -A)"
                """)
        }
    }

    @Test func gitWorksInTheMount() throws {
        try withMount("git") { m in
            try sh("""
                set -e; cd \(q(m.mp)); mkdir repo; cd repo
                git init -q .; git config user.email t@example.com; git config user.name T
                for i in 1 2 3; do echo "v$i" > f$i; done; mkdir d; echo x > d/y
                git add -A; git commit -qm one
                echo changed >> f1; git mv f2 d/f2; git rm -q f3
                git commit -qam two
                test "$(git log --oneline | wc -l)" = 2
                git status --porcelain | (! grep .)
                git fsck --strict 2>&1 | (! grep -i error)
                git gc -q; git checkout -q HEAD~1; test -f f3; git checkout -q -
                """)
        }
    }

    @Test func sqliteDatabaseWithJournalAndWAL() throws {
        try withMount("sqlite") { m in
            try sh("""
                set -e; cd \(q(m.mp))
                sqlite3 db.sqlite 'CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT);'
                seq 1 2000 | awk '{print "INSERT INTO t(b) VALUES(\\"row " $1 "\\");"}' | (echo 'BEGIN;'; cat; echo 'COMMIT;') | sqlite3 db.sqlite
                test "$(sqlite3 db.sqlite 'SELECT count(*) FROM t')" = 2000
                test "$(sqlite3 db.sqlite 'PRAGMA integrity_check')" = ok
                sqlite3 wal.sqlite 'PRAGMA journal_mode=WAL; CREATE TABLE t(x); INSERT INTO t VALUES (1),(2),(3);' > /dev/null
                test "$(sqlite3 wal.sqlite 'SELECT sum(x) FROM t')" = 6
                test "$(sqlite3 wal.sqlite 'PRAGMA integrity_check')" = ok
                """)
        }
    }

    @Test func pythonMmapSharedWrites() throws {
        try withMount("mmap") { m in
            try sh("""
                cd \(q(m.mp)) && python3 - <<'PY'
                import mmap, os
                with open("m.bin", "wb") as f: f.write(b"\\0" * 65536)
                with open("m.bin", "r+b") as f:
                    mm = mmap.mmap(f.fileno(), 0)
                    mm[100:105] = b"hello"; mm[65530:65536] = b"ending"
                    mm.flush(); mm.close()
                data = open("m.bin", "rb").read()
                assert data[100:105] == b"hello" and data[-6:] == b"ending" and len(data) == 65536
                with open("m.bin", "rb") as f:
                    mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                    assert mm[100:105] == b"hello"
                PY
                """)
        }
    }

    @Test func editorSavePatternAndMoves() throws {
        try withMount("editor") { m in
            try sh("""
                set -e; cd \(q(m.mp)); mkdir docs archive
                echo v1 > docs/note.txt; ino1=$(stat -c %i docs/note.txt)
                # vim/gedit style: write a temp file, fsync, rename over the original
                python3 -c "
                import os
                fd = os.open('docs/.note.txt.swp', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                os.write(fd, b'v2\\n'); os.fsync(fd); os.close(fd)
                os.rename('docs/.note.txt.swp', 'docs/note.txt')
                dfd = os.open('docs', os.O_RDONLY); os.fsync(dfd); os.close(dfd)
                "
                test "$(cat docs/note.txt)" = v2; test "$(stat -c %i docs/note.txt)" != "$ino1"
                test "$(ls -A docs)" = note.txt
                # backup-copy style (emacs): rename original to backup, write new
                mv docs/note.txt docs/note.txt~; echo v3 > docs/note.txt
                mv docs/note.txt~ archive/; test "$(cat archive/note.txt~)" = v2
                mv archive docs/; test "$(cat docs/archive/note.txt~)" = v2
                """)
        }
    }
}
