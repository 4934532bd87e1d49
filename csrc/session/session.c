/* session.c: sandbox-session, the pid 1 of a sandbox.Session.
 *
 *     sandbox-session ERR_FD STATUS_FD PATH --[MASK] NAME SOCK_FD [KEEP_CAPS]
 * (sandbox-init's argv, csrc/init/init.c: the native spawn execs it in init's
 * place). It takes requests on SOCK_FD (the session's control socket, the
 * caller's socket pair: csrc/core/sandbox.h's session wire) through a call
 * process made ahead of each (a standby: it alone reads the socket, takes
 * one request whole and says so, and pid 1 forks the next meanwhile, off
 * the caller's path), which runs the command in this sandbox's namespaces
 * and root (session_call.c). Orphans re-parented here are reaped; a
 * server a command left running keeps running.
 *
 * The session ends when the caller's end of SOCK_FD closes (close(), or the
 * caller's death: the kernel closes its fds) or when every reader of
 * STATUS_FD has gone: kill(-1) from pid 1 reaches every process of the pid
 * namespace, each is reaped, a status 0 goes on STATUS_FD and pid 1 exits,
 * the kernel tearing the namespaces down with it. Signals from inside
 * cannot kill pid 1 (the kernel drops those it has no handler for).
 *
 * Not dumpable: a command (same uid, no capability) can neither ptrace it
 * nor open its /proc files (fds, memory): the control socket, which could
 * start commands with fds of the caller's choosing, stays out of reach. */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_FDS 4 /* the call socket, stdin, stdout, stderr */

