/* fdpass.c: fds and credentials over Unix sockets (fdpass.h). Only libc:
 * sandbox-session links this file and no other of the core. */
#define _GNU_SOURCE
#include "fdpass.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int sbx_send_fds(int sock, const void *msg, size_t len, const int *fds, int n_fds)
{
    union {
        char buf[CMSG_SPACE(SBX_MAX_FDS_PER_MESSAGE * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = (void *)msg, .iov_len = len};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    size_t n = 0;
    if (n_fds < 0 || n_fds > SBX_MAX_FDS_PER_MESSAGE) {
        errno = EINVAL;
        return -1;
    }
    m.msg_control = u.buf;
    m.msg_controllen = CMSG_SPACE((size_t)n_fds * sizeof(int));
    memset(u.buf, 0, m.msg_controllen);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    for (int k = 0; k < n_fds; k++)
        if (fds[k] >= 0) {
            memcpy(CMSG_DATA(cm) + n * sizeof(int), &fds[k], sizeof(int));
            n++;
        }
    if (n) {
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(n * sizeof(int));
        m.msg_controllen = CMSG_SPACE(n * sizeof(int));
    } else {
        m.msg_control = NULL;
        m.msg_controllen = 0;
    }
    ssize_t sent;
    while ((sent = sendmsg(sock, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    if (sent >= 0 && sent != (ssize_t)len)
        errno = EPIPE; /* a message cut short: the other end cannot use it */
    return sent == (ssize_t)len ? 0 : -1;
}

int sbx_peer_of(int sock, pid_t *pid, int *pidfd)
{
    struct ucred cred;
    socklen_t len = sizeof cred, plen = sizeof *pidfd;
    *pidfd = -1;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.uid != getuid() || cred.pid <= 0)
        return -1;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, pidfd, &plen) < 0 || *pidfd < 0) {
        *pidfd = -1;
        return -1;
    }
    *pid = cred.pid;
    return 0;
}

ssize_t sbx_recv_fds(int sock, void *buf, size_t len, int *fds, int max, int *n_fds, int *truncated)
{
    return sbx_recv_fds_flags(sock, buf, len, fds, max, n_fds, truncated, 0);
}

ssize_t sbx_recv_fds_flags(int sock, void *buf, size_t len, int *fds, int max, int *n_fds, int *truncated, int flags)
{
    return sbx_recv_fds_from(sock, buf, len, fds, max, n_fds, truncated, flags, NULL);
}

ssize_t sbx_recv_fds_from(int sock, void *buf, size_t len, int *fds, int max, int *n_fds, int *truncated, int flags,
                          pid_t *sender)
{
    union { /* all one message can carry: SCM_MAX_FD fds, and the sender's credentials if the socket asks */
        char buf[CMSG_SPACE(SBX_MAX_FDS_PER_MESSAGE * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t n;
    while ((n = recvmsg(sock, &h, MSG_CMSG_CLOEXEC | flags)) < 0 && errno == EINTR)
        ;
    *n_fds = 0;
    if (sender)
        *sender = -1;
    if (truncated)
        *truncated = n >= 0 && (h.msg_flags & (MSG_TRUNC | MSG_CTRUNC));
    if (n < 0)
        return -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&h); cm; cm = CMSG_NXTHDR(&h, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS &&
            cm->cmsg_len >= CMSG_LEN(sizeof(struct ucred)) && sender) {
            struct ucred cred;
            memcpy(&cred, CMSG_DATA(cm), sizeof cred);
            *sender = cred.pid;
        }
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof fd, sizeof fd);
            if (*n_fds < max)
                fds[(*n_fds)++] = fd;
            else
                close(fd);
        }
    }
    return n;
}

