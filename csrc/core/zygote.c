/* zygote.c: a WorkerPool zygote's serve loop, in C.
 *
 * The zygote (sandbox/workerpool/zygote.py) imports what its tasks need,
 * then forks a sandbox per task (sbx_fork_task). Every page it writes
 * while a child shares it is a copy-on-write fault (~3 µs on a VM), and an
 * interpreter's smallest loop writes dozens (reference counts, frames, the
 * objects of each message); so it serves from here and never returns to
 * Python between two forks: it writes only this file's state and its stack.
 *
 * It serves csrc/core/sandbox.h's messages (struct sbx_zmsg): spares forked
 * ahead of their tasks and handed to the caller (SPARE), all that are
 * missing at once when half are gone (forks in a row share the faults of
 * one interval) and the rest when idle; a sandbox per SPAWN (a plan of its
 * own, or no spare at hand) unless a spare being set up can take it;
 * STARTED or FAILED when a setup ends, EXITED when a sandbox has ended
 * (reaped here). The caller's slots (cgroups, a leased network namespace)
 * come with INIT, SLOT and SPAWN; a spare is forked only with one when the
 * pool needs them. Nothing of a task passes through here: ids and fds (a
 * per-task plan as a memfd, mapped for its fork and unmapped). A task's
 * sandbox returns from sbx_zygote_serve (or _check) into Python with its
 * channel in z->task_fd (zygote_wire.c: a spare first waits for it).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

#define ZCHILD 1 /* returned up the stack in a task's sandbox */

struct zchild {
    pid_t pid;
    int pidfd;        /* watched once its setup has ended, else -1 */
    int report_fd;    /* its setup report while it sets up, else -1 */
    int64_t task;     /* the task it runs, -1: a spare */
    int slot;         /* the caller's slot it entered, -1: none */
    int sock;         /* a spare's socket while the zygote holds it, else -1 */
    int offered;      /* a spare in the caller's hands, not yet taken */
    int64_t claim;    /* a task waiting for this spare's setup, -1: none */
    int claim_fds[3]; /* ... its result, stdout and stderr */
    struct sbx_result res;
};

#define SLOT_FDS 16 /* cgroup.procs (one per hierarchy) and a namespace's two */
struct zslot {
    int id, n_cg, n_ns;
    int fds[SLOT_FDS];
};

struct zstate {
    struct zchild *kids;
    int n_kids, cap_kids;
    struct zslot *free;
    int n_free, cap_free;
    int spares_failed; /* a spare's setup failed: fork per task from now on */
    struct pollfd *pfd;
    int cap_pfd;
};

/* *array with room for `want` items of `size` bytes: 0, or -1 (ENOMEM). */
static int grow(void **array, int *cap, int want, size_t size)
{
    if (want <= *cap)
        return 0;
    int n = want < 16 ? 16 : want * 2;
    void *p = realloc(*array, (size_t)n * size);
    if (!p)
        return -1;
    *array = p;
    *cap = n;
    return 0;
}

static struct zstate *state(struct sbx_zygote *z)
{
    if (!z->state)
        z->state = calloc(1, sizeof(struct zstate));
    return z->state;
}

static struct zchild *add_child(struct zstate *s)
{
    if (grow((void **)&s->kids, &s->cap_kids, s->n_kids + 1, sizeof *s->kids) < 0)
        return NULL;
    struct zchild *k = &s->kids[s->n_kids++];
    memset(k, 0, sizeof *k);
    k->pidfd = k->report_fd = k->sock = -1;
    k->task = k->claim = -1;
    k->slot = -1;
    return k;
}

static void drop_child(struct zstate *s, struct zchild *k)
{
    *k = s->kids[--s->n_kids];
}

static int add_slot(struct zstate *s, int id, const int *fds, int n_cg, int n_ns)
{
    if (n_cg + n_ns > SLOT_FDS || grow((void **)&s->free, &s->cap_free, s->n_free + 1, sizeof *s->free) < 0) {
        sbx_close_fds(fds, n_cg + n_ns);
        return -1;
    }
    struct zslot *slot = &s->free[s->n_free++];
    slot->id = id;
    slot->n_cg = n_cg;
    slot->n_ns = n_ns;
    memcpy(slot->fds, fds, (size_t)(n_cg + n_ns) * sizeof *fds);
    return 0;
}

int sbx_zygote_add_slot(struct sbx_zygote *z, int slot, const int *fds, int n_cg, int n_ns)
{
    struct zstate *s = state(z);
    if (!s) {
        sbx_close_fds(fds, n_cg + n_ns);
        errno = ENOMEM;
        return -1;
    }
    return add_slot(s, slot, fds, n_cg, n_ns);
}

