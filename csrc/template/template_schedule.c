/* template_schedule.c: the server's standby schedule and its children.
 *
 * The server keeps N_STANDBY standby sandboxes (csrc/template/standby.c; N_RECYCLED
 * recycled ones) of the stored blob ready on the standbys' request socket, and replaces each one
 * that takes a request once its command runs (or, while another standby is
 * ready, up to REPLACE_DELAY_NS later). Standbys talk to the server on the
 * notify socket (struct standby_note): ready, taken, running, a lease for
 * the replacement; a 16-byte struct sbx_report says why one failed before
 * any request, and the server then stops making them and serves their
 * socket itself. Being pid 1, the server reaps every child, and writes the
 * wait status of a sandbox without a reaper (a waiter) to its status pipe. */
#include "template.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define REPLACE_DELAY_NS 3000000

int add_waiter(struct tpl_server *s, pid_t pid, int status_fd)
{
    if (s->n_waiters == s->cap_waiters) {
        size_t cap = s->cap_waiters ? 2 * s->cap_waiters : 16;
        struct waiter *w = realloc(s->waiters, cap * sizeof *w);
        if (!w)
            return -1;
        s->waiters = w;
        s->cap_waiters = cap;
    }
    s->waiters[s->n_waiters++] = (struct waiter){pid, status_fd};
    return 0;
}

/* Keep a lease for a standby to come. The caller sends one per standby and
 * one per request, and every standby made takes one, so the queue stays
 * short; a lease beyond its room is closed (the caller releases every lease
 * it sent and never saw reported when the template ends). */
void add_lease(struct tpl_server *s, int fd)
{
    if (fd < 0)
        return;
    if (s->n_leases < (int)(sizeof s->leases / sizeof *s->leases))
        s->leases[s->n_leases++] = fd;
    else
        close(fd);
}

void add_cgroup_set(struct tpl_server *s, const int *fds, int n)
{
    int room = s->cgroup_k > 0 && n == s->cgroup_k && s->n_cgroups < (int)(sizeof s->cgroups / sizeof *s->cgroups);
    for (int i = 0; i < n; i++) {
        if (room)
            s->cgroups[s->n_cgroups][i] = fds[i];
        else if (fds[i] >= 0)
            close(fds[i]);
    }
    s->n_cgroups += room;
}

/* Dups of n fds (the request's are closed after it), or -1 if one fails (none kept). */
static int dup_all(const int *fds, int n, int *out)
{
    for (int i = 0; i < n; i++) {
        if ((out[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 3)) < 0) {
            close_all(out, i);
            return -1;
        }
    }
    return 0;
}

void start_standbys(struct tpl_server *s, int report, int leases_mode, const int *leases, int n, const int *cgroups,
                    int cgroup_k)
{
    s->standby_on = 1;
    s->leases_mode = leases_mode;
    /* recycled ones never lease (their pid 1 makes their network namespace) nor live in cgroups made ahead */
    s->n_standby = s->reset_blob && !leases_mode && cgroup_k <= 0 ? N_RECYCLED : N_STANDBY;
    for (int k = 0; leases_mode && k < n; k++)
        add_lease(s, fcntl(leases[k], F_DUPFD_CLOEXEC, 3));
    s->cgroup_k = cgroup_k;
    for (int k = 0; cgroup_k > 0 && k < N_STANDBY; k++) {
        int set[SBX_REQ_MAX_CGROUP];
        if (dup_all(cgroups + k * cgroup_k, cgroup_k, set) == 0)
            add_cgroup_set(s, set, cgroup_k);
    }
    s->store_report = fcntl(report, F_DUPFD_CLOEXEC, 3);
}

/* Answer the store request, once: its standbys work (err 0) or why not. */
static void answer_store(struct tpl_server *s, int step, int op, int err)
{
    if (s->store_report < 0)
        return;
    sbx_report_fd(s->store_report, step, op, err, SBX_D_NONE);
    close(s->store_report);
    s->store_report = -1;
}

/* No more standbys (one failed to set up): the server serves their socket. */
static void standby_failed(struct tpl_server *s, int step, int op, int err)
{
    s->standby_on = 0;
    answer_store(s, step, op, err ? err : EIO);
}

/* A note from the standby of slot `slot`, with the fd that came with it
 * (-1: none); the fd, unless it was kept (then -1). */
static int take_note(struct tpl_server *s, const struct standby_note *note, int fd)
{
    if (note->kind == NOTE_CGROUP)
        return fd; /* read_notes has kept the set */
    if (note->kind == NOTE_LEASE) {
        if (s->leases_mode)
            add_lease(s, fd);
        return s->leases_mode ? -1 : fd;
    }
    if (note->slot < 0 || note->slot >= s->n_standby)
        return fd;
    struct standby_slot *slot = &s->standby[note->slot];
    if (note->kind == NOTE_READY) {
        answer_store(s, SBX_STEP_NONE, -1, 0);
    } else if (note->kind == NOTE_TAKEN) {
        slot->taken = 1;
        if (fd >= 0 && add_waiter(s, slot->pid, fd) == 0)
            fd = -1;
        if (!(((const struct sbx_header *)s->stored_blob)->opts & SBX_OPT_REAPER))
            slot->pid = 0; /* as_pid_1: no word comes once it runs */
    } else if (note->kind == NOTE_RUNNING) {
        slot->replace_at = sbx_now_ns() + REPLACE_DELAY_NS;
    }
    return fd;
}

/* Messages from standbys: ready, taken (with an as_pid_1 sandbox's status
 * fd), or a 16-byte report of why one failed before any request. */
