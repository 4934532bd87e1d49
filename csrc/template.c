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
 * Requests (struct sbx_request, csrc/sandbox.h) on FAST_FD are taken by
 * standby sandboxes, cloned and set up ahead of them (csrc/standby.c); the
 * server keeps N_STANDBY of them, and serves FAST_FD itself only if a
 * standby cannot be made. Per request on SOCK_FD it clones a
 * sandbox fork-style (no CLONE_VM: its page tables are tiny, and the
 * sandbox stays resident on its own copy, csrc/resident.c) with the
 * per-sandbox plan's namespace flags, into a leased network namespace when
 * one comes with the request (setns before the clone, back after). The
 * child runs the native child's step sequence (csrc/child.c) on the copy of
 * the prepared root its mount namespace starts with and reports on the
 * request's report socket; the server sends nothing unless it fails before
 * the sandbox exists, and never waits for it. Being pid 1, it reaps every
 * sandbox, and writes the wait status of those without a reaper (as_pid_1)
 * to their status pipe. When the caller's end of the socket closes, it
 * exits, and the kernel kills every process of its pid namespace: every
 * sandbox it made.
 */
#include "template.h"

#include <errno.h>
#include <linux/mount.h>
#include <linux/openat2.h>
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
#include <sys/wait.h>
#include <unistd.h>

struct clone3_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

struct waiter {
    pid_t pid;
    int status_fd;
};

int sock_fd, fast_fd, notify_rd, notify_wr, proc_dir, host_tree, sig_fd = -1, own_netns = -1, null_master = -2;
char msg[MAX_MSG] __attribute__((aligned(8)));
char *stored_blob;
volatile int *standby_taken;
static struct waiter *waiters;
static size_t n_waiters, cap_waiters;
/* The standbys: pid 0, to be made; taken: its request is being set up, and
 * its replacement waits until its command runs (or it ends), so that the
 * replacement's setup does not compete with it for the CPU. Once it runs,
 * the replacement waits longer (replace_at) while another standby is
 * ready: until the sandbox ends or REPLACE_DELAY_NS have passed. A short
 * command's sandbox is then torn down before the next one is built, and
 * building it does not compete with the command, its caller and the
 * teardown for the CPU. */
static struct {
    pid_t pid;
    int taken;
    int64_t replace_at; /* the sandbox it became runs: replace it from then on (0: not yet) */
} standby[N_STANDBY];
#define REPLACE_DELAY_NS 3000000
static int standby_on;            /* making standbys: asked for, and none has failed */
/* Leases mode (the stored plan's sandboxes lease their network namespace):
 * each standby joins one ahead, handed in by the caller (N_STANDBY with the
 * store request, then one with every request), so no request waits for a
 * join; a request the server serves itself joins the one it brings. */
static int leases_mode;
static int leases[2 * N_STANDBY]; /* ... those not in a standby yet */
static int n_leases;
static int store_report = -1;     /* the store request's report socket, until the first standby is ready */

static int parse_fd(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && !*end && v >= 0 && v < 65536) ? (int)v : -1;
}

static int add_waiter(pid_t pid, int status_fd)
{
    if (n_waiters == cap_waiters) {
        size_t cap = cap_waiters ? 2 * cap_waiters : 16;
        struct waiter *w = realloc(waiters, cap * sizeof *w);
        if (!w)
            return -1;
        waiters = w;
        cap_waiters = cap;
    }
    waiters[n_waiters++] = (struct waiter){pid, status_fd};
    return 0;
}

/* n NUL-terminated strings starting at *p (bounded by end) into a NULL-terminated array. */
static char **strings(const char **p, const char *end, uint32_t n)
{
    char **out = malloc((n + 1) * sizeof *out);
    if (!out)
        return NULL;
    for (uint32_t k = 0; k < n; k++) {
        const char *nul = *p < end ? memchr(*p, 0, (size_t)(end - *p)) : NULL;
        if (!nul) {
            free(out);
            return NULL;
        }
        out[k] = (char *)*p;
        *p = nul + 1;
    }
    out[n] = NULL;
    return out;
}

