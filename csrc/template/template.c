/* template.c: sandbox-template, the resident process of a sandbox.Template.
 *
 *     sandbox-template SOCK_FD FAST_FD PROC_FD HOST_TREE_FD
 *
 * The native core starts it (SBX_OPT_EXEC_FD) as pid 1 of a pid namespace
 * of its own, inside the root it prepared: the mount tree with its binds,
 * /dev, and its own procfs, uncovered, wherever the Spec has a Proc (a fresh
 * proc may be mounted in a user namespace only where a fully visible one
 * already is). It holds no seccomp filter (its children create user
 * namespaces) and no capability but CAP_SYS_ADMIN over its own user
 * namespace (or the pool's, whose network namespaces it joins), and
 * CAP_SETFCAP as uid 0. PROC_FD is the caller's procfs root (the children
 * write their id maps through it); HOST_TREE_FD (SBX_OPT_HOST_TREE) a
 * detached clone of the host's mount tree, made in this mount namespace
 * before its root was pivoted away: per-call binds are cloned from it here,
 * where this process may clone trees (the caller, unprivileged, may not in
 * its own mount namespace), and only the declared subtree reaches a sandbox.
 *
 * Requests (struct sbx_request, csrc/core/sandbox.h) on FAST_FD are taken by
 * standby sandboxes, cloned and set up ahead of them (csrc/template/standby.c); the
 * server keeps N_STANDBY of them, and serves FAST_FD itself only if a
 * standby cannot be made. Per request on SOCK_FD it clones a
 * sandbox fork-style (no CLONE_VM: its page tables are tiny, and the
 * sandbox stays resident on its own copy, csrc/template/resident.c) with the
 * per-sandbox plan's namespace flags, into a leased network namespace when
 * one comes with the request (setns before the clone, back after). The
 * child runs the native child's step sequence (csrc/core/child.c) on the copy of
 * the prepared root its mount namespace starts with and reports on the
 * request's report socket; the server sends nothing unless it fails before
 * the sandbox exists, and never waits for it. Being pid 1, it reaps every
 * sandbox, and writes the wait status of those without a reaper (as_pid_1)
 * to their status pipe. When the caller's end of the socket closes, it
 * exits, and the kernel kills every process of its pid namespace: every
 * sandbox it made. (The other files of sandbox-template: template.h.)
 */
#include "template.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

struct clone3_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

static int parse_fd(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && !*end && v >= 0 && v < 65536) ? (int)v : -1;
}

/* SBX_REQ_STORE_BLOB (argc 0, one fd: its report socket): keep the blob
 * (with SBX_REQ_RECYCLE, as the reset blob: the standbys to come are
 * recycled, csrc/template/template_recycle.c);
 * with SBX_REQ_STANDBY, start the standbys and answer once one is ready;
 * with SBX_REQ_JOIN_NETNS as well, N_STANDBY leases follow the report
 * socket, one for each standby (leases mode); with n_cgroup k, N_STANDBY
 * sets of k cgroup entry fds after them, one for each standby (cgroup mode). */
static void store(struct tpl_server *s, size_t len, const int *fds, int nfds)
{
    const struct sbx_request *r = (const void *)s->msg;
    int err = EINVAL;
    if (sbx_check_store(s->msg, len, nfds) == 0) { /* wire.c */
        char *copy = malloc(r->blob_len);
        char **into = (r->flags & SBX_REQ_RECYCLE_NET_KEPT) ? &s->reset_kept_blob
                      : (r->flags & SBX_REQ_RECYCLE)        ? &s->reset_blob
                                                            : &s->stored_blob;
        err = copy ? 0 : ENOMEM;
        if (copy) {
            memcpy(copy, s->msg + sizeof *r, r->blob_len);
            free(*into);
            *into = copy;
        }
    }
    if (!err && (r->flags & SBX_REQ_STANDBY) && s->store_report < 0) {
        int leases = (r->flags & SBX_REQ_JOIN_NETNS) ? N_STANDBY : 0;
        start_standbys(s, fds[0], leases != 0, fds + 1, leases, fds + 1 + leases, (int)r->n_cgroup);
        return;
    }
    if (nfds > 0)
        sbx_report_fd(fds[0], err ? SBX_STEP_CONFIG : SBX_STEP_NONE, -1, err, SBX_D_NONE);
}

/* The child, in its new namespaces: its cgroups first (every process it
 * makes is born inside; their fds closed), then drop what is the server's alone. Its
 * signal dispositions are the server's, all default (main), and every
 * signal is blocked; a sandbox plan never asks for a parent-death signal
 * (the server's death ends it): nothing of sbx_child_start is left to do. */
