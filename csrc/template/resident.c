/* resident.c: a Template's sandbox stays resident as its own pid 1.
 *
 * The native spawn's child shares its caller's memory, so it must exec
 * sandbox-init to have a pid 1 that forks the command and reaps. A
 * Template's sandbox is a fork-style clone of the small sandbox-template
 * server: it already is a process of its own, so, set up, it stays on as
 * that pid 1 and saves an exec, a process start and a round trip:
 * - it clones the command sharing its memory (CLONE_VM|CLONE_VFORK) and
 *   resumes once the command has exec'd, or failed to: the command child
 *   installs the seccomp filter (on itself alone; this reaper runs only the
 *   code below) and execs; a failure is left in this process's memory;
 * - before that it closes every fd but the command's (stdio, pass_fds) and
 *   the report socket, and makes itself non-dumpable: its memory is a copy
 *   of the server's, so neither ptrace nor /proc/1/mem, fd or environ may
 *   be open to the command (it holds no capability over the user namespace
 *   this memory belongs to, the server's);
 * - it sends the started message (csrc/core/sandbox.h) with a pidfd of itself,
 *   clears the request its memory still holds, and then behaves as
 *   sandbox-init (csrc/init/init.c): every signal stays blocked and is taken with
 *   sigtimedwait; one from outside the sandbox (si_pid 0: an ancestor pid
 *   namespace) is forwarded to the command, one from inside already reached
 *   its targets; orphans are reaped; when the command ends, whatever is left
 *   in the namespace is killed and reaped, then its raw wait status goes on
 *   the report socket and pid 1 exits: the caller's wait may end with the
 *   status, without waiting for the kernel to tear the namespaces down.
 */
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/filter.h>
#include <linux/seccomp.h>

/* What the command child left here (the memory is shared until its exec). */
static struct {
    struct sbx_ctx *c;
    int step, err;
} command;

static int command_main(void *arg)
{
    struct sbx_ctx *c = arg;
    sigset_t none;
    if (c->h->seccomp_len && !(c->h->opts & SBX_OPT_SECCOMP_EARLY)) { /* else inherited */
        struct sock_fprog prog = {
            .len = (unsigned short)(c->h->seccomp_len / 8),
            .filter = (struct sock_filter *)(c->in.blob + c->h->seccomp_off),
        };
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0) {
            command.step = SBX_STEP_SECCOMP;
            command.err = errno;
            _exit(126);
        }
    }
    /* The command's mask: none blocked (a Template keeps no caller's mask). */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    sbx_exec_search(c->in.argv[0], c->in.argv, c->in.envp, sbx_str(c, c->h->path), c->in.sh_argv);
    command.step = SBX_STEP_EXEC;
    command.err = errno;
    _exit(errno == ENOENT ? 127 : 126);
}

#define MAX_KEEP 260 /* the report socket, notify socket, lease and at most SCM_MAX_FD passed fds */

/* The lease this sandbox reports (-1: none). */
static int lease_of(const struct sbx_ctx *c)
{
    return c->in.lease_fd;
}

/* Close every fd but 0-2, the pass_fds (at their numbers by now), keep, c->keep_fd and the lease. */
static void close_all_but(const struct sbx_ctx *c, int keep)
{
    int fds[MAX_KEEP];
    int n = 0;
    fds[n++] = keep;
    if (c->keep_fd >= 0)
        fds[n++] = c->keep_fd;
    if (lease_of(c) >= 0)
        fds[n++] = lease_of(c);
    for (int k = 0; k < c->in.n_pass && n < MAX_KEEP; k++)
        if (c->in.pass_fds[k] > 2)
            fds[n++] = c->in.pass_fds[k];
    sbx_close_all_but(fds, n, 3);
}

/* Forward signals from outside to the command, reap orphans, until the
 * command `pid` ends: its wait status. Every signal is blocked here. */
