/* session.h: what the files of sandbox-session share.
 *
 *   session.c       the session's pid 1: its request loop (sandbox.Session)
 *   session_call.c  one command's call process: a subreaper that runs the
 *                   command and ends its whole tree when asked
 *   session_user.c  the ids and capabilities a call process takes before
 *                   its command exists (a session with several ids mapped)
 *
 * sandbox-session is exec'd in place of sandbox-init by the native spawn of
 * the Session's Spec (same argv, csrc/init/init.c): by then the setup child has
 * taken every step of the Spec's plan (namespaces, root, cwd, rlimits, no
 * capability, no new privileges, Landlock, seccomp), so every process this
 * pid 1 forks inherits exactly the confinement a fresh sandbox of that Spec
 * gives its command. It holds nothing a command lacks but its fds. */
#ifndef SANDBOX_SESSION_H
#define SANDBOX_SESSION_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "fdpass.h" /* csrc/core/fdpass.c: libc only, linked into sandbox-session alone of the core */
#include "sandbox.h"

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

/* One request, received whole: its strings in `buf` (freed by the call). */
struct session_call {
    int sock;     /* the call socket */
    int stdio[3]; /* the command's 0, 1, 2 */
    char *buf;
    const char *path, *cwd;
    char **argv, **envp, **sh_argv;
    sigset_t mask; /* the command's signal mask (as sandbox-init's --MASK) */
    int proc_fd;   /* the session's procfs root, -1 if it has none */
    uint32_t flags; /* the request's (SBX_SESSION_QUIET, SBX_SESSION_USER) */
    uint32_t uid, gid, n_groups, groups[SBX_SESSION_MAX_GROUPS]; /* with SBX_SESSION_USER */
    int setid;      /* pid 1 holds CAP_SETUID/SETGID/SETPCAP beyond `keep`: drop them */
    uint64_t keep;  /* with setid: the capabilities a command keeps (the Spec's) */
    int ready_err;  /* session_call_ready's errno, 0 if it succeeded */
    int sfd;        /* its signalfd of SIGCHLD */
};

/* What a standby does before its request comes (off the caller's path):
 * a session of its own, a subreaper, a signalfd for SIGCHLD. 0, or errno. */
int session_call_ready(int *sfd);

/* Run one call in the process forked for it; never returns. */
_Noreturn void session_call_main(struct session_call *call);

/* Take the call's ids and drop what the command must not hold: 0, or -1
 * with errno and the failed step in *step. */
int session_take_user(const struct session_call *call, int *step);

/* Drop from the bounding set every capability outside `keep` (pid 1, once): 0, or -1 with errno. */
int session_shrink_bounding(uint64_t keep);

/* write(2) all of it: 0, or -1. */
int session_write_all(int fd, const void *buf, size_t len);

#endif
