/* session_call.c: one command of a sandbox.Session, in a process of its own.
 *
 * Forked by the session's pid 1 for each request, it is a child subreaper
 * (PR_SET_CHILD_SUBREAPER) in a session of its own: whatever the command
 * starts, in any session or process group, is re-parented here rather than
 * to pid 1 when its parent dies, so the command's whole tree is this
 * process's descendants. It clones the command sharing its memory
 * (CLONE_VM|CLONE_VFORK: resumed once the command has exec'd or failed,
 * which leaves its errno here), sends STARTED with the command's pidfd on
 * the call socket, and then:
 * - when the command ends, sends EXITED with its raw wait status and exits:
 *   what the command left running (a server started in the background) is
 *   re-parented to pid 1 and keeps running, as with `docker exec`;
 * - on SIGNAL, passes the signal to the command;
 * - on EOF (the caller dropped its handle), goes on waiting, unwatched;
 * - on KILL or SIGKILL (the caller's timeout or kill()), ends the tree: each child it has (listed in the session's
 *   /proc: /proc/thread-self/children) is killed and reaped, and the
 *   children of each, re-parented here as it dies, in turn, until none is
 *   left; then EXITED with the command's status. Without a /proc in the
 *   session, only the command's process group and the command can be
 *   reached (a descendant that left both survives).
 * The command holds none of these fds (close_range before its exec). */
#include "session.h"

#include "execpath.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE 2
#endif

#define COMMAND_STACK (64 * 1024) /* the command child's, until its exec */

/* What the command child leaves here (our memory until its exec). */
static struct {
    int step, err;
} failed;

static long plain_execve(const char *path, char *const argv[], char *const envp[])
{
    execve(path, argv, envp);
    return -errno;
}

/* Stdio onto 0, 1, 2 (each source is above 2: pid 1's own 0-2 are open). */
static int place_stdio(const struct session_call *call)
{
    for (int i = 0; i < 3; i++)
        if (dup2(call->stdio[i], i) < 0)
            return -1;
    return (int)syscall(SYS_close_range, 3, ~0U, 0);
}

static int command_main(void *arg)
{
    struct session_call *call = arg;
    if (setpgid(0, 0) < 0 || place_stdio(call) < 0) {
        failed.step = SBX_STEP_FDS;
        failed.err = errno;
        _exit(126);
    }
    if (*call->cwd && chdir(call->cwd) < 0) {
        failed.step = SBX_STEP_CWD;
        failed.err = errno;
        _exit(126);
    }
    /* SIGCHLD is at SIG_DFL already (pid 1 set it, and a disposition is inherited) */
    sigprocmask(SIG_SETMASK, &call->mask, NULL);
    int err = sbx_exec_path(call->argv[0], call->argv, call->envp, call->path, plain_execve, call->sh_argv);
    failed.step = SBX_STEP_EXEC;
    failed.err = err;
    if (err == ENOENT) /* as a shell says it, on the command's own stderr */
        dprintf(2, "sandbox: %s: command not found\n", call->argv[0]);
    _exit(err == ENOENT ? 127 : 126);
}

static void send_frame(int sock, int kind, int value, int pid, int step, int fd)
{
    struct sbx_session_frame f = {kind, value, pid, step};
    (void)sbx_send_fds(sock, &f, sizeof f, &fd, 1); /* fd < 0: none; a caller gone hears nothing, as it should */
}

/* SIGKILL every child listed in /proc/thread-self/children: how many. */
static int kill_listed(int proc_fd)
{
    int fd = openat(proc_fd, "thread-self/children", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buf[4096];
    int n_killed = 0;
    ssize_t n;
    long pid = 0;
    int in_number = 0;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] >= '0' && buf[i] <= '9') {
                pid = pid * 10 + (buf[i] - '0');
                in_number = 1;
            } else if (in_number) {
                kill((pid_t)pid, SIGKILL);
                n_killed++;
                pid = 0;
                in_number = 0;
            }
        }
    }
    if (in_number) {
        kill((pid_t)pid, SIGKILL);
        n_killed++;
    }
    close(fd);
    return n_killed;
}

