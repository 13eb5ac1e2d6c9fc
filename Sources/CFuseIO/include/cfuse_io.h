#ifndef NIMBUS_CFUSE_IO_H
#define NIMBUS_CFUSE_IO_H

struct fuse_session;

/// libfuse 3.14 cannot ask for FUSE_HANDLE_KILLPRIV_V2 (the filesystem clears set-user-ID and
/// set-group-ID bits itself on write, truncate and chown); without it the kernel asks for
/// `security.capability` before every write(2). This installs a custom io on a mounted session
/// that reads requests and writes replies as libfuse would (splice included), and, when
/// `killpriv` is set and the kernel offered it, adds the flag to the INIT reply.
/// 0, or a negative errno.
int cfuse_session_install_io(struct fuse_session *se, int killpriv);

#endif
