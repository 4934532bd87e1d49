/* standby.c: a Template's standby sandboxes, ready before any request.
 *
 * The server keeps N_STANDBY of them. Each is cloned with the default
 * sandbox plan's namespaces but no user namespace; a Template whose
 * sandboxes have cgroup limits hands the server a set of cgroups per
 * standby (cgroup mode), which the standby enters as its very first step;
 * one whose sandboxes lease their network namespace hands the server one
 * lease per standby (leases mode), which the standby joins next. Still
 * holding the server's capabilities over its namespaces, it mounts its fresh proc,
 * tmpfs, shm and devpts, brings up its loopback and sets its hostname
 * (child.c, sbx_child_steps in SBX_MODE_STANDBY). Then, prepared, it joins its user namespace
 * (a child of the server's, made ahead) and takes the command's identity:
 * no capability, no new privileges, its own session, Landlock. It tells the
 * server it is ready and blocks on the request socket the server does not
 * read itself. The kernel hands each request to one waiting standby, which
 * passes the lease that came with the request on to the server (for its
 * replacement), as it does the request's cgroup set (a request with other
 * limits brings cgroups of its own too, which it moves into), and does
 * only what the request decides: cwd, limits, fds, the command. Its
 * report carries its own lease's fd, so the caller knows which lease to
 * release when the sandbox ends (a failure report carries it too, and the
 * caller releases it at once), and its cgroup's tag, so it knows which
 * cgroup is the sandbox's. Requests with per-call binds go
 * to the server instead (it clones their sources from the host tree in its
 * own mount namespace, which the standby has left), as do the fast ones
 * while no standby exists.
 *
 * That the namespaces are owned by the server's user namespace, not the
 * sandbox's own, only takes from the command: it holds no capability over
 * any of them. The caller sends a Template's requests here only when its
 * command keeps no capability (a kept one, CAP_NET_BIND_SERVICE say, would
 * be checked against the namespace's owner).
 */
#include "template.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

struct clone3_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

/* A note to the server on `notify` (its notify socket: the server's number
 * for it until the request's fds are placed, c->keep_fd after that). */
static void note_fds(struct tpl_sandbox *t, int notify, int kind, const int *fds, int n_fds)
{
    struct standby_note n = {kind, t->slot};
    sbx_send_fds(notify, &n, sizeof n, fds, n_fds);
}

static void note(struct tpl_sandbox *t, int notify, int kind, int fd)
{
    note_fds(t, notify, kind, &fd, 1);
}

/* The request must be one of this Template's: its blob differs from the
 * stored one only in what the remaining steps read (environment, cwd,
 * limits), never in what this standby has already built. */
static int compatible(const struct sbx_header *mine, const struct sbx_header *theirs)
{
    return theirs->ns == mine->ns && theirs->n_ops == mine->n_ops && theirs->uid == mine->uid &&
           theirs->gid == mine->gid && theirs->host_uid == mine->host_uid && theirs->host_gid == mine->host_gid &&
           (theirs->opts & (SBX_OPT_REAPER | SBX_OPT_SECCOMP_EARLY)) ==
               (mine->opts & (SBX_OPT_REAPER | SBX_OPT_SECCOMP_EARLY));
}

static void refuse(struct sbx_ctx *c, struct request *q, int err)
{
    if (q->report >= 0) {
        c->in.err_fd = q->report;
        sbx_fail(c, SBX_STEP_CONFIG, -1, err, SBX_D_NONE); /* with the lease, if it has one */
    }
    _exit(125);
}

/* The command runs (the resident reaper says so): time for a replacement. */
static void standby_running(struct sbx_ctx *c)
{
    /* the request's pass_fds may have moved the notify socket off its number (limits.c) */
    note(TPL_SANDBOX(c), c->keep_fd, NOTE_RUNNING, -1);
    close(c->keep_fd);
    c->keep_fd = -1;
}

