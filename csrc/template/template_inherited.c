/* template_inherited.c: what a recycled sandbox's commands inherit from
 * the process that makes them, and that a command could change there.
 *
 * A recycled standby's commands are children of a process that outlives
 * each of them (csrc/template/template_recycle.c). The kernel lets a process change
 * some attributes of another process that has its uid, without any
 * capability, and a child inherits them at fork (and across its exec):
 * - its resource limits (prlimit64 on another pid: the caller's uid must
 *   equal the target's real, effective and saved uids, and its gid theirs);
 * - its scheduling: nice, policy, utilization clamps (sched_setattr,
 *   setpriority: only ever "lower", but lower is what a tenant would leave
 *   behind for the next), its CPU affinity (sched_setaffinity), its I/O
 *   priority (ioprio_set);
 * - through /proc/<pid>/oom_score_adj and coredump_filter, which belong to
 *   the uid that owns the process's memory (for a non-dumpable process,
 *   uid 0 of its memory's user namespace: a root caller's commands run as
 *   that uid): the OOM killer's preference, and which mappings a core dump
 *   of the command would hold.
 * Such a change made by request N would reach request N+1's command. The
 * process takes a reference of all of them before any request
 * (tpl_inherited_take) and compares it before each command it makes
 * (tpl_inherited_same); any difference ends it, and the server makes a
 * fresh standby from its own state, which no sandbox can reach. (Signals
 * pending in it are not inherited; the ones left are dropped.)
 */
#include "template.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef RLIM_NLIMITS
#define RLIM_NLIMITS 16
#endif
#define IOPRIO_WHO_PROCESS 1

static int read_at0(int fd, char *buf, size_t len)
{
    if (fd < 0)
        return 0;
    ssize_t n = pread(fd, buf, len - 1, 0);
    return n < 0 ? -1 : (int)n;
}

/* The attributes as they are now, into `now` (its fds are the reference's). */
static int take(struct tpl_inherited *now, int oom_fd, int dump_fd)
{
    memset(now->rl, 0, sizeof now->rl);
    for (int r = 0; r < RLIM_NLIMITS; r++)
        if (syscall(SYS_prlimit64, 0, r, NULL, &now->rl[r]) < 0 && errno != EINVAL)
            return -1;
    memset(now->sched, 0, sizeof now->sched);
    now->sched[0] = sizeof now->sched; /* struct sched_attr's size, its first field */
    if (syscall(SYS_sched_getattr, 0, now->sched, (unsigned)sizeof now->sched, 0) < 0)
        return -1;
    memset(now->affinity, 0, sizeof now->affinity);
    if (syscall(SYS_sched_getaffinity, 0, sizeof now->affinity, now->affinity) < 0)
        return -1;
    if ((now->ioprio = (int)syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0)) < 0)
        return -1;
    memset(now->oom, 0, sizeof now->oom);
    memset(now->dump, 0, sizeof now->dump);
    if (read_at0(oom_fd, now->oom, sizeof now->oom) < 0 || read_at0(dump_fd, now->dump, sizeof now->dump) < 0)
        return -1;
    return 0;
}

int tpl_inherited_take(const struct sbx_ctx *c, struct tpl_inherited *ref)
{
    ref->oom_fd = sbx_proc_open(c, "self/oom_score_adj", O_RDONLY);
    ref->dump_fd = sbx_proc_open(c, "self/coredump_filter", O_RDONLY); /* -1 where the kernel lacks it */
    if (ref->oom_fd < 0)
        return -1;
    return take(ref, ref->oom_fd, ref->dump_fd);
}

int tpl_inherited_same(const struct tpl_inherited *ref)
{
    struct tpl_inherited now;
    if (take(&now, ref->oom_fd, ref->dump_fd) < 0)
        return 0;
    return memcmp(now.rl, ref->rl, sizeof now.rl) == 0 && memcmp(now.sched, ref->sched, sizeof now.sched) == 0 &&
           memcmp(now.affinity, ref->affinity, sizeof now.affinity) == 0 && now.ioprio == ref->ioprio &&
           memcmp(now.oom, ref->oom, sizeof now.oom) == 0 && memcmp(now.dump, ref->dump, sizeof now.dump) == 0;
}

void tpl_drop_pending_signals(void)
{
    sigset_t all;
    sigfillset(&all);
    struct timespec none = {0, 0};
    while (sigtimedwait(&all, NULL, &none) > 0 || errno == EINTR)
        ;
}
