/* template_request.c: one request message of a Template's caller (struct
 * sbx_request, csrc/sandbox.h), as the server and its standbys receive it:
 * the header, the blob (or the stored one), the fd targets, argv and the
 * environment, with its fds (SCM_RIGHTS) in the order the header says. */
#include "template.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

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
static const char *request_blob(struct tpl_server *s, const struct sbx_request *r, size_t len)
{
    if (r->blob_len == 0)
        return s->stored_blob;
    const char *blob = s->msg + sizeof *r;
    if (r->blob_len > len - sizeof *r || sbx_check_blob(blob, r->blob_len) < 0)
        return NULL;
    return blob;
}

int parse_request(struct tpl_server *s, struct request *q, size_t len)
{
    const struct sbx_request *r = (const void *)s->msg;
    q->r = r;
    if (len < sizeof *r || r->magic != SBX_REQ_MAGIC || r->argc == 0 || r->n_pass > MAX_FDS)
        return -1;
    size_t blob_end = sizeof *r + ((r->blob_len + 7u) & ~7u);
    q->blob = request_blob(s, r, len);
    if (!q->blob || blob_end + 4ull * r->n_pass > len)
        return -1;
    const struct sbx_header *h = (const void *)q->blob;
    if (h->n_listen)
        return -1;
    q->targets = (const void *)(s->msg + blob_end);
    const char *p = s->msg + blob_end + 4 * r->n_pass, *end = s->msg + len;
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

ssize_t receive_request(struct tpl_server *s, int fd, int *fds, int *nfds)
{
    static char control[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct iovec iov = {.iov_base = s->msg, .iov_len = sizeof s->msg};
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