/* Whether every standby but `slot`'s has taken a request (as far as their marks say). */
static int others_busy(struct tpl_server *s, int slot)
{
    for (int k = 0; k < s->n_standby; k++)
        if (k != slot && __atomic_load_n(&s->standby_taken[k], __ATOMIC_SEQ_CST) != 1)
            return 0;
    return 1;
}

void tpl_take_request(struct sbx_ctx *c, int recycled)
{
    struct tpl_sandbox *t = TPL_SANDBOX(c);
    struct tpl_server *s = t->srv;
    int nfds;
    /* The first word answers the store request. A recycled standby ready
     * again (its mark cleared after its reset) wakes the server only if
     * it reads the standbys' socket meanwhile (serving_fast). */
    if (!t->said_ready || __atomic_load_n(s->serving, __ATOMIC_SEQ_CST))
        note(t, t->srv->notify_wr, NOTE_READY, -1);
    t->said_ready = 1;
    ssize_t n = receive_request(s, s->fast_fd, t->fds, &nfds);
    if (n == 0)
        _exit(0); /* the caller has gone */
    __atomic_store_n(&s->standby_taken[t->slot], 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* A recycled standby is not replaced: a server that saw it ready would
     * not read the requests while it serves this one. It needs the word
     * only when no other standby is ready or being reset. */
    if (recycled && others_busy(s, t->slot))
        note(t, t->srv->notify_wr, NOTE_BUSY, -1);
    t->nfds = nfds;
    if (!recycled)
        close(s->fast_fd);
    struct request q = {.fds = t->fds, .nfds = nfds, .report = nfds > 0 ? t->fds[0] : -1, .status = -1, .netns = -1};
    if (n < 0 || parse_request(s, &q, (size_t)n) < 0)
        refuse(c, &q, n == -2 ? EMSGSIZE : EINVAL);
    int lease = c->in.lease_fd;
    if (q.netns >= 0) {
        /* Already in its lease: the request's is for the standby that replaces this one. */
        note(t, t->srv->notify_wr, NOTE_LEASE, q.netns);
        close(q.netns);
        q.netns = -1;
    }
    int next[SBX_REQ_MAX_CGROUP];
    if (tpl_next_cgroup_set(s, &q, next) == 0) {
        /* In a cgroup of its own already (cgroup mode): the request's last set is for the standby
         * that replaces this one; what comes before it, the request's own (other limits), which
         * await_request enters. */
        note_fds(t, t->srv->notify_wr, NOTE_CGROUP, next, s->cgroup_k);
        close_all(next, s->cgroup_k);
    }
    const struct sbx_header *h = (const void *)q.blob;
    if (!compatible(c->h, h))
        refuse(c, &q, EINVAL);
    if (recycled) {
        /* pid 1 keeps its sockets (close-on-exec: its command child never has them) */
    } else if (sbx_stays_resident(c)) {
        c->keep_fd = s->notify_wr; /* close-on-exec: the command never has it (standby_running closes it) */
    } else { /* as_pid_1: the server writes its status, and replaces it now */
        note(t, t->srv->notify_wr, NOTE_TAKEN, q.status);
        if (q.status >= 0)
            close(q.status);
        close(s->notify_wr);
    }
    /* From here on the request's blob: the same world, its own command
     * side; its reports still carry this standby's lease. */
    struct sbx_input in = SBX_INPUT_NONE;
    request_input(&in, &q, q.pass);
    in.proc_dir = c->in.proc_dir;
    in.lease_fd = lease;
    in.sh_argv = malloc((q.r->argc + 2) * sizeof *in.sh_argv);
    in.scrub = s->msg;
    in.scrub_len = (size_t)n;
    sbx_ctx_take_input(c, &in);
    if (!in.sh_argv)
        sbx_fail(c, SBX_STEP_CONFIG, -1, ENOMEM, SBX_D_NONE);
    memset(c->res->t_ns, 0, sizeof c->res->t_ns);
    sbx_stamp(c, SBX_T_START);
    sbx_stamp(c, SBX_T_CHILD);
    sbx_stamp(c, SBX_T_IDMAP); /* its user namespace was joined before the request */
}

/* Wait for a request and take it (SBX_MODE_STANDBY's take_request). */
static void await_request(struct sbx_ctx *c)
{
    tpl_take_request(c, 0);
    /* Into the request's cgroups (a Template not in cgroup mode) before
     * anything else of it: the command and whatever it forks are born
     * there. A process moving itself is the cheap case (on cgroup v1
     * another's move takes a global lock). */
    tpl_enter_cgroups(c);
}

/* The standby's first moments: its cgroups, then its lease, so that its proc (mounted
 * next) shows that namespace's sys/net; then it drops what is the server's
 * alone (it keeps the standbys' request socket and the notify socket). */
void tpl_standby_start(struct sbx_ctx *c)
{
    /* Its cgroups (cgroup mode) before anything else: every process of the
     * sandbox, this one included, lives there from its first step on. */
    tpl_enter_cgroups(c);
    if (c->in.lease_fd >= 0 && setns(c->in.lease_fd, CLONE_NEWNET) < 0)
        sbx_fail(c, SBX_STEP_JOIN_NETNS, -1, errno, SBX_D_NONE);
    tpl_close_server_fds(TPL_SANDBOX(c)->srv, 1);
}

/* A standby: its world built before any request, its user namespace made
 * ahead by the server (sbx_prepare_userns) and joined, with the command's
 * identity, before it waits; it stays resident as pid 1 with a reaper. */
const struct sbx_mode SBX_MODE_STANDBY = {
    .name = "standby",
    .start = tpl_standby_start,
    .userns_ahead = 1,
    .identity_before_request = 1,
    .take_request = await_request,
    .fd_table = sbx_command_fds,
    .stay_resident = sbx_resident_reaper,
    .on_running = standby_running,
    .report_started = sbx_send_started,
    .run = sbx_exec_command,
};

pid_t make_standby(struct tpl_server *s, int slot, int lease, const int *cgroup)
{
    const struct sbx_header *h = (const void *)s->stored_blob;
    int *src_fds = malloc((h->n_ops + 1) * sizeof *src_fds);
    if (!src_fds)
        return -1;
    int nulls[MAX_NULL_TREES], n_nulls = make_null_trees(s, s->stored_blob, nulls);
    /* Failures before a request go to the server, as a 16-byte report. */
    struct sbx_input in = SBX_INPUT_NONE;
    in.blob = s->stored_blob;
    in.err_fd = s->notify_wr;
    in.src_fds = src_fds;
    in.null_trees = nulls;
    in.n_null_trees = n_nulls;
    in.proc_dir = s->proc_dir;
    in.lease_fd = lease;
    in.cgroup_fds = cgroup;
    in.n_cgroup = cgroup ? s->cgroup_k : 0;
    struct tpl_sandbox t = {.srv = s, .slot = slot};
    sbx_ctx_init(&t.c, s->reset_blob ? &SBX_MODE_RECYCLE : &SBX_MODE_STANDBY, &in, &t.res);
    struct clone3_args args = {.flags = sbx_clone_flags(h->ns) & ~(uint64_t)CLONE_NEWUSER, .exit_signal = SIGCHLD};
    pid_t pid = -1;
    if (sbx_prepare_userns(&t.c) == 0) {
        pid = (pid_t)syscall(SYS_clone3, &args, sizeof args);
        if (pid == 0) {
            sbx_child_steps(&t.c);
            _exit(125); /* not reached: it execs or fails */
        }
    }
    int err = errno;
    if (t.c.userns_fd >= 0)
        close(t.c.userns_fd); /* the standby has its own copies of these */
    close_all(nulls, n_nulls);
    free(src_fds);
    errno = err;
    return pid;
}
