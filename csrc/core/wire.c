/* wire.c: the check of a serialized plan (the blob) before anything trusts
 * it, and of a Template's request messages (struct sbx_request) before its
 * server or a standby reads them.
 *
 * The blob is the boundary between Python and the child: everything the
 * child does between clone and exec reads it, without further checks. So
 * every count, offset and string it holds is checked here, once, before
 * clone: each array lies inside the blob, after the header, aligned for its
 * element type; each string offset points after the header to a string whose
 * NUL is inside the blob.
 */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_SIZE sizeof(struct sbx_header)

/* Offset 0 means "none"; anything else names a NUL-terminated string that
 * starts after the header. */
static int str_ok(const char *blob, size_t len, uint32_t off)
{
    if (off == 0)
        return 1;
    if (off < HEADER_SIZE || off >= len)
        return 0;
    return memchr(blob + off, 0, len - off) != NULL;
}

static int path_ok(const char *blob, size_t len, uint32_t off)
{
    return off != 0 && str_ok(blob, len, off);
}

/* `n` elements of `size` bytes at `off`: aligned, after the header (unless
 * empty) and inside the blob. 64-bit arithmetic: n * size cannot wrap. */
static int array_ok(size_t len, uint32_t off, uint64_t n, uint64_t size, uint32_t align)
{
    uint64_t bytes = n * size;
    if (off % align || off > len || bytes > len - off)
        return 0;
    return n == 0 || off >= HEADER_SIZE;
}

/* A uint32_t[n] of string offsets: every one a path. */
static int paths_ok(const char *blob, size_t len, uint32_t off, uint32_t n)
{
    if (!array_ok(len, off, n, 4, 4))
        return 0;
    const uint32_t *paths = (const void *)(blob + off);
    for (uint32_t i = 0; i < n; i++)
        if (!path_ok(blob, len, paths[i]))
            return 0;
    return 1;
}

/* OVERLAY: at least one lower, each a NUL-terminated absolute path (the
 * last byte of data a NUL), at most overlayfs's 500; an upper (src) is an
 * absolute path and goes with a writable overlay only. */
static int overlay_ok(const char *blob, const struct sbx_op *op)
{
    if (!op->data_len || blob[op->data + op->data_len - 1])
        return 0;
    uint32_t n = 0;
    for (uint32_t k = 0; k < op->data_len; k += (uint32_t)strlen(blob + op->data + k) + 1, n++)
        if (blob[op->data + k] != '/')
            return 0;
    if (n > 500)
        return 0;
    return !op->src || (blob[op->src] == '/' && !(op->flags & SBX_F_RDONLY));
}

static int op_ok(const char *blob, size_t len, const struct sbx_op *op)
{
    if (op->kind < SBX_OP_BIND || op->kind > SBX_OP_OVERLAY)
        return 0;
    if (!path_ok(blob, len, op->dest) || blob[op->dest] != '/' || !str_ok(blob, len, op->src))
        return 0;
    if ((op->kind == SBX_OP_BIND || op->kind == SBX_OP_SYMLINK) && !op->src)
        return 0;
    if (op->data_len && !array_ok(len, op->data, op->data_len, 1, 1))
        return 0;
    /* PROC: its covers, each a NUL-terminated entry */
    if (op->kind == SBX_OP_PROC && op->data_len && blob[op->data + op->data_len - 1])
        return 0;
    if (op->kind == SBX_OP_OVERLAY && !overlay_ok(blob, op))
        return 0;
    return op->data_len || !op->data;
}

