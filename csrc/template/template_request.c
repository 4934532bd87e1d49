/* template_request.c: one request message of a Template's caller (struct
 * sbx_request, csrc/core/sandbox.h), as the server and its standbys receive it:
 * the header, the blob (or the stored one), the fd targets, argv and the
 * environment, with its fds (SCM_RIGHTS) in the order the header says.
 * wire.c checks it (sbx_parse_request); this file receives and splits it. */
#include "template.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The request in s->msg, checked whole by the C core's own reader
 * (wire.c, sbx_parse_request: the unit tests read Python's requests
 * through it too), then its argv and environment as arrays. */
int parse_request(struct tpl_server *s, struct request *q, size_t len)
{
    struct sbx_request_view v;
    q->r = (const void *)s->msg;
    if (sbx_parse_request(s->msg, len, s->stored_blob, q->nfds, &v) < 0)
        return -1;
    q->blob = v.blob;
    q->targets = v.targets;
    const char *p = v.strings, *end = s->msg + len;
    q->argv = strings(&p, end, q->r->argc);
    q->envp = q->argv ? strings(&p, end, q->r->envc) : NULL;
    if (!q->envp)
        return -1;
    q->status = v.status >= 0 ? q->fds[v.status] : -1;
    q->netns = v.netns >= 0 ? q->fds[v.netns] : -1;
    for (int i = 0; i < 3; i++)
        q->stdio[i] = v.stdio[i] >= 0 ? q->fds[v.stdio[i]] : -1;
    q->pass = q->fds + v.pass_at;
    q->cgroup = q->fds + v.cgroup_at;
    q->n_cgroup = (int)q->r->n_cgroup;
    return 0;
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
    in->cgroup_fds = q->cgroup;
    in->n_cgroup = q->n_cgroup;
}

void forget_big_request(struct tpl_server *s)
{
    free(s->big);
    s->big = NULL;
    s->msg = s->msg_buf;
}

/* The seals a request's memfd must carry: its size and content fixed (only
 * a memfd takes seals, and its reads never block). */
#define REQUEST_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)

/* The request in the memfd `fd` (SBX_REQ_IN_MEMFD, sealed), read into
 * memory of this process's own (what is checked and used is this copy);
 * its length, -2 when larger than SBX_REQ_MAX_SIZE, -1 when it is not a
 * sealed memfd or unreadable. The header inside must not say
 * SBX_REQ_IN_MEMFD again. */
static ssize_t read_big(struct tpl_server *s, int fd)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & REQUEST_SEALS) != REQUEST_SEALS || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
        st.st_size < (off_t)sizeof(struct sbx_request))
        return -1;
    if (st.st_size > SBX_REQ_MAX_SIZE)
        return -2;
    size_t len = (size_t)st.st_size, done = 0;
    if (!(s->big = malloc(len)))
        return -1;
    while (done < len) {
        ssize_t k = pread(fd, s->big + done, len - done, (off_t)done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        done += (size_t)k;
    }
    if (((const struct sbx_request *)(const void *)s->big)->flags & SBX_REQ_IN_MEMFD)
        return -1;
    s->msg = s->big;
    return (ssize_t)len;
}

ssize_t receive_request(struct tpl_server *s, int fd, int *fds, int *nfds)
{
    int truncated;
    forget_big_request(s);
    ssize_t n = sbx_recv_fds(fd, s->msg_buf, sizeof s->msg_buf, fds, MAX_FDS, nfds, &truncated);
    if (n > 0 && truncated)
        return -2; /* too large: refused */
    const struct sbx_request *r = (const void *)s->msg_buf;
    if (n != (ssize_t)sizeof *r || r->magic != SBX_REQ_MAGIC || !(r->flags & SBX_REQ_IN_MEMFD))
        return n;
    if (r->argc || r->blob_len || *nfds < 2) /* a report socket, then the memfd */
        return -1;
    int memfd = fds[--*nfds];
    n = read_big(s, memfd);
    close(memfd);
    return n;
}

/* The cgroups of a Template's sandbox, entered first: v1's `tasks` or v2's
 * cgroup.procs, written "0" by the process that moves (the kernel takes no
 * global lock for a thread that moves itself). Their tag is the low 32 bits
 * of the first file's inode (kernfs: unique among the live nodes of a
 * hierarchy), by which the caller knows which of the cgroups it made holds
 * this sandbox; then the fds go, so that nothing inside can reach them. */
void tpl_enter_cgroups(struct sbx_ctx *c)
{
    struct stat st;
    if (c->in.n_cgroup <= 0)
        return;
    sbx_enter_cgroups(c);
    if (fstat(c->in.cgroup_fds[0], &st) < 0)
        sbx_fail(c, SBX_STEP_CGROUP, 0, errno, SBX_D_NONE);
    c->cgroup_left = c->cgroup_tag; /* a standby placed ahead, moving to a request's own */
    c->cgroup_tag = (uint32_t)st.st_ino;
    for (int i = 0; i < c->in.n_cgroup; i++)
        close(c->in.cgroup_fds[i]);
    c->in.n_cgroup = 0;
}

int tpl_next_cgroup_set(const struct tpl_server *s, struct request *q, int *out)
{
    if (!(q->r->flags & SBX_REQ_CGROUP_NEXT) || s->cgroup_k <= 0 || q->n_cgroup < s->cgroup_k)
        return -1;
    q->n_cgroup -= s->cgroup_k;
    int at = (int)(q->cgroup - q->fds) + q->n_cgroup;
    for (int i = 0; i < s->cgroup_k; i++) {
        out[i] = q->fds[at + i];
        q->fds[at + i] = -1; /* the caller of this owns it now */
    }
    return 0;
}

void tpl_close_cgroup_sets(struct tpl_server *s)
{
    for (int k = 0; k < s->n_cgroups; k++)
        close_all(s->cgroups[k], s->cgroup_k);
    s->n_cgroups = 0;
}

void tpl_close_server_fds(struct tpl_server *s, int standby)
{
    close(s->sock_fd);
    close(s->notify_rd);
    close(s->sig_fd);
    close(s->own_netns);
    close(s->host_tree);
    if (s->null_master >= 0 && !(standby && s->reset_blob)) /* a recycled one clones its masks from it */
        close(s->null_master);
    if (!standby) {
        close(s->fast_fd);
        close(s->notify_wr);
    }
    tpl_close_cgroup_sets(s);
    /* the leases waiting for standbys to come: other sandboxes' network
     * namespaces (a fork-style clone: this is the child's own copy) */
    close_all(s->leases, s->n_leases);
    s->n_leases = 0;
}
