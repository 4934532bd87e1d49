/* template_maker.c: a recycled sandbox's command maker.
 *
 * A recycled sandbox's pid 1 keeps the server's capabilities to reset the
 * sandbox, so its commands cannot be its plain copies: each must first
 * take the command's identity, and about 120 us of CPU of a command's
 * start went there (loading the seccomp filter alone, ~80 us: the kernel
 * converts and JITs it, then runs it once per syscall number to cache the
 * verdicts; 41 bounding-set drops, capset, the user namespace). When the
 * commands' user namespace is kept from one request to the next (the
 * filter refuses every keyring syscall), that identity is the same for
 * every command, and one process takes it once: the maker, pid 1's child,
 * made before any request. It joins a session keyring of its own and the
 * commands' user namespace, takes the identity (no capability, no new
 * privileges, Landlock, the filter) and makes itself non-dumpable; then,
 * for each request, on pid 1's word once the sandbox has been reset, it
 * clones the command child sharing its memory (CLONE_VM) as pid 1's child
 * (CLONE_PARENT: pid 1 reaps it), which inherits all of that: the same
 * filter (no second load), creds and domain. The child takes its session,
 * the request and what it decides (cwd, rlimits, fds), hands pid 1 the
 * report socket with its stamps, and execs.
 *
 * The maker outlives each command, and a command has its uid, so what a
 * process of that uid may change in another without a capability (its
 * resource limits, nice, policy, affinity, I/O priority; through its /proc
 * files, which a non-dumpable process's memory owner holds: its OOM score
 * and core dump filter) is compared with a reference before each command
 * it makes (template_inherited.c); any change ends it. Signals sent to it
 * are blocked and dropped; a stop is undone (pid 1 sends SIGCONT before its
 * word: no command is left then to stop it again). It cannot be ptraced
 * (non-dumpable; the command holds no capability), and holds no fd but its
 * close-on-exec sockets. A reset that makes a new IPC or network namespace
 * (entered by pid 1: the maker cannot follow, holding no capability there)
 * makes a new maker too, from pid 1 as it was before any request. pid 1
 * ends, and the server makes a fresh standby,
 * if the maker has gone, or if any process but it is left after a command
 * (pid 1 reads its own /proc/<pid>/task/<pid>/children: every process left
 * in the sandbox descends from one of pid 1's children).
 *
 * Used when the commands' user namespace is kept (SBX_OPT_KEYS_REFUSED),
 * the filter is taken before the request (SBX_OPT_SECCOMP_EARLY:
 * seccomp.resident checks that it allows what the maker and the command
 * child do after it), no probe path is to be checked by pid 1 (its view
 * needs the request, which pid 1 never sees here), and the kernel lists a
 * process's children. Otherwise each command child is pid 1's own clone
 * and takes the identity itself (template_recycle.c).
 */
#include "template.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef KEYCTL_JOIN_SESSION_KEYRING
#define KEYCTL_JOIN_SESSION_KEYRING 1 /* linux/keyctl.h */
#endif

/* The command child's word to pid 1, just before its exec (with the
 * request's report socket); a failed exec then writes a struct exec_failure. */
struct made_word {
    int32_t pid;
    struct sbx_stamps_report started;
};
struct exec_failure {
    int32_t step, err;
};

/* pid 1's view of its maker. */
static struct {
    pid_t pid;        /* in pid 1's pid namespace; 0: none */
    int sock;         /* pid 1's end of the socket pair with the maker */
    int children;     /* pid 1's own /proc/<pid>/task/<pid>/children */
    char listed[32];  /* what it lists with the maker its only child */
    size_t listed_len;
    int self_pidfd;   /* pid 1's pidfd of itself, sent with each started report */
} maker = {0, -1, -1, {0}, 0, -1};

/* ---------------------------------------------------------------- the command child */