int sbx_check_blob(const void *p, size_t len)
{
    const char *blob = p;
    const struct sbx_header *h = p;
    if (!p || (uintptr_t)p % 8 || len < HEADER_SIZE)
        return -EINVAL;
    if (h->magic != SBX_MAGIC || h->abi != SBX_ABI_VERSION || h->size != len)
        return -EINVAL;
    if (!array_ok(len, h->ops_off, h->n_ops, sizeof(struct sbx_op), 8) ||
        !array_ok(len, h->rlimits_off, h->n_rlimits, sizeof(struct sbx_rlimit), 8) ||
        !array_ok(len, h->landlock_off, h->n_landlock, sizeof(struct sbx_landlock), 4) ||
        !array_ok(len, h->listen_off, h->n_listen, 4, 4))
        return -EINVAL;
    /* a seccomp program of at most BPF_MAXINSNS 8-byte instructions */
    if (h->seccomp_len % 8 || h->seccomp_len / 8 > 4096 ||
        !array_ok(len, h->seccomp_off, h->seccomp_len / 8, 8, 8))
        return -EINVAL;
    if (!str_ok(blob, len, h->hostname) || !str_ok(blob, len, h->path) || !path_ok(blob, len, h->newroot))
        return -EINVAL;
    if (!paths_ok(blob, len, h->cwd_off, h->n_cwd) || !paths_ok(blob, len, h->probe_off, h->n_probe))
        return -EINVAL;
    if (h->n_lock > SBX_MAX_LOCK_FILES || (h->n_lock && !(h->opts & SBX_OPT_REAPER)) ||
        !paths_ok(blob, len, h->lock_off, h->n_lock))
        return -EINVAL;
    if ((h->opts & SBX_OPT_SYNC) && (h->started_fd < -1 || h->userns_block_fd < -1 || h->userns2_fd < -1 ||
                                     h->block_fd < -1 || h->info_fd < -1 || h->json_status_fd < -1))
        return -EINVAL;
    const struct sbx_landlock *ll = (const void *)(blob + h->landlock_off);
    for (uint32_t i = 0; i < h->n_landlock; i++)
        if (!path_ok(blob, len, ll[i].path))
            return -EINVAL;
    const struct sbx_op *ops = (const void *)(blob + h->ops_off);
    for (uint32_t i = 0; i < h->n_ops; i++)
        if (!op_ok(blob, len, &ops[i]))
            return -EINVAL;
    return 0;
}

/* A Template request's header: this protocol, this version. */
static int request_head_ok(const struct sbx_request *r, size_t len)
{
    return len >= sizeof *r && r->magic == SBX_REQ_MAGIC && r->version == SBX_REQ_VERSION;
}

/* The end of n NUL-terminated strings from p, all before end; NULL if not. */
static const char *strings_end(const char *p, const char *end, uint64_t n)
{
    for (uint64_t k = 0; k < n; k++) {
        const char *nul = p < end ? memchr(p, 0, (size_t)(end - p)) : NULL;
        if (!nul)
            return NULL;
        p = nul + 1;
    }
    return p;
}

int sbx_parse_request(const void *msg, size_t len, const void *stored, int nfds, struct sbx_request_view *view)
{
    const struct sbx_request *r = msg;
    const char *m = msg;
    if (!msg || ((uintptr_t)msg & 7) || !request_head_ok(r, len) || r->argc == 0 || r->n_pass > SBX_REQ_MAX_FDS ||
        r->n_cgroup > SBX_REQ_MAX_CGROUP || r->reserved)
        return -1;
    const char *blob = stored;
    if (r->blob_len) {
        blob = m + sizeof *r;
        if (r->blob_len > len - sizeof *r || sbx_check_blob(blob, r->blob_len) < 0)
            return -1;
    }
    uint64_t blob_end = sizeof *r + (((uint64_t)r->blob_len + 7) & ~(uint64_t)7);
    if (!blob || blob_end + 4ull * r->n_pass > len)
        return -1;
    const struct sbx_header *h = (const void *)blob;
    if (h->n_listen) /* a Template's sandbox forwards no port */
        return -1;
    const char *strings = m + blob_end + 4 * r->n_pass;
    if (strings_end(strings, m + len, (uint64_t)r->argc + r->envc) != m + len)
        return -1;
    /* the fds: report, status (without a reaper), netns, cgroups, stdio, pass */
    int with_status = !(h->opts & SBX_OPT_REAPER), join = (r->flags & SBX_REQ_JOIN_NETNS) != 0;
    int at = 1 + with_status + join + (int)r->n_cgroup;
    if (nfds != at + __builtin_popcount(r->stdio_mask & 7) + (int)r->n_pass)
        return -1;
    view->blob = blob;
    view->targets = (const void *)(m + blob_end);
    view->strings = strings;
    view->report = 0;
    view->status = with_status ? 1 : -1;
    view->netns = join ? 1 + with_status : -1;
    view->cgroup_at = 1 + with_status + join;
    for (int i = 0; i < 3; i++)
        view->stdio[i] = (r->stdio_mask & (1u << i)) ? at++ : -1;
    view->pass_at = at;
    return 0;
}