/* End the command's whole tree; the command's status if it was reaped here. */
static int kill_tree(const struct session_call *call, pid_t command, int *status, int have_status)
{
    int st;
    pid_t pid;
    kill(-command, SIGKILL);
    kill(command, SIGKILL);
    for (;;) {
        if (call->proc_fd >= 0)
            kill_listed(call->proc_fd);
        /* each reaped child's children are ours by now (re-parented before it became a zombie) */
        pid = waitpid(-1, &st, __WALL);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        if (pid == command) {
            *status = st;
            have_status = 1;
        }
    }
    return have_status;
}

/* Wait for the command's end, or the caller's word: the command's status. */
static int serve(const struct session_call *call, pid_t command)
{
    int sfd = call->sfd;
    struct pollfd fds[2] = {{call->sock, POLLIN, 0}, {sfd, POLLIN, 0}};
    int status = 0;
    for (;;) {
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG | __WALL)) > 0)
            if (pid == command)
                return st;
        if (poll(fds, 2, -1) < 0)
            continue;
        if (fds[1].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) == sizeof info)
                ;
        }
        if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        struct sbx_session_frame f;
        ssize_t n = recv(call->sock, &f, sizeof f, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0) { /* the caller dropped its handle: the command runs on, unwatched */
            fds[0].fd = -1;
            continue;
        }
        if (n == sizeof f && f.kind == SBX_SESSION_SIGNAL && f.value != SIGKILL && f.value > 0 && f.value < 65) {
            kill(command, f.value);
            continue;
        }
        kill_tree(call, command, &status, 0);
        return status;
    }
}

int session_call_ready(int *sfd)
{
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (setsid() < 0 || prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        return errno;
    *sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    return *sfd < 0 ? errno : 0;
}

_Noreturn void session_call_main(struct session_call *call)
{
    if (call->ready_err) {
        send_frame(call->sock, SBX_SESSION_FAILED, call->ready_err, 0, SBX_STEP_SESSION, -1);
        _exit(125);
    }
    int step = 0;
    if (session_take_user(call, &step) < 0) {
        send_frame(call->sock, SBX_SESSION_FAILED, errno, 0, step, -1);
        _exit(125);
    }
    size_t argc = 0;
    while (call->argv[argc])
        argc++;
    call->sh_argv = calloc(argc + 2, sizeof *call->sh_argv); /* an ENOEXEC script's argv for /bin/sh */
    /* Every signal stays blocked here (pid 1's mask): SIGCHLD is read from a signalfd. */
    static char stack[COMMAND_STACK] __attribute__((aligned(16)));
    pid_t command = clone(command_main, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, call);
    if (command < 0) {
        send_frame(call->sock, SBX_SESSION_FAILED, errno, 0, SBX_STEP_FORK, -1);
        _exit(125);
    }
    for (int i = 0; i < 3; i++)
        close(call->stdio[i]); /* the command's pipes reach EOF when the command's tree closes them */
    if (failed.step && failed.step != SBX_STEP_EXEC) {
        waitpid(command, NULL, 0);
        send_frame(call->sock, SBX_SESSION_FAILED, failed.err, 0, failed.step, -1);
        _exit(0);
    }
    if (failed.step == SBX_STEP_EXEC && failed.err != ENOENT) {
        waitpid(command, NULL, 0);
        send_frame(call->sock, SBX_SESSION_FAILED, failed.err, 0, SBX_STEP_EXEC, -1);
        _exit(0);
    }
    /* not found: the command ran as a shell's would, ending 127 */
    if (!(call->flags & SBX_SESSION_QUIET)) {
        int pidfd = (int)syscall(SYS_pidfd_open, command, 0);
        send_frame(call->sock, SBX_SESSION_STARTED, 0, command, 0, pidfd);
        if (pidfd >= 0)
            close(pidfd);
    }
    int status = serve(call, command);
    send_frame(call->sock, SBX_SESSION_EXITED, status, command, 0, -1);
    _exit(0);
}