int sbx_serve_command(pid_t pid)
{
    sigset_t all;
    sigfillset(&all);
    for (;;) {
        siginfo_t info;
        int sig = sigtimedwait(&all, &info, NULL);
        if (sig < 0)
            continue;
        if (sig != SIGCHLD) {
            if (info.si_pid == 0)
                kill(pid, sig);
            continue;
        }
        int status;
        pid_t done;
        while ((done = waitpid(-1, &status, WNOHANG)) > 0)
            if (done == pid)
                return status;
    }
}

/* The sandbox ends with its command: what is left goes now, so that the
 * status, once written, says the sandbox is gone but for this process,
 * which exits at once. */
static _Noreturn void reap(pid_t pid, int report)
{
    int status = sbx_serve_command(pid), other;
    if (waitpid(-1, &other, WNOHANG) >= 0 || errno != ECHILD) {
        kill(-1, SIGKILL);
        while (waitpid(-1, &other, 0) > 0 || errno == EINTR)
            ;
    }
    /* Every process of the sandbox is reaped: RUSAGE_CHILDREN covers them
     * all, and nothing of this process's own setup (csrc/core/sandbox.h). */
    struct sbx_end_status end = {.status = status, .utime_us = -1, .stime_us = -1, .maxrss_kb = -1};
    struct rusage ru;
    if (getrusage(RUSAGE_CHILDREN, &ru) == 0) {
        end.utime_us = (int64_t)ru.ru_utime.tv_sec * 1000000 + ru.ru_utime.tv_usec;
        end.stime_us = (int64_t)ru.ru_stime.tv_sec * 1000000 + ru.ru_stime.tv_usec;
        end.maxrss_kb = ru.ru_maxrss;
    }
    sbx_write_all(report, &end, sizeof end);
    _exit(WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status));
}

_Noreturn void sbx_resident_reaper(struct sbx_ctx *c)
{
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        sbx_fail(c, SBX_STEP_EXEC_INIT, -1, errno, SBX_D_NONE);
    close_all_but(c, c->in.err_fd);
    command.c = c;
    sbx_stamp(c, SBX_T_READY);
    c->reached_exec = 1;
    /* On a stack of this process's own (sbx_clone_vm maps and unmaps one:
     * the unmap, after the child ran on another CPU, costs a TLB shootdown).
     * Every signal is blocked here already (main, in the server). */
    static char stack[SBX_CHILD_STACK] __attribute__((aligned(16)));
    pid_t pid = clone(command_main, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, c);
    sbx_stamp(c, SBX_T_RETURN); /* the command has exec'd (or failed to) */
    if (pid < 0)
        sbx_fail(c, SBX_STEP_FORK, -1, errno, SBX_D_NONE);
    if (command.step) {
        int status;
        waitpid(pid, &status, 0);
        sbx_fail(c, command.step, -1, command.err, SBX_D_NONE);
    }
    /* Only the report socket stays (and until it is reported, the lease):
     * the command's stdio and passed fds must reach EOF when the command
     * (not this reaper) closes them. */
    int keep[] = {c->in.err_fd, c->keep_fd, lease_of(c)};
    sbx_close_all_but(keep, 3, 0); /* stdio too */
    if (sbx_send_started(c) < 0) {
        kill(pid, SIGKILL);
        _exit(125);
    }
    if (lease_of(c) >= 0) { /* the caller has its own fd of it now */
        close(c->in.lease_fd);
        c->in.lease_fd = -1;
    }
    /* After the caller is woken, not before: the replacement the server
     * starts at this word competes with the caller for the CPU. (A Template's
     * standby marked itself taken when the request came: if the caller
     * kills us first, the server does not take that for a crash.) */
    if (c->mode->on_running)
        c->mode->on_running(c);
    if (c->in.scrub)
        memset(c->in.scrub, 0, c->in.scrub_len);
    reap(pid, c->in.err_fd);
}