int sbx_check_store(const void *msg, size_t len, int nfds)
{
    const struct sbx_request *r = msg;
    if (!msg || ((uintptr_t)msg & 7) || !request_head_ok(r, len) || r->argc || !(r->flags & SBX_REQ_STORE_BLOB) ||
        r->n_cgroup > SBX_REQ_MAX_CGROUP || (r->n_cgroup && !(r->flags & SBX_REQ_STANDBY)) || r->reserved)
        return -1;
    int leases = (r->flags & SBX_REQ_STANDBY) && (r->flags & SBX_REQ_JOIN_NETNS);
    int cgroups = SBX_N_STANDBY * (int)r->n_cgroup; /* cgroup mode: a set per standby */
    if (nfds != 1 + (leases ? SBX_N_STANDBY : 0) + cgroups || r->blob_len == 0 || r->blob_len != len - sizeof *r)
        return -1;
    return sbx_check_blob((const char *)msg + sizeof *r, r->blob_len);
}

/* The caller's end of a Template request (sandbox/backends/template/server.py).
 * A fresh report socket per request: the sandbox's pid 1 answers on it, and
 * with a reaper its status comes on it later. SO_PASSCRED on our end makes the
 * kernel attach the sender's pid as we see it to each message (SCM_CREDENTIALS:
 * the kernel's word, which the sender cannot forge but for its own pid). */
_Static_assert(SBX_REQ_MAX_FDS <= SBX_MAX_FDS_PER_MESSAGE, "a request's fds fit one message");

int sbx_template_send(int sock, const void *msg, size_t len, const int *fds, int nfds, int *report)
{
    int pair[2], one = 1;
    *report = -1;
    if (nfds < 0 || nfds + 1 > SBX_REQ_MAX_FDS)
        return -EMSGSIZE;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0)
        return -errno;
    if (setsockopt(pair[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof one) < 0) {
        int err = errno;
        close(pair[0]);
        close(pair[1]);
        return -err;
    }
    int all[SBX_REQ_MAX_FDS] = {pair[1]}; /* the report socket's end first, then the request's fds */
    int err = 0;
    for (int i = 0; i < nfds; i++)
        if ((all[i + 1] = fds[i]) < 0) /* sbx_send_fds would leave it out, and the rest would move up */
            err = EBADF;
    if (!err && sbx_send_fds(sock, msg, len, all, nfds + 1) < 0)
        err = errno;
    close(pair[1]); /* the server holds its own copy now, or never will */
    if (err) {
        close(pair[0]);
        return -err;
    }
    *report = pair[0];
    return 0;
}

/* One message of a report socket, checked whole: a stamps report (step 0)
 * with the sandbox's pidfd first, or a failure; either may carry one fd of a
 * leased network namespace, named here by its inode and closed. Anything else
 * (another size, a truncated message or fds, a stamps report without a
 * pidfd, a failure that claims step 0) is not the protocol's: refused, every
 * fd that came with it closed. */
#define REPORT_MAX_FDS 4 /* more than a report carries: its pidfd and a lease's, with room to spare */

int sbx_template_report(int report, struct sbx_template_answer *out)
{
    struct sbx_stamps_report r;
    int fds[REPORT_MAX_FDS + 1], n_fds = 0, truncated;
    pid_t sender;
    memset(out, 0, sizeof *out);
    out->pid = out->pidfd = -1;
    ssize_t n = sbx_recv_fds_from(report, &r, sizeof r, fds, REPORT_MAX_FDS + 1, &n_fds, &truncated, 0, &sender);
    if (n < 0)
        return -errno;
    out->pid = sender;
    int kind = n == 0 ? SBX_ANSWER_EOF : -1, at = 0;
    if (truncated || n_fds > REPORT_MAX_FDS)
        kind = SBX_ANSWER_BAD;
    else if (n == (ssize_t)sizeof r && r.step == SBX_STEP_NONE && n_fds >= 1)
        kind = SBX_ANSWER_STARTED;
    else if (n == (ssize_t)sizeof(struct sbx_report) && r.step != SBX_STEP_NONE)
        kind = SBX_ANSWER_FAILED;
    else if (n != 0)
        kind = SBX_ANSWER_BAD;
    if (kind == SBX_ANSWER_STARTED)
        out->pidfd = fds[at++];
    if (at < n_fds) { /* the lease the sandbox lives in, or one that is the caller's again */
        struct stat st;
        if (fstat(fds[at], &st) == 0)
            out->netns_ino = st.st_ino;
    }
    for (int i = at; i < n_fds; i++)
        close(fds[i]);
    if (kind == SBX_ANSWER_BAD) {
        out->netns_ino = 0; /* none of the protocol's: the lease stays where it was */
        r.step = SBX_STEP_CONFIG, r.op = -1, r.err = r.detail = 0;
    }
    if (kind != SBX_ANSWER_EOF)
        memcpy(&out->report, &r, kind == SBX_ANSWER_STARTED ? sizeof r : sizeof(struct sbx_report));
    return kind;
}