/* The oldest free slot into `slot` (id -1: none, when the forks take none). */
static void take_slot(struct zstate *s, struct zslot *slot)
{
    slot->id = -1;
    if (s->n_free) {
        *slot = s->free[0];
        memmove(s->free, s->free + 1, (size_t)--s->n_free * sizeof *s->free);
    }
}

/* Fork a sandbox of `blob` in `slot` (its fds are closed here, in both),
 * calling CPython's fork hooks around it with `hooks` (sbx_fork_task). */
static pid_t fork_in_slot(const void *blob, size_t len, const int stdio[3], int keep, const int *trees,
                          int n_trees, struct zslot *slot, int hooks, struct sbx_result *res)
{
    int ns[2] = {-1, -1};
    if (slot->id >= 0 && slot->n_ns == 2)
        memcpy(ns, slot->fds + slot->n_cg, sizeof ns);
    pid_t pid = sbx_fork_task(blob, len, stdio, &keep, 1, trees, n_trees, slot->id >= 0 ? slot->fds : NULL,
                              slot->id >= 0 ? slot->n_cg : 0, ns, (hooks ? SBX_FORK_HOOKS : 0) | SBX_FORK_STAY, res);
    if (pid != 0 && slot->id >= 0)
        sbx_close_fds(slot->fds, slot->n_cg + slot->n_ns);
    return pid;
}

static void watch_setup(struct zchild *k, pid_t pid, const struct sbx_result *res)
{
    k->pid = pid;
    k->res = *res;
    k->report_fd = res->status_fd;
}

/* No spare could be forked (z->res says why): fork per task from now on;
 * the slot it took is the caller's to free. */
static int no_spare(struct sbx_zygote *z, struct zstate *s, struct zchild *k, const struct zslot *slot)
{
    if (k)
        drop_child(s, k);
    s->spares_failed = 1;
    if (slot->id >= 0)
        sbx_zreport_exited(z, -1, 0, 0, slot->id, NULL);
    return -1;
}

/* A spare (the pool's plan, waiting on a socket for its task): 0 (forked,
 * setting up), -1 (the fork failed: no more spares), or ZCHILD in it. */
static int make_spare(struct sbx_zygote *z, struct zstate *s, int hooks)
{
    struct zslot slot;
    take_slot(s, &slot);
    struct zchild *k = add_child(s);
    int sv[2];
    if (!k || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        memset(&z->res, 0, sizeof z->res);
        z->res.step = SBX_STEP_PIPE;
        z->res.err = k ? errno : ENOMEM;
        if (slot.id >= 0)
            sbx_close_fds(slot.fds, slot.n_cg + slot.n_ns);
        return no_spare(z, s, k, &slot);
    }
    int none[3] = {-1, -1, -1};
    struct sbx_result res;
    pid_t pid = fork_in_slot(z->blob, z->blob_len, none, sv[1], NULL, 0, &slot, hooks, &res);
    if (pid == 0) {
        sbx_zspare_wait(z, sv[1]);
        sbx_zygote_become_task(z, z->task_fd);
        return ZCHILD;
    }
    close(sv[1]);
    z->res = res; /* a failed clone's, for sbx_zygote_check */
    if (pid < 0) {
        close(sv[0]);
        return no_spare(z, s, k, &slot);
    }
    watch_setup(k, pid, &res);
    k->sock = sv[0];
    k->slot = slot.id;
    return 0;
}

/* How many spares are wanted and can be forked now; `held`: how many
 * there are (in the caller's hands, or being set up for none yet). */
static int missing(struct sbx_zygote *z, struct zstate *s, int *held)
{
    *held = 0;
    for (int i = 0; i < s->n_kids; i++) {
        struct zchild *k = &s->kids[i];
        *held += k->offered || (k->task < 0 && k->claim < 0 && k->report_fd >= 0);
    }
    if (s->spares_failed || (z->slotted && !s->n_free))
        return 0;
    return z->spares > *held ? z->spares - *held : 0;
}

/* 0: fork the missing spares now (half of them or more are gone); the
 * milliseconds to wait before topping them up; -1: none is wanted. */
static int want_spare(struct sbx_zygote *z, struct zstate *s)
{
    int held;
    if (!missing(z, s, &held))
        return -1;
    return held <= z->spares / 2 ? 0 : (z->quiet_ms > 0 ? z->quiet_ms : 1);
}

/* Every missing spare, back to back, within one pair of CPython's fork
 * hooks: the pages written between two forks are copied (a fault each)
 * once per interval, so forks in a row cost fewer. 0, or ZCHILD. */