static int made_main(void *arg)
{
    struct sbx_ctx *c = arg;
    /* a session of its own (the maker's is its own; setsid needs no privilege) */
    if ((c->h->opts & SBX_OPT_NEW_SESSION) && setsid() < 0)
        _exit(125);
    tpl_take_request(c, 1);
    /* the request's cgroups (made for it alone): the command and whatever it
     * forks are born there; pid 1 and the maker stay where they are */
    sbx_enter_cgroups(c);
    sbx_command_request(c); /* a failing step reports on the report socket and exits */
    sbx_stamp(c, SBX_T_READY);
    struct made_word w = {(int32_t)getpid(),
                          {SBX_STEP_NONE, c->res->landlock_abi, (int32_t)c->cgroup_tag, (int32_t)c->cgroup_left, {0}}};
    for (int k = 0; k < SBX_N_STAMPS; k++)
        w.started.t_ns[k] = c->res->t_ns[k];
    if (sbx_send_fds(c->keep_fd, &w, sizeof w, &c->in.err_fd, 1) < 0)
        _exit(125);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    c->reached_exec = 1;
    sbx_exec_search(c->in.argv[0], c->in.argv, c->in.envp, sbx_str(c, c->h->path), c->in.sh_argv);
    struct exec_failure f = {SBX_STEP_EXEC, errno};
    sbx_write_all(c->keep_fd, &f, sizeof f);
    _exit(f.err == ENOENT ? 127 : 126);
}

/* ---------------------------------------------------------------- the maker */

/* The request the last command child took, out of this memory: its
 * message (the server's buffer) and the arrays made for it. */
static void forget_request(struct sbx_ctx *c, const struct sbx_ctx *saved)
{
    struct sbx_input got = c->in;
    if (got.scrub)
        memset(got.scrub, 0, got.scrub_len);
    free(got.sh_argv);
    free((void *)got.argv);
    free((void *)got.envp);
    *c = *saved;
}

/* Receive pid 1's word: the command child's end of a fresh socket pair
 * with pid 1, or -1 when pid 1 has gone. */
static int await_word(int sock)
{
    char b;
    int fd, n_fds;
    return sbx_recv_fds(sock, &b, 1, &fd, 1, &n_fds, NULL) > 0 && n_fds == 1 ? fd : -1;
}

static _Noreturn void maker_main(struct sbx_ctx *c, int sock)
{
    struct tpl_server *s = TPL_SANDBOX(c)->srv;
    static char stack[SBX_CHILD_STACK] __attribute__((aligned(16)));
    static struct tpl_inherited inherited; /* what its command children inherit, before any request */
    static struct sbx_ctx saved;
    int keep[] = {sock, s->fast_fd, s->notify_wr, c->in.proc_dir, c->userns_fd};
    sbx_close_all_but(keep, (int)(sizeof keep / sizeof *keep), 3); /* pid 1's fds the maker does not use */
    /* Before any request, a failure goes to the server (c->in.err_fd), which
     * stops making standbys: it would fail again. */
    if (tpl_inherited_take(c, &inherited) < 0)
        sbx_fail(c, SBX_STEP_EXEC_INIT, -1, errno, SBX_D_NONE);
    /* pid 1's session keyring is the caller's: the commands' is one of their own */
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL) < 0 && errno != ENOSYS)
        sbx_fail(c, SBX_STEP_SESSION, -1, errno, SBX_D_NONE);
    sbx_command_identity(c); /* the commands' user namespace, session, caps, no new privs, Landlock, filter */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        sbx_fail(c, SBX_STEP_EXEC_INIT, -1, errno, SBX_D_NONE);
    saved = *c;
    for (int made = 0;; made = 1) {
        int theirs = await_word(sock);
        if (theirs < 0)
            _exit(0);
        if (made)
            forget_request(c, &saved);
        /* a command may have changed what the next would inherit from us */
        if (!tpl_inherited_same(&inherited))
            _exit(125);
        tpl_drop_pending_signals(); /* none is inherited: their queue counts for the commands' uid */
        c->keep_fd = theirs; /* kept off the request's fd numbers (sbx_place_fds) */
        if (clone(made_main, stack + sizeof stack, CLONE_VM | CLONE_PARENT | SIGCHLD, c) < 0)
            _exit(125);
        close(theirs); /* the command child's alone now: EOF on pid 1's end says it exec'd or died */
    }
}

