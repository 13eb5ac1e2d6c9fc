// The libfuse3 low-level API for Swift. FUSE_USE_VERSION must be defined here: a cSettings define
// does not reach the Swift importer. Macros and varargs get static inline wrappers.
#ifndef NIMBUS_CFUSE3_SHIM_H
#define NIMBUS_CFUSE3_SHIM_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/xattr.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/file.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

/// Turns bytes of a file into holes, keeping its size (FALLOC_FL_PUNCH_HOLE | KEEP_SIZE);
/// fallocate(2) needs _GNU_SOURCE, so through syscall(2). 0 or -1 with errno.
static inline int cfuse_punch_hole(int fd, long long offset, long long length) {
    return (int)syscall(SYS_fallocate, fd, 0x02 | 0x01, (off_t)offset, (off_t)length);
}

/// `fuse_session_new` is a macro in libfuse 3.17+; one stable spelling for Swift.
static inline struct fuse_session *cfuse_session_new(struct fuse_args *args,
        const struct fuse_lowlevel_ops *op, void *userdata) {
    return fuse_session_new(args, op, sizeof(*op), userdata);
}

/// Multi-threaded loop with libfuse's own worker threads (plain pthreads, never the Swift pool).
static inline int cfuse_session_loop_mt(struct fuse_session *se, unsigned max_idle, unsigned max_threads) {
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    if (!cfg) return -ENOMEM;
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    fuse_loop_cfg_set_idle_threads(cfg, max_idle);
    fuse_loop_cfg_set_max_threads(cfg, max_threads);
    int r = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
    return r;
}

/// Replies with `size` bytes read from `fd` at `off` (splice when the kernel allows), so reads
/// never allocate in Swift (an allocation per read halves the read speed).
static inline int cfuse_reply_fd(fuse_req_t req, int fd, off_t off, size_t size) {
    struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
    bv.buf[0].flags = (enum fuse_buf_flags)(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    bv.buf[0].fd = fd;
    bv.buf[0].pos = off;
    return fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
}

/// Puts `size` bytes of `fd` at `off` into the kernel's page cache of node `ino` at the same
/// offset (FUSE_NOTIFY_STORE; spliced from `fd` when the kernel allows). 0 or -errno.
static inline int cfuse_notify_store_fd(struct fuse_session *se, fuse_ino_t ino, int fd, off_t off, size_t size) {
    struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
    bv.buf[0].flags = (enum fuse_buf_flags)(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    bv.buf[0].fd = fd;
    bv.buf[0].pos = off;
    return fuse_lowlevel_notify_store(se, ino, off, &bv, FUSE_BUF_SPLICE_MOVE);
}

/// Writes the data of a write_buf request into `fd` at `off` (splice from the fuse pipe when possible).
static inline ssize_t cfuse_write_buf_to_fd(struct fuse_bufvec *in, int fd, off_t off) {
    struct fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in));
    out.buf[0].flags = (enum fuse_buf_flags)(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    out.buf[0].fd = fd;
    out.buf[0].pos = off;
    return fuse_buf_copy(&out, in, (enum fuse_buf_copy_flags)0);
}

static inline void cfuse_conn_tune(struct fuse_conn_info *conn, unsigned max_background,
        unsigned congestion, int want_splice, int want_locks) {
    conn->max_background = max_background;
    conn->congestion_threshold = congestion;
    if (conn->capable & FUSE_CAP_EXPORT_SUPPORT) conn->want |= FUSE_CAP_EXPORT_SUPPORT;
    if (want_splice) {
        if (conn->capable & FUSE_CAP_SPLICE_WRITE) conn->want |= FUSE_CAP_SPLICE_WRITE;
        if (conn->capable & FUSE_CAP_SPLICE_MOVE) conn->want |= FUSE_CAP_SPLICE_MOVE;
        if (conn->capable & FUSE_CAP_SPLICE_READ) conn->want |= FUSE_CAP_SPLICE_READ;
    }
    if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
    if (conn->capable & FUSE_CAP_READDIRPLUS_AUTO) conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
    if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
    if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
    // flock/fcntl locks come to the filesystem when it coordinates them (ContainerFS: they are
    // claims); otherwise the kernel keeps them local.
    if (want_locks && (conn->capable & FUSE_CAP_POSIX_LOCKS)) conn->want |= FUSE_CAP_POSIX_LOCKS;
    else conn->want &= ~FUSE_CAP_POSIX_LOCKS;
    if (want_locks && (conn->capable & FUSE_CAP_FLOCK_LOCKS)) conn->want |= FUSE_CAP_FLOCK_LOCKS;
    else conn->want &= ~FUSE_CAP_FLOCK_LOCKS;
    // The kernel clears set-user/group-ID bits on write/truncate/chown (it sends the mode change).
    conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;
    // open(O_TRUNC) arrives as one open with O_TRUNC (ContainerFS truncates), not open + setattr.
    if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
    // The server decides about writeback caching later; write-through keeps mtime/size ours.
    conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
    // Cached pages stay when a getattr shows a new mtime or size: every change the kernel did
    // not make itself (a remote version) is invalidated explicitly (ContainerFS KernelAction),
    // so a file just written is read from the page cache, not again from the daemon.
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
}

static inline int cfuse_errno(void) { return errno; }

/// Request counters (FuseKit `FuseRequestCounts`): relaxed atomics, one add per request.
static inline void cfuse_count_add(uint64_t *slot) { __atomic_fetch_add(slot, 1, __ATOMIC_RELAXED); }
static inline uint64_t cfuse_count_load(uint64_t *slot) { return __atomic_load_n(slot, __ATOMIC_RELAXED); }

/// Calls back into Swift when the kernel interrupts `req` (a signal reached the waiting caller).
void cfuse_interrupted(fuse_req_t req, void *token);
static inline void cfuse_watch_interrupt(fuse_req_t req, uint64_t token) {
    fuse_req_interrupt_func(req, cfuse_interrupted, (void *)(uintptr_t)token);
}

static inline void cfuse_noop_handler(int sig) { (void)sig; }
/// Installs a no-op SIGUSR2 handler (without SA_RESTART) and unblocks SIGUSR2 on the calling
/// thread, so pthread_kill(loopThread, SIGUSR2) interrupts its blocking wait.
static inline void cfuse_prepare_wakeup_signal(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = cfuse_noop_handler;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

#endif