static int fill_spares(struct sbx_zygote *z, struct zstate *s)
{
    int held, r = 0;
    if (!missing(z, s, &held))
        return 0;
    sbx_python_before_fork();
    while (missing(z, s, &held) && (r = make_spare(z, s, 0)) == 0)
        ;
    if (r == ZCHILD)
        return ZCHILD; /* CPython's after-fork, the child's, has run */
    sbx_python_after_parent();
    return 0;
}

static int pidfd_of(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* A child whose setup ended is watched by a pidfd; without one (EMFILE)
 * it ends here, as a failed setup (k->res). 0, or -1. */
static int watch(struct zchild *k)
{
    k->pidfd = pidfd_of(k->pid);
    if (k->pidfd >= 0)
        return 0;
    struct sbx_report why = {SBX_STEP_FORK, -1, errno, SBX_D_NONE};
    sbx_reap_failed_setup(k->pid, &why, &k->res);
    if (k->sock >= 0)
        close(k->sock);
    if (k->claim >= 0)
        sbx_close_fds(k->claim_fds, 3);
    k->sock = -1;
    return -1;
}

/* Hand a ready spare to the caller (a socket to it and a pidfd); the zygote
 * keeps its own pidfd, to reap it. Without a pidfd for the caller, the
 * spare is let go (EOF: it exits, and is reaped). */
static void offer(struct sbx_zygote *z, struct zchild *k)
{
    int fds[2] = {k->sock, pidfd_of(k->pid)};
    k->sock = -1;
    if (fds[1] < 0) {
        close(fds[0]);
        return;
    }
    struct sbx_zmsg m;
    sbx_zmsg_init(&m, SBX_Z_SPARE, -1, k->pid, k->slot);
    sbx_zreport(z, &m, fds, 2);
    sbx_close_fds(fds, 2);
    k->offered = 1;
}

/* Give a spare the task that claimed it while it was set up. */
static void assign(struct sbx_zygote *z, struct zchild *k)
{
    struct sbx_zmsg m;
    sbx_zmsg_init(&m, SBX_Z_SPAWN, -1, 0, -1);
    (void)sbx_send_fds(k->sock, &m, sizeof m, k->claim_fds, 3); /* it died meanwhile: its end is the task's */
    close(k->sock);
    sbx_close_fds(k->claim_fds, 3);
    k->sock = -1;
    k->task = k->claim;
    k->claim = -1;
    sbx_zmsg_init(&m, SBX_Z_STARTED, k->task, k->pid, k->slot);
    m.flags = SBX_ZF_SPARE;
    sbx_zreport(z, &m, NULL, 0);
}

/* A child's setup ended: watch it (a pidfd), and say STARTED for a task's
 * or offer a spare; or say FAILED (a spare's failure stops the spares). */
static void setup_ended(struct sbx_zygote *z, struct zstate *s, struct zchild *k)
{
    int fd = k->report_fd;
    k->report_fd = -1;
    if (sbx_fork_ready(fd, k->pid, &k->res) < 0) {
        if (k->task < 0) {
            s->spares_failed = 1;
            close(k->sock);
            if (k->claim >= 0) {
                sbx_close_fds(k->claim_fds, 3);
                sbx_zreport_failed(z, k->claim, &k->res, k->slot);
            } else if (k->slot >= 0) { /* its cgroup is the caller's to remove */
                sbx_zreport_exited(z, -1, k->pid, k->res.wait_status, k->slot, NULL);
            }
        } else {
            sbx_zreport_failed(z, k->task, &k->res, k->slot);
        }
        drop_child(s, k);
        return;
    }
    if (watch(k) < 0) {
        sbx_zreport_failed(z, k->task >= 0 ? k->task : k->claim, &k->res, k->slot);
        drop_child(s, k);
        return;
    }
    if (k->task < 0 && k->claim >= 0) {
        assign(z, k);
    } else if (k->task < 0) {
        offer(z, k);
    } else {
        struct sbx_zmsg m;
        sbx_zmsg_init(&m, SBX_Z_STARTED, k->task, k->pid, k->slot);
        memcpy(m.t_ns, k->res.t_ns, sizeof m.t_ns);
        sbx_zreport(z, &m, NULL, 0);
    }
}

/* A child ended: its wait status to the caller (id -1: a spare's). */
static void reap(struct sbx_zygote *z, struct zstate *s, struct zchild *k)
{
    int status = 0;
    struct rusage ru;
    /* wait4's rusage: the task's pid 1 and whatever it reaped (usage without a cgroup) */
    memset(&ru, 0, sizeof ru);
    while (wait4(k->pid, &status, 0, &ru) < 0 && errno == EINTR)
        ;
    close(k->pidfd);
    if (k->sock >= 0)
        close(k->sock);
    sbx_zreport_exited(z, k->task, k->pid, status, k->slot, &ru);
    drop_child(s, k);
}

/* SPAWN: a spare being set up takes the task (then its slot waits for a
 * later fork), or a sandbox is forked for it. 0, or ZCHILD in it. */
static int spawn(struct sbx_zygote *z, struct zstate *s, const struct sbx_zmsg *m, int *fds, int n)
{
    int plan = (m->flags & SBX_ZF_PLAN) != 0;
    int n_slot = m->slot >= 0 ? z->per_slot + (int)m->n_ns : 0;
    if (m->n_trees > SBX_Z_MAX_FDS || n != 3 + plan + (int)m->n_trees + n_slot || n_slot > SLOT_FDS) {
        sbx_close_fds(fds, n); /* not what the caller sends: no task to fail */
        return 0;
    }
    struct zslot slot = {.id = m->slot, .n_cg = z->per_slot, .n_ns = (int)m->n_ns};
    if (n_slot)
        memcpy(slot.fds, fds + n - n_slot, (size_t)n_slot * sizeof *fds);
    if (!plan && !m->n_trees) {
        for (int i = 0; i < s->n_kids; i++) {
            struct zchild *k = &s->kids[i];
            if (k->task < 0 && k->claim < 0 && k->report_fd >= 0) {
                k->claim = m->id;
                memcpy(k->claim_fds, fds, sizeof k->claim_fds);
                if (slot.id >= 0)
                    add_slot(s, slot.id, slot.fds, slot.n_cg, slot.n_ns);
                return 0;
            }
        }
    }
    const void *blob = z->blob;
    size_t len = z->blob_len;
    void *map = NULL;
    struct stat st;
    if (plan && fstat(fds[3], &st) == 0 && st.st_size > 0) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fds[3], 0);
        blob = map == MAP_FAILED ? NULL : map;
        len = (size_t)st.st_size;
    } else if (plan) {
        blob = NULL;
    }
    struct zchild *k = add_child(s);
    struct sbx_result res;
    pid_t pid = -1;
    memset(&res, 0, sizeof res);
    res.step = SBX_STEP_CONFIG;
    res.err = blob ? ENOMEM : EINVAL;
    int stdio[3] = {-1, fds[1], fds[2]};
    if (k && blob) {
        pid = fork_in_slot(blob, len, stdio, fds[0], fds + 3 + plan, (int)m->n_trees, &slot, 1, &res);
        if (pid == 0) { /* CPython's after-fork, the child's, has run */
            sbx_zygote_become_task(z, fds[0]);
            return ZCHILD;
        }
    } else if (slot.id >= 0) {
        sbx_close_fds(slot.fds, n_slot);
    }
    if (map && map != MAP_FAILED)
        munmap(map, len); /* the task's plan (its binds' paths) leaves no copy in the zygote */
    sbx_close_fds(fds, n - n_slot);
    if (pid < 0) {
        if (k)
            drop_child(s, k);
        sbx_zreport_failed(z, m->id, &res, m->slot);
        return 0;
    }
    watch_setup(k, pid, &res);
    k->task = m->id;
    k->slot = m->slot;
    return 0;
}