static void template_start(struct sbx_ctx *c)
{
    sbx_stamp(c, SBX_T_CHILD);
    tpl_enter_cgroups(c);
    tpl_close_server_fds(TPL_SANDBOX(c)->srv, 0);
}

/* A sandbox the server clones for a request: its id maps go through the
 * server's procfs (in.proc_dir); it stays resident as its pid 1 when the
 * plan has a reaper, and tells its caller it runs with a message on the
 * report socket. */
const struct sbx_mode SBX_MODE_TEMPLATE = {
    .name = "template",
    .start = template_start,
    .fd_table = sbx_command_fds,
    .stay_resident = sbx_resident_reaper,
    .report_started = sbx_send_started,
    .run = sbx_exec_command,
};

/* Clone the sandbox; its pid, or -1 with errno, *step and *op. */
static pid_t clone_sandbox(struct tpl_server *s, struct request *q, size_t len, int *step, int *op)
{
    const struct sbx_header *h = (const void *)q->blob;
    int reaper = (h->opts & SBX_OPT_REAPER) != 0;
    int *binds = malloc((h->n_ops + 1) * sizeof *binds);
    int *src_fds = malloc((h->n_ops + 1) * sizeof *src_fds);
    int *pass = malloc((q->r->n_pass + 1) * sizeof *pass);
    char **sh_argv = malloc((q->r->argc + 2) * sizeof *sh_argv);
    int n_binds = 0;
    pid_t pid = -1;
    *step = SBX_STEP_PIPE;
    *op = -1;
    if (!binds || !src_fds || !pass || !sh_argv) {
        errno = ENOMEM;
        goto out;
    }
    *step = SBX_STEP_SOURCE;
    if ((n_binds = clone_binds(s, q->blob, binds, op)) < 0)
        goto out;
    *op = -1;
    int nulls[MAX_NULL_TREES], n_nulls = make_null_trees(s, q->blob, nulls);
    memcpy(pass, q->pass, q->r->n_pass * sizeof *pass);
    struct sbx_input in = SBX_INPUT_NONE;
    request_input(&in, q, pass);
    in.src_fds = src_fds;
    in.sh_argv = sh_argv;
    in.bind_fds = binds;
    in.null_trees = nulls;
    in.n_null_trees = n_nulls;
    in.proc_dir = s->proc_dir;
    in.lease_fd = q->netns;
    in.scrub = s->msg;
    in.scrub_len = len;
    struct tpl_sandbox t = {.srv = s, .slot = -1};
    sbx_ctx_init(&t.c, &SBX_MODE_TEMPLATE, &in, &t.res);
    *step = SBX_STEP_JOIN_NETNS;
    if (q->netns >= 0 && setns(q->netns, CLONE_NEWNET) < 0)
        goto out;
    struct clone3_args args = {.flags = sbx_clone_flags(h->ns), .exit_signal = SIGCHLD};
    sbx_stamp(&t.c, SBX_T_START);
    pid = (pid_t)syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) {
        sbx_child_steps(&t.c);
        _exit(125); /* not reached: it execs or fails */
    }
    int saved = errno;
    /* Back to our own network namespace; staying in a lease would hand it
     * to the next sandbox. */
    if (q->netns >= 0 && setns(s->own_netns, CLONE_NEWNET) < 0)
        _exit(125);
    errno = saved;
    *step = SBX_STEP_CLONE;
    if (pid > 0 && !reaper) {
        if (add_waiter(s, pid, q->status) < 0) {
            kill(pid, SIGKILL);
            errno = ENOMEM;
            pid = -1;
            goto out;
        }
        for (int k = 0; k < q->nfds; k++) /* the waiter owns it now */
            if (q->fds[k] == q->status)
                q->fds[k] = -1;
    }
    close_all(nulls, n_nulls);
out:
    while (n_binds > 0)
        close(binds[--n_binds]);
    free(binds);
    free(src_fds);
    free(pass);
    free(sh_argv);
    return pid;
}

/* Serve one request from `fd` (the server's socket, or the standbys' when
 * none can be made). */
