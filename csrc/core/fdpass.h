/* fdpass.h: fds and credentials over Unix sockets, the one sender, receiver
 * and credential reader in C (sandbox/_core/fdpass.py and peer.py are
 * Python's). fdpass.c uses nothing but libc, so a program that links no
 * other file of the core (sandbox-session) shares it too.
 *
 * The kernel carries fds as SCM_RIGHTS control messages and installs each
 * one in the receiver as it reads the message, dropping those that do not
 * fit the room the receiver made (MSG_CTRUNC); a socket with SO_PASSCRED
 * gets the sender's pid, uid and gid with each message (SCM_CREDENTIALS,
 * translated into the receiver's pid namespace), which the sender cannot
 * forge. */
#ifndef SANDBOX_FDPASS_H
#define SANDBOX_FDPASS_H

#include <stddef.h>
#include <sys/types.h>

/* A message on a socket with fds (SCM_RIGHTS; those < 0 are left out; at
 * most SBX_MAX_FDS_PER_MESSAGE): 0, or -1 with errno. Its buffer is on the
 * stack (the setup child's has room for it). */
#define SBX_MAX_FDS_PER_MESSAGE 253 /* the kernel's SCM_MAX_FD */
int sbx_send_fds(int sock, const void *msg, size_t len, const int *fds, int n_fds);
/* The peer of the connected Unix socket `sock`, checked as every listener
 * and client checks it first: our uid, a pid in our pid namespace
 * (SO_PEERCRED), and a pidfd of it (SO_PEERPIDFD, Linux 6.5: what is read of
 * /proc/PID afterwards is confirmed through it). 0 with *pid and *pidfd (the
 * caller closes it), or -1 with nothing open. */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5 */
#endif
int sbx_peer_of(int sock, pid_t *pid, int *pidfd);
/* One message on `sock` (at most `len` bytes into `buf`) and the fds it
 * carries (SCM_RIGHTS, received close-on-exec): up to `max` of them into
 * `fds` (*n_fds), any more closed. recvmsg's result, retried on EINTR (-1
 * with errno: no fd); *truncated, if not NULL: the message or its fds did
 * not fit (MSG_TRUNC, MSG_CTRUNC). */
ssize_t sbx_recv_fds(int sock, void *buf, size_t len, int *fds, int max, int *n_fds, int *truncated);
/* sbx_recv_fds with recvmsg's `flags` added (MSG_DONTWAIT: -1 with EAGAIN when nothing is queued). */
ssize_t sbx_recv_fds_flags(int sock, void *buf, size_t len, int *fds, int max, int *n_fds, int *truncated, int flags);
/* sbx_recv_fds_flags, and the sender's pid as the kernel gives it in *sender
 * (SCM_CREDENTIALS: `sock` has SO_PASSCRED), -1 if none came. */
ssize_t sbx_recv_fds_from(int sock, void *buf, size_t len, int *fds, int max, int *n_fds, int *truncated, int flags,
                          pid_t *sender);

#endif