/* SIGKILL to the task's pid 1: the kernel ends its whole pid namespace. */
static void kill_task(struct zstate *s, int64_t id)
{
    for (int i = 0; i < s->n_kids; i++)
        if (s->kids[i].task == id || s->kids[i].claim == id) {
            kill(s->kids[i].pid, SIGKILL);
            return;
        }
}

static void taken(struct zstate *s, pid_t pid, int64_t id)
{
    for (int i = 0; i < s->n_kids; i++)
        if (s->kids[i].pid == pid && s->kids[i].offered) {
            s->kids[i].offered = 0;
            s->kids[i].task = id;
            return;
        }
}

/* One message from the caller: 0, -1 at EOF (or a broken socket), or ZCHILD. */
static int control(struct sbx_zygote *z, struct zstate *s)
{
    struct sbx_zmsg m;
    int fds[SBX_Z_MAX_FDS], n = 0;
    int got = sbx_zreceive(z->ctl, &m, fds, SBX_Z_MAX_FDS, &n);
    if (got < 0 && errno == EPROTO)
        return 0;
    if (got <= 0)
        return -1;
    switch (m.kind) {
    case SBX_Z_SPAWN:
        return spawn(z, s, &m, fds, n);
    case SBX_Z_KILL:
        kill_task(s, m.id);
        break;
    case SBX_Z_TAKEN:
        taken(s, m.pid, m.id);
        break;
    case SBX_Z_SLOT:
        if (n == z->per_slot + (int)m.n_ns && m.slot >= 0) {
            add_slot(s, m.slot, fds, z->per_slot, (int)m.n_ns);
            return 0;
        }
        break;
    default:
        break;
    }
    sbx_close_fds(fds, n);
    return 0;
}

