/* zygote_wire.c: a serving zygote's messages (struct sbx_zmsg, csrc/core/sandbox.h)
 * and a forked task's way out of the loop (csrc/core/zygote.c has the loop).
 *
 * The zygote reports to the caller and reads its requests here; a spare,
 * set up and waiting, reads its task's channels here (spare_wait), and
 * every task's sandbox leaves the C loop with its death notes set on its
 * channel (sbx_zygote_become_task).
 */
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

void sbx_close_fds(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* ---------------------------------------------------------------- messages */

void sbx_zmsg_init(struct sbx_zmsg *m, uint32_t kind, int64_t id, pid_t pid, int slot)
{
    memset(m, 0, sizeof *m);
    m->kind = kind;
    m->id = id;
    m->pid = pid;
    m->slot = slot;
}

void sbx_zreport(struct sbx_zygote *z, const struct sbx_zmsg *m, const int *fds, int n)
{
    (void)sbx_send_fds(z->ctl, m, sizeof *m, fds, n);
}

void sbx_zreport_failed(struct sbx_zygote *z, int64_t id, const struct sbx_result *res, int slot)
{
    struct sbx_zmsg m;
    sbx_zmsg_init(&m, SBX_Z_FAILED, id, res->pid, slot);
    m.step = res->step;
    m.op = res->op;
    m.err = res->err;
    m.detail = res->detail;
    m.status = res->wait_status;
    sbx_zreport(z, &m, NULL, 0);
}

void sbx_zreport_exited(struct sbx_zygote *z, int64_t id, pid_t pid, int status, int slot, const struct rusage *ru)
{
    struct sbx_zmsg m;
    sbx_zmsg_init(&m, SBX_Z_EXITED, id, pid, slot);
    m.status = status;
    if (!ru) {
        sbx_zreport(z, &m, NULL, 0);
        return;
    }
    m.t_ns[SBX_Z_RU_UTIME_US] = (uint64_t)ru->ru_utime.tv_sec * 1000000 + (uint64_t)ru->ru_utime.tv_usec;
    m.t_ns[SBX_Z_RU_STIME_US] = (uint64_t)ru->ru_stime.tv_sec * 1000000 + (uint64_t)ru->ru_stime.tv_usec;
    m.t_ns[SBX_Z_RU_MAXRSS_KB] = (uint64_t)ru->ru_maxrss;
    sbx_zreport(z, &m, NULL, 0);
}

int sbx_zreceive(int sock, struct sbx_zmsg *m, int *fds, int max, int *n_fds)
{
    int truncated;
    ssize_t n = sbx_recv_fds(sock, m, sizeof *m, fds, max, n_fds, &truncated);
    if (n < 0)
        return -1;
    if (n == 0 && *n_fds == 0)
        return 0;
    if (n != (ssize_t)sizeof *m || truncated) {
        sbx_close_fds(fds, *n_fds);
        errno = EPROTO;
        return -1;
    }
    return 1;
}

/* ---------------------------------------------------------------- the task's side */

/* In a spare, set up and waiting: the task's channels from the caller (or
 * from the zygote, for a spare a task claimed), then no way back to either
 * is left. EOF: the zygote dropped us. */
void sbx_zspare_wait(struct sbx_zygote *z, int sock)
{
    struct sbx_zmsg m;
    int fds[SBX_Z_MAX_FDS], n = 0;
    int got = sbx_zreceive(sock, &m, fds, SBX_Z_MAX_FDS, &n);
    if (got == 0)
        _exit(0);
    if (got < 0 || m.kind != SBX_Z_SPAWN || n != 3)
        _exit(70);
    close(sock);
    for (int i = 1; i < 3; i++) {
        if (dup2(fds[i], i) < 0)
            _exit(70);
        close(fds[i]);
    }
    z->task_fd = fds[0];
}

/* A task's sandbox on its way into Python: its death notes on its
 * channel, then z->task_main(channel) called from here. Returning through
 * ctypes and the zygote's own frames instead wrote ~15 pages more (each a
 * copy-on-write fault): the call's result and arguments, the frames. */
void sbx_zygote_become_task(struct sbx_zygote *z, int channel)
{
    z->task_fd = channel;
    sbx_task_death_notes(channel, z->died_base);
    if (!z->task_main || !z->call_one || !z->long_from)
        return;
    void *(*long_from)(long) = (void *(*)(long))z->long_from;
    void *(*call_one)(void *, void *) = (void *(*)(void *, void *))z->call_one;
    void *arg = long_from(channel);
    if (arg)
        call_one(z->task_main, arg);
    _exit(70); /* task_main returned, or could not be called */
}