/* The request's blob: its own (checked) or, blob_len 0, the stored one. */
static const char *request_blob(const struct sbx_request *r, size_t len)
{
    if (r->blob_len == 0)
        return stored_blob;
    const char *blob = msg + sizeof *r;
    if (r->blob_len > len - sizeof *r || sbx_check_blob(blob, r->blob_len) < 0)
        return NULL;
    return blob;
}

int parse_request(struct request *q, size_t len)
{
    const struct sbx_request *r = (const void *)msg;
    q->r = r;
    if (len < sizeof *r || r->magic != SBX_REQ_MAGIC || r->argc == 0 || r->n_pass > MAX_FDS)
        return -1;
    size_t blob_end = sizeof *r + ((r->blob_len + 7u) & ~7u);
    q->blob = request_blob(r, len);
    if (!q->blob || blob_end + 4ull * r->n_pass > len)
        return -1;
    const struct sbx_header *h = (const void *)q->blob;
    if (h->n_listen)
        return -1;
    q->targets = (const void *)(msg + blob_end);
    const char *p = msg + blob_end + 4 * r->n_pass, *end = msg + len;
    q->argv = strings(&p, end, r->argc);
    q->envp = q->argv ? strings(&p, end, r->envc) : NULL;
    if (!q->envp)
        return -1;
    int with_status = !(h->opts & SBX_OPT_REAPER), join = (r->flags & SBX_REQ_JOIN_NETNS) != 0;
    int at = 1 + with_status + join;
    int want = at + __builtin_popcount(r->stdio_mask & 7) + (int)r->n_pass;
    if (q->nfds != want)
        return -1;
    q->status = with_status ? q->fds[1] : -1;
    q->netns = join ? q->fds[1 + with_status] : -1;
    for (int i = 0; i < 3; i++)
        q->stdio[i] = (r->stdio_mask & (1u << i)) ? q->fds[at++] : -1;
    q->pass = q->fds + at;
    return 0;
}

/* Keep a lease for a standby to come. The caller sends one per standby and
 * one per request, and every standby made takes one, so the queue stays
 * short; a lease beyond its room is closed (the caller releases every lease
 * it sent and never saw reported when the template ends). */
static void add_lease(int fd)
{
    if (fd < 0)
        return;
    if (n_leases < (int)(sizeof leases / sizeof *leases))
        leases[n_leases++] = fd;
    else
        close(fd);
}

/* SBX_REQ_STORE_BLOB (argc 0, one fd: its report socket): keep the blob;
 * with SBX_REQ_STANDBY, start the standbys and answer once one is ready;
 * with SBX_REQ_JOIN_NETNS as well, N_STANDBY leases follow the report
 * socket, one for each standby (leases mode). */
static void store(size_t len, const int *fds, int nfds)
{
    const struct sbx_request *r = (const void *)msg;
    int err = EINVAL;
    int want_fds = 1 + ((r->flags & SBX_REQ_STANDBY) && (r->flags & SBX_REQ_JOIN_NETNS) ? N_STANDBY : 0);
    if (len >= sizeof *r && r->magic == SBX_REQ_MAGIC && r->blob_len && r->blob_len <= len - sizeof *r &&
        sbx_check_blob(msg + sizeof *r, r->blob_len) == 0 && nfds == want_fds) {
        char *copy = malloc(r->blob_len);
        err = copy ? 0 : ENOMEM;
        if (copy) {
            memcpy(copy, msg + sizeof *r, r->blob_len);
            free(stored_blob);
            stored_blob = copy;
        }
    }
    if (!err && (r->flags & SBX_REQ_STANDBY) && store_report < 0) {
        standby_on = 1;
        leases_mode = (r->flags & SBX_REQ_JOIN_NETNS) != 0;
        for (int k = 1; leases_mode && k < nfds; k++)
            add_lease(fcntl(fds[k], F_DUPFD_CLOEXEC, 3));
        store_report = fcntl(fds[0], F_DUPFD_CLOEXEC, 3);
        return;
    }
    if (nfds > 0)
        sbx_report_fd(fds[0], err ? SBX_STEP_CONFIG : SBX_STEP_NONE, -1, err, SBX_D_NONE);
}

