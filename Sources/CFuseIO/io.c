// The channel between libfuse and /dev/fuse (see include/cfuse_io.h). A C target of its own:
// it keeps per-descriptor state, which a header imported into Swift cannot define.
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include "cfuse_io.h"

/// Per /dev/fuse descriptor: the INIT request's unique (0: none pending), whether the kernel
/// offered FUSE_HANDLE_KILLPRIV_V2, and whether the filesystem wants it.
#define CFUSE_KILLPRIV_V2 (1u << 28)
#define CFUSE_MAX_FD 4096
static uint64_t cfuse_init_unique[CFUSE_MAX_FD];
static unsigned char cfuse_killpriv_offered[CFUSE_MAX_FD];
static unsigned char cfuse_killpriv_wanted[CFUSE_MAX_FD];

static ssize_t cfuse_io_read(int fd, void *buf, size_t len, void *userdata) {
    (void)userdata;
    ssize_t n = read(fd, buf, len);
    // fuse_in_header: len u32, opcode u32, unique u64, …(40 bytes); fuse_init_in: major, minor,
    // max_readahead, flags (u32 each).
    if (n >= 56 && fd >= 0 && fd < CFUSE_MAX_FD) {
        const unsigned char *b = (const unsigned char *)buf;
        uint32_t opcode; uint64_t unique; uint32_t flags;
        memcpy(&opcode, b + 4, 4);
        if (opcode == 26 /* FUSE_INIT */) {
            memcpy(&unique, b + 8, 8);
            memcpy(&flags, b + 40 + 12, 4);
            __atomic_store_n(&cfuse_killpriv_offered[fd], (flags & CFUSE_KILLPRIV_V2) ? 1 : 0, __ATOMIC_RELAXED);
            __atomic_store_n(&cfuse_init_unique[fd], unique, __ATOMIC_RELEASE);
        }
    }
    return n;
}

static ssize_t cfuse_io_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    if (fd >= 0 && fd < CFUSE_MAX_FD && count >= 2 && iov[0].iov_len >= 16 && iov[1].iov_len >= 16) {
        uint64_t want = __atomic_load_n(&cfuse_init_unique[fd], __ATOMIC_ACQUIRE);
        uint64_t unique; int32_t error;
        memcpy(&error, (const unsigned char *)iov[0].iov_base + 4, 4);
        memcpy(&unique, (const unsigned char *)iov[0].iov_base + 8, 8);
        if (want != 0 && unique == want && error == 0) {
            __atomic_store_n(&cfuse_init_unique[fd], 0, __ATOMIC_RELAXED);
            if (cfuse_killpriv_wanted[fd] && cfuse_killpriv_offered[fd]) {
                uint32_t flags;
                unsigned char *o = (unsigned char *)iov[1].iov_base;
                memcpy(&flags, o + 12, 4);  // fuse_init_out: major, minor, max_readahead, flags
                flags |= CFUSE_KILLPRIV_V2;
                memcpy(o + 12, &flags, 4);
            }
        }
    }
    return writev(fd, iov, count);
}

static ssize_t cfuse_io_splice(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
        unsigned int flags, void *userdata) {
    (void)userdata;
    return (ssize_t)syscall(SYS_splice, fdin, offin, fdout, offout, len, flags);
}

/// Installs the io above on a mounted session; `killpriv` says whether the filesystem clears
/// set-user/group-ID bits itself (then the INIT reply asks for FUSE_HANDLE_KILLPRIV_V2).
int cfuse_session_install_io(struct fuse_session *se, int killpriv) {
    int fd = fuse_session_fd(se);
    if (fd < 0) return -EBADF;
    if (fd >= CFUSE_MAX_FD) return 0;  // libfuse's own io; the kernel then clears set-ID bits
    cfuse_killpriv_wanted[fd] = killpriv ? 1 : 0;
    static const struct fuse_custom_io io = {
        .writev = cfuse_io_writev, .read = cfuse_io_read,
        .splice_receive = cfuse_io_splice, .splice_send = cfuse_io_splice,
    };
    return fuse_session_custom_io(se, &io, fd);
}