/* The poll set: the control socket, the factory, each child's report
 * (setting up) or pidfd. */
static int poll_set(struct sbx_zygote *z, struct zstate *s)
{
    if (grow((void **)&s->pfd, &s->cap_pfd, s->n_kids + 2, sizeof *s->pfd) < 0)
        return -1;
    int n = 0;
    s->pfd[n++] = (struct pollfd){.fd = z->ctl, .events = POLLIN};
    if (z->factory_pidfd >= 0)
        s->pfd[n++] = (struct pollfd){.fd = z->factory_pidfd, .events = POLLIN};
    for (int i = 0; i < s->n_kids; i++) {
        int fd = s->kids[i].report_fd >= 0 ? s->kids[i].report_fd : s->kids[i].pidfd;
        if (fd >= 0)
            s->pfd[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
    }
    return n;
}

static struct zchild *child_of(struct zstate *s, int fd)
{
    for (int i = 0; i < s->n_kids; i++)
        if (s->kids[i].report_fd == fd || (s->kids[i].report_fd < 0 && s->kids[i].pidfd == fd))
            return &s->kids[i];
    return NULL;
}

/* What poll returned; the control socket last (its SPAWN may fork). 0,
 * -1 at EOF, or ZCHILD. */
static int dispatch(struct sbx_zygote *z, struct zstate *s, int n)
{
    int ctl_ready = 0;
    for (int i = 0; i < n; i++) {
        int fd = s->pfd[i].fd;
        if (!s->pfd[i].revents)
            continue;
        if (fd == z->ctl) {
            ctl_ready = 1;
        } else if (fd == z->factory_pidfd) { /* the caller closed its pool (or the factory failed) */
            siginfo_t info;
            (void)waitid((idtype_t)P_PIDFD, (id_t)fd, &info, WEXITED);
            close(fd);
            z->factory_pidfd = -1;
        } else {
            struct zchild *k = child_of(s, fd);
            if (k && k->report_fd == fd)
                setup_ended(z, s, k);
            else if (k)
                reap(z, s, k);
        }
    }
    return ctl_ready ? control(z, s) : 0;
}

int sbx_zygote_serve(struct sbx_zygote *z)
{
    struct zstate *s = state(z);
    if (!s) {
        errno = ENOMEM;
        return -1;
    }
    for (int i = 0; i < s->n_kids; i++) /* the check's sandbox: the first spare, or let go (EOF) */
        if (s->kids[i].sock >= 0 && s->kids[i].pidfd >= 0 && !s->kids[i].offered && s->kids[i].claim < 0) {
            if (z->spares > 0) {
                offer(z, &s->kids[i]);
            } else {
                close(s->kids[i].sock);
                s->kids[i].sock = -1;
            }
        }
    for (;;) {
        int wait = want_spare(z, s);
        if (wait == 0) { /* until none is missing, a fork failed, or no slot is left: no spin */
            if (fill_spares(z, s) == ZCHILD)
                return ZCHILD;
            continue;
        }
        int n = poll_set(z, s);
        if (n < 0)
            return -1;
        int ready = poll(s->pfd, (nfds_t)n, wait);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready < 0)
            return -1;
        int r = ready ? dispatch(z, s, n) : fill_spares(z, s);
        if (r == ZCHILD)
            return ZCHILD;
        if (r < 0)
            return 0;
    }
}

int sbx_zygote_check(struct sbx_zygote *z)
{
    struct zstate *s = state(z);
    if (!s) {
        memset(&z->res, 0, sizeof z->res);
        z->res.step = SBX_STEP_PIPE;
        z->res.err = ENOMEM;
        return -1;
    }
    int r = make_spare(z, s, 1);
    if (r == ZCHILD)
        return ZCHILD;
    if (r < 0)
        return -1;
    struct zchild *k = &s->kids[s->n_kids - 1];
    int fd = k->report_fd;
    k->report_fd = -1;
    if (sbx_fork_ready(fd, k->pid, &k->res) < 0 || watch(k) < 0) {
        z->res = k->res;
        if (k->sock >= 0)
            close(k->sock);
        s->spares_failed = 1;
        drop_child(s, k);
        return -1;
    }
    return 0;
}