/* ---------------------------------------------------------------- pid 1's side */

/* Fork the maker, pid 1's only child then: 0, or -1. */
static int make_maker(struct sbx_ctx *c)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
        return -1;
    pid_t pid = fork(); /* pid 1 is single-threaded and has memory of its own (the server's copy) */
    if (pid == 0) {
        close(sp[0]);
        maker_main(c, sp[1]);
    }
    close(sp[1]);
    if (pid < 0) {
        close(sp[0]);
        return -1;
    }
    maker.pid = pid;
    maker.sock = sp[0];
    ssize_t n = pread(maker.children, maker.listed, sizeof maker.listed, 0);
    maker.listed_len = n > 0 ? (size_t)n : 0;
    return 0;
}

int tpl_maker_start(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    if (!(h->opts & SBX_OPT_KEYS_REFUSED) || !(h->opts & SBX_OPT_SECCOMP_EARLY) || h->n_probe || c->userns_fd < 0)
        return -1;
    maker.children = sbx_proc_open(c, "thread-self/children", O_RDONLY);
    maker.self_pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (maker.children < 0 || maker.self_pidfd < 0)
        return -1;
    return make_maker(c);
}

void tpl_maker_renew(struct sbx_ctx *c)
{
    int status;
    kill(maker.pid, SIGKILL);
    while (waitpid(maker.pid, &status, 0) < 0 && errno == EINTR)
        ;
    close(maker.sock);
    if (make_maker(c) < 0)
        _exit(125);
}

int tpl_maker_alone(void)
{
    char now[sizeof maker.listed];
    ssize_t n = pread(maker.children, now, sizeof now, 0);
    return maker.listed_len && n == (ssize_t)maker.listed_len && memcmp(now, maker.listed, (size_t)n) == 0;
}

int tpl_maker_next(struct sbx_ctx *c, pid_t *pid)
{
    int sp[2];
    /* undo a stop a command left it in (its SIGCONT, blocked, is dropped with the rest) */
    if (kill(maker.pid, SIGCONT) < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
        _exit(125);
    if (sbx_send_fds(maker.sock, "g", 1, &sp[1], 1) < 0)
        _exit(125);
    close(sp[1]);
    /* Woken once, not twice: the child's word comes just before its exec,
     * and its end of the pair closes at the exec (close-on-exec) or at its
     * death; a poll for the hang-up alone sleeps through the word (the
     * kernel's wake-up for data is keyed EPOLLIN, which it filters out). */
    struct pollfd hup = {.fd = sp[0], .events = POLLRDHUP};
    while (poll(&hup, 1, -1) < 0 && errno == EINTR)
        ;
    struct made_word w;
    int report = -1, n_fds;
    ssize_t n = sbx_recv_fds(sp[0], &w, sizeof w, &report, 1, &n_fds, NULL);
    if (n != sizeof w && n_fds)
        close(report);
    if (n != sizeof w || !n_fds) { /* it failed (and reported on the request's socket), or found the caller gone */
        close(sp[0]);
        return -1;
    }
    struct exec_failure f;
    while ((n = read(sp[0], &f, sizeof f)) < 0 && errno == EINTR)
        ;
    close(sp[0]);
    sbx_stamp(c, SBX_T_RETURN);
    w.started.t_ns[SBX_T_RETURN] = c->res->t_ns[SBX_T_RETURN];
    *pid = w.pid;
    if (n == sizeof f) { /* its exec failed: reported here */
        int status;
        waitpid(w.pid, &status, 0);
        sbx_report_fd(report, f.step, -1, f.err, SBX_D_NONE);
        close(report);
        return -2;
    }
    int fds[1] = {maker.self_pidfd};
    if (n != 0 || sbx_send_fds(report, &w.started, sizeof w.started, fds, 1) < 0) {
        kill(w.pid, SIGKILL);
        _exit(125);
    }
    return report;
}