/* All `len` bytes written from `out`, or (`out` NULL) read into `in`: 0, or -1 (an error, or the end of the file). */
static int transfer_all(int fd, char *in, const char *out, size_t len)
{
    for (size_t done = 0; done < len;) {
        ssize_t n = out ? write(fd, out + done, len - done) : read(fd, in + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

int session_write_all(int fd, const void *buf, size_t len)
{
    return transfer_all(fd, NULL, buf, len);
}

static int parse_fd(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v >= 0 && v < 65536 ? (int)v : -1;
}

static void report_failure(int err_fd, int step, int err)
{
    struct sbx_report r = {.step = step, .op = -1, .err = err, .detail = SBX_D_NONE};
    session_write_all(err_fd, &r, sizeof r);
}

/* Kill every other process of the pid namespace, reap them all, say so, exit. */
static _Noreturn void finish(int status_fd)
{
    int status = 0;
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, __WALL) > 0 || errno == EINTR)
        ;
    session_write_all(status_fd, &status, sizeof status);
    _exit(0);
}

static int read_full(int fd, void *buf, size_t len)
{
    return transfer_all(fd, buf, NULL, len);
}

/* The strings of a request, split into the call: 0, or -1 (malformed). */
static int split_strings(struct session_call *call, const struct sbx_session_request *r)
{
    char *p = call->buf, *end = call->buf + r->size;
    const char **slots[2] = {&call->path, &call->cwd};
    call->argv = calloc((size_t)r->argc + 1, sizeof *call->argv);
    call->envp = calloc((size_t)r->envc + 1, sizeof *call->envp);
    if (!call->argv || !call->envp)
        return -1;
    for (uint32_t i = 0; i < 2 + r->argc + r->envc; i++) {
        char *nul = memchr(p, 0, (size_t)(end - p));
        if (!nul)
            return -1;
        if (i < 2)
            *slots[i] = p;
        else if (i < 2 + r->argc)
            call->argv[i - 2] = p;
        else
            call->envp[i - 2 - r->argc] = p;
        p = nul + 1;
    }
    return p == end && r->argc > 0 ? 0 : -1;
}

/* Receive the header and fds of one request: 1, 0 at EOF, -1 if malformed. */
static int receive_header(int sock, struct sbx_session_request *r, int *fds)
{
    int got[N_FDS + 1], n_got, truncated; /* one more than a request carries: a request with more is refused */
    ssize_t n = sbx_recv_fds(sock, r, sizeof *r, got, N_FDS + 1, &n_got, &truncated);
    if (n == 0 && n_got == 0)
        return 0;
    if (n_got == N_FDS)
        memcpy(fds, got, sizeof(int) * N_FDS);
    else
        for (int i = 0; i < n_got; i++)
            close(got[i]);
    if (n < 0 || n_got != N_FDS || truncated)
        return -1;
    if ((size_t)n < sizeof *r && read_full(sock, (char *)r + n, sizeof *r - (size_t)n) < 0)
        return -1;
    if (r->magic != SBX_SESSION_MAGIC || r->size > SBX_SESSION_MAX_STRINGS || r->argc > r->size ||
        r->envc > r->size || (r->flags & ~(uint32_t)(SBX_SESSION_QUIET | SBX_SESSION_USER)) ||
        r->n_groups > SBX_SESSION_MAX_GROUPS)
        return -1;
    return 1;
}

#define NOTE_TAKEN 'T' /* a standby took a request: the next one is made */
#define NOTE_END 'E'   /* the caller has gone (EOF), or sent what this library never sends */

/* A standby call process, made ahead of the next request: it alone reads
 * the control socket, takes one request whole, tells pid 1 (which makes
 * the next standby meanwhile) and becomes that command's call process. */
static _Noreturn void standby(int sock, int note, const sigset_t *mask, int proc_fd, const uint64_t *keep)
{
    struct sbx_session_request r = {0};
    int fds[N_FDS] = {-1, -1, -1, -1};
    int sfd = -1;
    int ready_err = session_call_ready(&sfd);
    int got = receive_header(sock, &r, fds);
    struct session_call call = {.sock = fds[0], .stdio = {fds[1], fds[2], fds[3]}, .mask = *mask,
                                .proc_fd = proc_fd, .flags = r.flags, .uid = r.uid, .gid = r.gid,
                                .n_groups = r.n_groups, .setid = keep != NULL, .keep = keep ? *keep : 0,
                                .ready_err = ready_err, .sfd = sfd};
    memcpy(call.groups, r.groups, sizeof call.groups);
    if (got > 0) {
        call.buf = malloc((size_t)r.size + 1);
        got = call.buf && read_full(sock, call.buf, r.size) == 0 && split_strings(&call, &r) == 0 ? 1 : -1;
    }
    char word = got > 0 ? NOTE_TAKEN : NOTE_END;
    if (write(note, &word, 1) != 1 || got <= 0)
        _exit(0);
    close(note);
    close(sock);
    session_call_main(&call);
}

/* Fork the next standby: its pid, or -1 (tried again on a timer). */
static pid_t make_standby(int sock, int note_rd, int note_wr, int sfd, int status_fd, const sigset_t *mask,
                          int proc_fd, const uint64_t *keep)
{
    pid_t pid = fork();
    if (pid == 0) {
        close(note_rd);
        close(sfd);
        close(status_fd);
        standby(sock, note_wr, mask, proc_fd, keep);
    }
    return pid;
}

/* Reap every child that has ended: whether `standby` was one of them. */
static int reap_all(pid_t standby_pid)
{
    int gone = 0;
    pid_t pid;
    while ((pid = waitpid(-1, NULL, WNOHANG | __WALL)) > 0)
        gone |= pid == standby_pid;
    return gone;
}

int main(int argc, char **argv)
{
    if ((argc != 7 && argc != 8) || strncmp(argv[4], "--", 2) != 0)
        return 125;
    /* KEEP_CAPS (hex), with several ids mapped: we hold CAP_SETUID, CAP_SETGID
     * and CAP_SETPCAP beyond the Spec's; each call drops to KEEP (session_user.c) */
    uint64_t keep_caps = argc == 8 ? strtoull(argv[7], NULL, 16) : 0;
    const uint64_t *keep = argc == 8 ? &keep_caps : NULL;
    int err_fd = parse_fd(argv[1]), status_fd = parse_fd(argv[2]), sock = parse_fd(argv[6]);
    if (err_fd < 0 || status_fd < 0 || sock < 0)
        return 125;
    fcntl(err_fd, F_SETFD, FD_CLOEXEC);
    fcntl(status_fd, F_SETFD, FD_CLOEXEC);
    fcntl(sock, F_SETFD, FD_CLOEXEC);
    unsigned long bits = strtoul(argv[4] + 2, NULL, 16);
    sigset_t all, mask;
    sigfillset(&all);
    sigemptyset(&mask);
    for (int sig = 1; sig <= 64; sig++)
        if (bits & (1UL << (sig - 1)))
            sigaddset(&mask, sig);
    sigprocmask(SIG_SETMASK, &all, NULL);
    signal(SIGCHLD, SIG_DFL); /* an ignored SIGCHLD would reap our children for us */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
        report_failure(err_fd, SBX_STEP_EXEC_INIT, errno);
        return 125;
    }
    if (keep && session_shrink_bounding(*keep) < 0) {
        report_failure(err_fd, SBX_STEP_CAPS, errno);
        return 125;
    }
    int sfd = signalfd(-1, &all, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        report_failure(err_fd, SBX_STEP_EXEC_INIT, errno);
        return 125;
    }
    /* The session's own proc, if its root has one: a call process lists its
     * children there to end its tree (session_call.c). */
    int proc_fd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
    int note[2];
    if (pipe2(note, O_CLOEXEC) < 0) {
        report_failure(err_fd, SBX_STEP_PIPE, errno);
        return 125;
    }
    close(err_fd); /* EOF (no standby may hold it): the caller's spawn returns, the session is up */
    pid_t next = make_standby(sock, note[0], note[1], sfd, status_fd, &mask, proc_fd, keep);
    struct pollfd fds[3] = {{note[0], POLLIN, 0}, {sfd, POLLIN, 0}, {status_fd, 0, 0}};
    nfds_t watched = 2; /* 3 once the spawning thread is gone: then POLLERR there ends us too */
    for (;;) {
        /* without a standby (a fork failed, or a command killed it), make one again soon */
        if (poll(fds, watched, next > 0 ? -1 : 10) < 0)
            continue;
        if (fds[2].revents & POLLERR)
            finish(status_fd);
        if (fds[1].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) == sizeof info)
                if (info.ssi_signo == SBX_PDEATH_SIGNAL)
                    watched = 3;
            if (reap_all(next))
                next = -1;
        }
        if (fds[0].revents & POLLIN) {
            char word = NOTE_END;
            if (read(note[0], &word, 1) == 1 && word == NOTE_TAKEN)
                next = -1;
            else
                finish(status_fd);
        }
        if (next <= 0)
            next = make_standby(sock, note[0], note[1], sfd, status_fd, &mask, proc_fd, keep);
    }
}