void read_notes(struct tpl_server *s)
{
    for (;;) {
        union {
            struct standby_note note;
            struct sbx_report failure;
        } m;
        int fds[SBX_REQ_MAX_CGROUP], nfds = 0;
        ssize_t n = sbx_recv_fds_flags(s->notify_rd, &m, sizeof m, fds, SBX_REQ_MAX_CGROUP, &nfds, NULL, MSG_DONTWAIT);
        if (n <= 0)
            return;
        int fd = nfds ? fds[0] : -1;
        if (n == sizeof m.note && m.note.kind == NOTE_CGROUP) {
            add_cgroup_set(s, fds, nfds); /* a replacement's cgroups (kept or closed) */
            nfds = 0;
            fd = -1;
        }
        for (int k = 1; k < nfds; k++)
            close(fds[k]); /* only a cgroup set comes with more than one */
        if (n == sizeof m.failure) {
            standby_failed(s, m.failure.step, m.failure.op, m.failure.err);
            if (s->leases_mode)
                add_lease(s, fd); /* its lease, unused */
            fd = -1;
        } else if (n == sizeof m.note) {
            fd = take_note(s, &m.note, fd);
        }
        if (fd >= 0)
            close(fd);
    }
}

/* Reap every ended child: write the status of those that have a waiter;
 * free the slot of a standby that ended. */
void reap(struct tpl_server *s)
{
    int status;
    pid_t pid;
    read_notes(s); /* a taken standby said so before it could end */
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int k = 0; k < s->n_standby; k++) {
            if (s->standby[k].pid != pid)
                continue;
            /* A standby that fails to set up says why (a note) before it
             * exits; one that exits otherwise took a request (a sandbox
             * that ended before its command ran). One killed by a signal
             * has crashed. */
            read_notes(s);
            if (s->standby[k].pid == pid && !s->standby[k].taken && !s->standby_taken[k] && WIFSIGNALED(status))
                standby_failed(s, SBX_STEP_CRASHED, -1, WTERMSIG(status));
            if (s->standby[k].pid == pid)
                s->standby[k].pid = 0;
        }
        for (size_t k = 0; k < s->n_waiters; k++) {
            if (s->waiters[k].pid != pid)
                continue;
            sbx_write_all(s->waiters[k].status_fd, &status, sizeof status);
            close(s->waiters[k].status_fd);
            s->waiters[k] = s->waiters[--s->n_waiters];
            break;
        }
    }
}

/* A standby waiting for a request (set up, not taken). */
static int ready(const struct tpl_server *s, int k)
{
    return s->standby[k].pid && !s->standby[k].taken && !s->standby[k].replace_at && !s->standby_taken[k];
}

/* Whether slot k needs a new standby now. */
static int to_replace(const struct tpl_server *s, int k, int64_t now)
{
    if (!s->standby[k].pid)
        return 1;
    if (!s->standby[k].replace_at)
        return 0;
    for (int j = 0; j < s->n_standby; j++)
        if (j != k && ready(s, j))
            return now >= s->standby[k].replace_at;
    return 1;
}

int next_replacement(struct tpl_server *s)
{
    int64_t first = 0, now = sbx_now_ns();
    for (int k = 0; k < s->n_standby; k++)
        if (s->standby[k].pid && s->standby[k].replace_at && (!first || s->standby[k].replace_at < first))
            first = s->standby[k].replace_at;
    if (!s->standby_on || !first)
        return -1;
    return first <= now ? 0 : (int)((first - now + 999999) / 1000000);
}

/* None is made or being made (none can be, or none has a lease), so none
 * would read the standbys' requests. */
static int none_ready(struct tpl_server *s)
{
    if (!s->standby_on)
        return 1;
    for (int k = 0; k < s->n_standby; k++)
        if (ready(s, k))
            return 0;
    /* A recycled standby being reset is ready within a moment: the request
     * waits for it rather than for a sandbox the server would clone. */
    for (int k = 0; s->reset_blob && k < s->n_standby; k++)
        if (s->standby[k].pid && s->standby_taken[k] == TAKEN_RESETTING)
            return 0;
    return 1;
}

/* Recycled standbys wake the server only when that changes (standby.c,
 * tpl_take_request): one that takes a request while every other is busy,
 * one ready again while the server reads their socket. So the server says
 * it does before it reads their marks, as each of them marks itself before
 * it reads this: of two such writes, one is seen by the other's reader. */
int serving_fast(struct tpl_server *s)
{
    __atomic_store_n(s->serving, 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    int fast = none_ready(s);
    if (!fast)
        __atomic_store_n(s->serving, 0, __ATOMIC_SEQ_CST);
    return fast;
}

void make_standbys(struct tpl_server *s)
{
    int64_t now = sbx_now_ns();
    for (int k = 0; s->standby_on && k < s->n_standby; k++) {
        if (!to_replace(s, k, now))
            continue;
        if ((s->leases_mode && s->n_leases == 0) || (s->cgroup_k && s->n_cgroups == 0))
            continue; /* none to join, or no cgroup to enter: requests meanwhile are the server's */
        int lease = s->leases_mode ? s->leases[--s->n_leases] : -1;
        int *cgroup = s->cgroup_k ? s->cgroups[--s->n_cgroups] : NULL;
        s->standby[k].taken = 0;
        s->standby[k].replace_at = 0;
        s->standby_taken[k] = 0;
        s->standby[k].pid = make_standby(s, k, lease, cgroup);
        int err = errno;
        if (cgroup)
            close_all(cgroup, s->cgroup_k); /* the standby has its own copies (or there is none) */
        if (s->standby[k].pid < 0) {
            s->standby[k].pid = 0;
            add_lease(s, lease);
            standby_failed(s, SBX_STEP_CLONE, -1, err);
        } else if (lease >= 0) {
            close(lease); /* the standby has its own copy */
        }
    }
}