static void serve_one(struct tpl_server *s, int fd)
{
    int fds[MAX_FDS], nfds;
    ssize_t n = receive_request(s, fd, fds, &nfds);
    if (n == 0)
        _exit(0); /* the caller has gone: every sandbox goes with us */
    const struct sbx_request *r = (const void *)s->msg;
    int step = SBX_STEP_CONFIG, op = -1, err = n == -2 ? EMSGSIZE : EINVAL;
    struct request q = {.fds = fds, .nfds = nfds, .report = nfds > 0 ? fds[0] : -1, .status = -1, .netns = -1};
    if (n >= (ssize_t)sizeof *r && r->argc == 0 && (r->flags & SBX_REQ_STORE_BLOB)) {
        store(s, (size_t)n, fds, nfds);
        err = 0;
    } else if (n > 0 && parse_request(s, &q, (size_t)n) == 0) {
        int next[SBX_REQ_MAX_CGROUP];
        /* Cgroup mode, a request with its own cgroups and one more set: that set, for a standby to
         * come (one with only the set enters it: a sandbox of the Spec's limits). */
        if (q.n_cgroup > s->cgroup_k && tpl_next_cgroup_set(s, &q, next) == 0)
            add_cgroup_set(s, next, s->cgroup_k);
        err = clone_sandbox(s, &q, (size_t)n, &step, &op) < 0 ? errno : 0;
    }
    if (err && q.report >= 0) {
        /* with the lease that came with it: the caller releases it */
        struct sbx_report rep = {step, op, err, step == SBX_STEP_SOURCE ? SBX_D_SOURCE : SBX_D_NONE};
        sbx_send_fds(q.report, &rep, sizeof rep, &q.netns, 1);
    }
    free(q.argv);
    free(q.envp);
    for (int k = 0; k < nfds; k++)
        if (fds[k] >= 0)
            close(fds[k]);
    /* What the next sandbox copies of this memory is its own request alone. */
    if (n > 0)
        memset(s->msg, 0, (size_t)n);
    forget_big_request(s);
}

/* The server's own fds and signals; 0, or -1. */
static int open_server(struct tpl_server *s, char **argv)
{
    int notes[2];
    s->sig_fd = s->own_netns = -1;
    s->null_master = -2;
    s->store_report = -1;
    if ((s->sock_fd = parse_fd(argv[1])) < 0 || (s->fast_fd = parse_fd(argv[2])) < 0 ||
        (s->proc_dir = parse_fd(argv[3])) < 0 || (s->host_tree = parse_fd(argv[4])) < 0)
        return -1;
    for (int k = 1; k <= 4; k++)
        fcntl(parse_fd(argv[k]), F_SETFD, FD_CLOEXEC);
    sigset_t all, chld;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    /* Whatever was ignored across the exec: every sandbox starts from default dispositions. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaction(sig, &dfl, NULL);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    s->sig_fd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    s->own_netns = openat(s->proc_dir, "thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (s->sig_fd < 0 || s->own_netns < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, notes) < 0)
        return -1;
    /* Shared with the standbys (inherited across their fork-style clone):
     * each marks its slot there the moment it takes a request, without a
     * message, so that one killed before it could say so is not taken for
     * a standby that crashed. */
    s->standby_taken = mmap(NULL, (N_SLOTS + 1) * sizeof *s->standby_taken, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s->standby_taken == MAP_FAILED)
        return -1;
    s->serving = s->standby_taken + N_SLOTS;
    s->notify_rd = notes[0];
    s->notify_wr = notes[1];
    return 0;
}

int main(int argc, char **argv)
{
    /* static: its request buffer is large; zero, so no standby is made yet */
    static struct tpl_server server;
    struct tpl_server *s = &server;
    s->msg = s->msg_buf;
    if (argc != 5 || open_server(s, argv) < 0)
        return 125;
    for (;;) {
        make_standbys(s);
        int serve_fast = serving_fast(s);
        struct pollfd p[4] = {{s->sock_fd, POLLIN, 0}, {s->sig_fd, POLLIN, 0}, {s->notify_rd, POLLIN, 0},
                              {s->fast_fd, serve_fast ? POLLIN : 0, 0}};
        if (poll(p, 4, next_replacement(s)) < 0)
            continue;
        if (p[2].revents)
            read_notes(s);
        if (p[1].revents) {
            struct signalfd_siginfo info;
            while (read(s->sig_fd, &info, sizeof info) > 0)
                ;
            reap(s);
        }
        if (p[0].revents & POLLIN)
            serve_one(s, s->sock_fd);
        else if (p[0].revents & (POLLHUP | POLLERR))
            _exit(0);
        if (serve_fast && (p[3].revents & POLLIN))
            serve_one(s, s->fast_fd);
    }
}