/* One detached read-only clone of the host's /dev/null. The first is kept
 * (null_master) and the rest are cloned from it: one open_tree each, its
 * mount flags copied, instead of a path walk, a clone and a mount_setattr.
 * A kernel that cannot clone a detached mount (before 6.15) gets the walk. */
static int null_tree(void)
{
    const uint32_t flags = SBX_F_RDONLY | SBX_F_NODEV | SBX_F_NOSUID;
    if (null_master == -2)
        null_master = sbx_clone_tree_at(host_tree, "/dev/null", flags);
    if (null_master >= 0) {
        int tree = sbx_open_tree(null_master, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
        if (tree >= 0)
            return tree;
        close(null_master);
        null_master = -1;
    }
    return sbx_clone_tree_at(host_tree, "/dev/null", flags);
}

/* Whether /proc has `path` on this kernel (the caller's procfs: entries
 * outside sys/net are the same in every instance). A mask whose entry is
 * absent gets no tree: the last close of an unattached tree unmounts it,
 * and every such unmount waits for an expedited RCU grace period. */
static int proc_has(const char *path)
{
    int fd = sbx_openat2(proc_dir, path, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS);
    if (fd < 0)
        return errno != ENOENT;
    close(fd);
    return 1;
}

/* How many trees a mask entry needs: none if its entry is absent (one
 * below sys/net always: the sandbox's network namespace may have what the
 * caller's lacks). */
static int trees_for(const char *entry)
{
    if (entry[0] != 'm')
        return 0;
    return strncmp(entry + 1, "sys/net/", 8) == 0 || proc_has(entry + 1);
}

int make_null_trees(const char *blob, int *out)
{
    const struct sbx_header *h = (const void *)blob;
    const struct sbx_op *ops = (const void *)(blob + h->ops_off);
    int n = 0;
    for (uint32_t i = 0; i < h->n_ops; i++) {
        if (ops[i].kind != SBX_OP_PROC)
            continue;
        for (uint32_t k = 0; k < ops[i].data_len; k += (uint32_t)strlen(blob + ops[i].data + k) + 1) {
            for (int want = trees_for(blob + ops[i].data + k); want > 0 && n < MAX_NULL_TREES; want--, n++) {
                out[n] = null_tree();
                if (out[n] < 0) {
                    close_all(out, n);
                    return 0;
                }
            }
        }
    }
    return n;
}

void request_input(struct sbx_input *in, const struct request *q, const int *pass)
{
    in->blob = q->blob;
    in->argv = q->argv;
    in->envp = q->envp;
    for (int i = 0; i < 3; i++)
        in->stdio[i] = q->stdio[i];
    in->pass_fds = pass;
    in->n_pass = (int)q->r->n_pass;
    in->fd_targets = q->targets;
    in->err_fd = q->report;
}

void close_all(int *fds, int n)
{
    for (int k = 0; k < n; k++)
        close(fds[k]);
}

/* Clone the sources of the blob's per-call binds (SBX_F_FROM_FD), in op
 * order, from the host tree into out[]; how many, or -1 with *op/errno. */
static int clone_binds(const struct sbx_header *h, const char *blob, int *out, int *op)
{
    const struct sbx_op *ops = (const void *)(blob + h->ops_off);
    int n = 0;
    for (uint32_t i = 0; i < h->n_ops; i++) {
        if (ops[i].kind != SBX_OP_BIND || !(ops[i].flags & SBX_F_FROM_FD))
            continue;
        out[n] = sbx_clone_tree_at(host_tree, blob + ops[i].src, ops[i].flags);
        if (out[n] < 0) {
            int err = errno;
            while (n > 0)
                close(out[--n]);
            *op = (int)i;
            errno = err;
            return -1;
        }
        n++;
    }
    return n;
}

/* The child, in its new namespaces: drop what is the server's alone. Its
 * signal dispositions are the server's, all default (main), and every
 * signal is blocked; a sandbox plan never asks for a parent-death signal
 * (the server's death ends it): nothing of sbx_child_start is left to do. */
static void template_start(struct sbx_ctx *c)
{
    sbx_stamp(c, SBX_T_CHILD);
    close(sock_fd);
    close(fast_fd);
    close(notify_rd);
    close(notify_wr);
    close(sig_fd);
    close(own_netns);
    close(host_tree);
    if (null_master >= 0)
        close(null_master);
}

/* A sandbox the server clones for a request: its id maps go through the
 * server's procfs (in.proc_dir); it stays resident as its pid 1 when the
 * plan has a reaper, and tells its caller it runs with a message on the
 * report socket. */
const struct sbx_mode SBX_MODE_TEMPLATE = {
    .name = "template",
    .start = template_start,
    .take_request = sbx_no_step,
    .fd_table = sbx_command_fds,
    .stay_resident = sbx_resident_reaper,
    .on_running = sbx_no_step,
    .report_started = sbx_send_started,
    .run = sbx_exec_command,
};

/* Clone the sandbox; its pid, or -1 with errno, *step and *op. */
static pid_t clone_sandbox(struct request *q, size_t len, int *step, int *op)
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
    if ((n_binds = clone_binds(h, q->blob, binds, op)) < 0)
        goto out;
    *op = -1;
    int nulls[MAX_NULL_TREES], n_nulls = make_null_trees(q->blob, nulls);
    memcpy(pass, q->pass, q->r->n_pass * sizeof *pass);
    struct sbx_result res;
    memset(&res, 0, sizeof res);
    struct sbx_input in = SBX_INPUT_NONE;
    request_input(&in, q, pass);
    in.src_fds = src_fds;
    in.sh_argv = sh_argv;
    in.bind_fds = binds;
    in.null_trees = nulls;
    in.n_null_trees = n_nulls;
    in.proc_dir = proc_dir;
    in.lease_fd = q->netns;
    in.scrub = msg;
    in.scrub_len = len;
    struct sbx_ctx c;
    sbx_ctx_init(&c, &SBX_MODE_TEMPLATE, &in, &res);
    *step = SBX_STEP_JOIN_NETNS;
    if (q->netns >= 0 && setns(q->netns, CLONE_NEWNET) < 0)
        goto out;
    struct clone3_args args = {.flags = sbx_clone_flags(h->ns), .exit_signal = SIGCHLD};
    sbx_stamp(&c, SBX_T_START);
    pid = (pid_t)syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) {
        sbx_child_steps(&c);
        _exit(125); /* not reached: it execs or fails */
    }
    int saved = errno;
    /* Back to our own network namespace; staying in a lease would hand it
     * to the next sandbox. */
    if (q->netns >= 0 && setns(own_netns, CLONE_NEWNET) < 0)
        _exit(125);
    errno = saved;
    *step = SBX_STEP_CLONE;
    if (pid > 0 && !reaper) {
        if (add_waiter(pid, q->status) < 0) {
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

ssize_t receive_request(int fd, int *fds, int *nfds)
{
    static char control[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct iovec iov = {.iov_base = msg, .iov_len = sizeof msg};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
    ssize_t n;
    while ((n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
        ;
    *nfds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        memcpy(fds + *nfds, CMSG_DATA(cm), (size_t)k * sizeof(int));
        *nfds += k;
    }
    if (n > 0 && (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
        return -2; /* too large: refused */
    return n;
}

/* Serve one request from `fd` (the server's socket, or the standbys' when
 * none can be made). */
static void serve_one(int fd)
{
    int fds[MAX_FDS], nfds;
    ssize_t n = receive_request(fd, fds, &nfds);
    if (n == 0)
        _exit(0); /* the caller has gone: every sandbox goes with us */
    const struct sbx_request *r = (const void *)msg;
    int step = SBX_STEP_CONFIG, op = -1, err = n == -2 ? EMSGSIZE : EINVAL;
    struct request q = {.fds = fds, .nfds = nfds, .report = nfds > 0 ? fds[0] : -1, .status = -1, .netns = -1};
    if (n >= (ssize_t)sizeof *r && r->argc == 0 && (r->flags & SBX_REQ_STORE_BLOB)) {
        store((size_t)n, fds, nfds);
        err = 0;
    } else if (n > 0 && parse_request(&q, (size_t)n) == 0) {
        err = clone_sandbox(&q, (size_t)n, &step, &op) < 0 ? errno : 0;
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
        memset(msg, 0, (size_t)n);
}

/* Answer the store request, once: its standbys work (err 0) or why not. */
static void answer_store(int step, int op, int err)
{
    if (store_report < 0)
        return;
    sbx_report_fd(store_report, step, op, err, SBX_D_NONE);
    close(store_report);
    store_report = -1;
}

/* No more standbys (one failed to set up): the server serves their socket. */
static void standby_failed(int step, int op, int err)
{
    standby_on = 0;
    answer_store(step, op, err ? err : EIO);
}

/* Messages from standbys: ready, taken (with an as_pid_1 sandbox's status
 * fd), or a 16-byte report of why one failed before any request. */
static void read_notes(void)
{
    for (;;) {
        union {
            struct standby_note note;
            struct sbx_report failure;
        } m;
        char control[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {.iov_base = &m, .iov_len = sizeof m};
        struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
        ssize_t n = recvmsg(notify_rd, &h, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        int fd = -1;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&h);
        if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(cm), sizeof fd);
        if (n == sizeof m.failure) {
            standby_failed(m.failure.step, m.failure.op, m.failure.err);
            if (leases_mode)
                add_lease(fd); /* its lease, unused */
            fd = -1;
        } else if (n == sizeof m.note && m.note.kind == NOTE_LEASE) {
            if (leases_mode)
                add_lease(fd);
            fd = -1;
        } else if (n == sizeof m.note && m.note.slot >= 0 && m.note.slot < N_STANDBY) {
            pid_t pid = standby[m.note.slot].pid;
            if (m.note.kind == NOTE_READY) {
                answer_store(SBX_STEP_NONE, -1, 0);
            } else if (m.note.kind == NOTE_TAKEN) {
                standby[m.note.slot].taken = 1;
                if (fd >= 0 && add_waiter(pid, fd) == 0)
                    fd = -1;
                if (!(((const struct sbx_header *)stored_blob)->opts & SBX_OPT_REAPER))
                    standby[m.note.slot].pid = 0; /* as_pid_1: no word comes once it runs */
            } else if (m.note.kind == NOTE_RUNNING) {
                standby[m.note.slot].replace_at = sbx_now_ns() + REPLACE_DELAY_NS;
            }
        }
        if (fd >= 0)
            close(fd);
    }
}

/* Reap every ended child: write the status of those that have a waiter;
 * free the slot of a standby that ended. */
static void reap(void)
{
    int status;
    pid_t pid;
    read_notes(); /* a taken standby said so before it could end */
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int k = 0; k < N_STANDBY; k++) {
            if (standby[k].pid != pid)
                continue;
            /* A standby that fails to set up says why (a note) before it
             * exits; one that exits otherwise took a request (a sandbox
             * that ended before its command ran). One killed by a signal
             * has crashed. */
            read_notes();
            if (standby[k].pid == pid && !standby[k].taken && !standby_taken[k] && WIFSIGNALED(status))
                standby_failed(SBX_STEP_CRASHED, -1, WTERMSIG(status));
            if (standby[k].pid == pid)
                standby[k].pid = 0;
        }
        for (size_t k = 0; k < n_waiters; k++) {
            if (waiters[k].pid != pid)
                continue;
            sbx_write_all(waiters[k].status_fd, &status, sizeof status);
            close(waiters[k].status_fd);
            waiters[k] = waiters[--n_waiters];
            break;
        }
    }
}

/* A standby waiting for a request (set up, not taken). */
static int ready(int k)
{
    return standby[k].pid && !standby[k].taken && !standby[k].replace_at && !standby_taken[k];
}

/* Whether slot k needs a new standby now. */
static int to_replace(int k, int64_t now)
{
    if (!standby[k].pid)
        return 1;
    if (!standby[k].replace_at)
        return 0;
    for (int j = 0; j < N_STANDBY; j++)
        if (j != k && ready(j))
            return now >= standby[k].replace_at;
    return 1;
}

/* Milliseconds until the next deferred replacement is due (-1: none). */
static int next_replacement(void)
{
    int64_t first = 0, now = sbx_now_ns();
    for (int k = 0; k < N_STANDBY; k++)
        if (standby[k].pid && standby[k].replace_at && (!first || standby[k].replace_at < first))
            first = standby[k].replace_at;
    if (!standby_on || !first)
        return -1;
    return first <= now ? 0 : (int)((first - now + 999999) / 1000000);
}

/* Whether the server takes the standbys' requests itself: none is made
 * or being made (none can be, or none has a lease), so none would read them. */
static int serving_fast(void)
{
    if (!standby_on)
        return 1;
    for (int k = 0; k < N_STANDBY; k++)
        if (ready(k))
            return 0;
    return 1;
}

static void make_standbys(void)
{
    int64_t now = sbx_now_ns();
    for (int k = 0; standby_on && k < N_STANDBY; k++) {
        if (!to_replace(k, now))
            continue;
        if (leases_mode && n_leases == 0)
            continue; /* none to join: requests meanwhile are the server's */
        int lease = leases_mode ? leases[--n_leases] : -1;
        standby[k].taken = 0;
        standby[k].replace_at = 0;
        standby_taken[k] = 0;
        standby[k].pid = make_standby(k, lease);
        if (standby[k].pid < 0) {
            standby[k].pid = 0;
            add_lease(lease);
            standby_failed(SBX_STEP_CLONE, -1, errno);
        } else if (lease >= 0) {
            close(lease); /* the standby has its own copy */
        }
    }
}

int main(int argc, char **argv)
{
    int notes[2];
    if (argc != 5 || (sock_fd = parse_fd(argv[1])) < 0 || (fast_fd = parse_fd(argv[2])) < 0 ||
        (proc_dir = parse_fd(argv[3])) < 0 || (host_tree = parse_fd(argv[4])) < 0)
        return 125;
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
    sig_fd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    own_netns = openat(proc_dir, "thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (sig_fd < 0 || own_netns < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, notes) < 0)
        return 125;
    /* Shared with the standbys (inherited across their fork-style clone):
     * each marks its slot there the moment it takes a request, without a
     * message, so that one killed before it could say so is not taken for
     * a standby that crashed. */
    standby_taken = mmap(NULL, N_STANDBY * sizeof *standby_taken, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                         -1, 0);
    if (standby_taken == MAP_FAILED)
        return 125;
    notify_rd = notes[0];
    notify_wr = notes[1];
    for (;;) {
        make_standbys();
        int serve_fast = serving_fast();
        struct pollfd p[4] = {{sock_fd, POLLIN, 0}, {sig_fd, POLLIN, 0}, {notify_rd, POLLIN, 0},
                              {fast_fd, serve_fast ? POLLIN : 0, 0}};
        if (poll(p, 4, next_replacement()) < 0)
            continue;
        if (p[2].revents)
            read_notes();
        if (p[1].revents) {
            struct signalfd_siginfo info;
            while (read(sig_fd, &info, sizeof info) > 0)
                ;
            reap();
        }
        if (p[0].revents & POLLIN)
            serve_one(sock_fd);
        else if (p[0].revents & (POLLHUP | POLLERR))
            _exit(0);
        if (serve_fast && (p[3].revents & POLLIN))
            serve_one(fast_fd);
    }
}
