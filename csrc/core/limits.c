/* limits.c: the sandbox's cgroups (entered first), and what the child sets
 * just before exec: rlimits, the fd table, capabilities and the seccomp
 * filter. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* Move this process into the sandbox's cgroups: "0" names the writer. The
 * fds were opened by the caller, so only a write(2) is needed here. */
void sbx_enter_cgroups(struct sbx_ctx *c)
{
    for (int i = 0; i < c->in.n_cgroup; i++)
        if (sbx_write_all(c->in.cgroup_fds[i], "0", 1) < 0)
            sbx_fail(c, SBX_STEP_CGROUP, i, errno, SBX_D_NONE);
}

void sbx_apply_rlimits(struct sbx_ctx *c)
{
    const struct sbx_rlimit *rl = (const void *)(c->in.blob + c->h->rlimits_off);
    /* The plan already capped each value at the caller's hard limit. */
    for (uint32_t i = 0; i < c->h->n_rlimits; i++) {
        if (sbx_set_rlimit((int)rl[i].resource, rl[i].value, rl[i].value) < 0)
            sbx_fail(c, SBX_STEP_RLIMIT, (int)i, errno, SBX_D_NONE);
    }
}

/* A Template's sandbox receives its pass_fds wherever the server's fd
 * table had room; they must have the caller's numbers inside. Everything
 * the remaining steps use that lies below the highest target is first
 * moved above it (so no dup2 below can overwrite it), then each passed fd
 * is dup'd onto its target. */
void sbx_place_fds(struct sbx_ctx *c)
{
    if (!c->in.fd_targets)
        return;
    int base = 3;
    for (int k = 0; k < c->in.n_pass; k++)
        if ((int)c->in.fd_targets[k] >= base)
            base = (int)c->in.fd_targets[k] + 1;
    /* and a Template's sandbox's own: the server's notify socket, its lease */
    int *keep[] = {&c->in.stdio[0], &c->in.stdio[1], &c->in.stdio[2], &c->in.err_fd, &c->in.status_fd, &c->in.init_fd,
                   &c->keep_fd, &c->in.lease_fd};
    for (size_t k = 0; k < sizeof keep / sizeof *keep; k++) {
        if (*keep[k] < 0 || *keep[k] >= base)
            continue;
        int hi = fcntl(*keep[k], F_DUPFD_CLOEXEC, base);
        if (hi < 0)
            sbx_fail(c, SBX_STEP_FDS, *keep[k], errno, SBX_D_NONE);
        *keep[k] = hi;
    }
    int *pass = (int *)c->in.pass_fds; /* the child's own copy of the list */
    for (int k = 0; k < c->in.n_pass; k++) {
        if (pass[k] >= base)
            continue;
        int hi = fcntl(pass[k], F_DUPFD_CLOEXEC, base);
        if (hi < 0)
            sbx_fail(c, SBX_STEP_FDS, (int)c->in.fd_targets[k], errno, SBX_D_NONE);
        pass[k] = hi;
    }
    for (int k = 0; k < c->in.n_pass; k++) {
        if (dup2(pass[k], (int)c->in.fd_targets[k]) < 0)
            sbx_fail(c, SBX_STEP_FDS, (int)c->in.fd_targets[k], errno, SBX_D_NONE);
        pass[k] = (int)c->in.fd_targets[k];
    }
}

/* Move the caller's stdio fds to 0-2 and leave open only those, the
 * pass_fds, and the `n` internal fds of `keep` (-1: none) until exec: every
 * other fd is marked close-on-exec in one close_range() call per gap. */
void sbx_setup_stdio_fds(struct sbx_ctx *c, const int *keep, int n)
{
    int src[3];
    for (int i = 0; i < 3; i++) {
        src[i] = c->in.stdio[i];
        /* an fd that is itself 0-2 could be overwritten by an earlier dup2 */
        if (src[i] >= 0 && src[i] < 3 && src[i] != i) {
            src[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3);
            if (src[i] < 0)
                sbx_fail(c, SBX_STEP_STDIO, i, errno, SBX_D_NONE);
        }
    }
    for (int i = 0; i < 3; i++) {
        if (src[i] < 0 || src[i] == i) {
            if (src[i] == i && fcntl(i, F_SETFD, 0) < 0)
                sbx_fail(c, SBX_STEP_STDIO, i, errno, SBX_D_NONE);
            continue;
        }
        if (dup2(src[i], i) < 0)
            sbx_fail(c, SBX_STEP_STDIO, i, errno, SBX_D_NONE);
    }
    unsigned lo = 3;
    for (int k = 0; k < c->in.n_pass; k++) {
        int fd = c->in.pass_fds[k];
        if (fd < 3)
            continue;
        if (fcntl(fd, F_SETFD, 0) < 0)
            sbx_fail(c, SBX_STEP_FDS, fd, errno, SBX_D_NONE);
        if ((unsigned)fd > lo && syscall(SYS_close_range, lo, (unsigned)fd - 1, CLOSE_RANGE_CLOEXEC) < 0)
            sbx_fail(c, SBX_STEP_FDS, fd, errno, SBX_D_NONE);
        lo = (unsigned)fd + 1;
    }
    if (syscall(SYS_close_range, lo, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
        sbx_fail(c, SBX_STEP_FDS, -1, errno, SBX_D_NONE);
    for (int k = 0; k < n; k++)
        if (keep[k] >= 0 && fcntl(keep[k], F_SETFD, 0) < 0)
            sbx_fail(c, SBX_STEP_FDS, keep[k], errno, SBX_D_NONE);
}

/* Keep only the capabilities in keep_caps: shrink the bounding set (so no
 * exec can regain the others; bwrap leaves it as it is without a user
 * namespace, relying on NO_NEW_PRIVS alone). With SBX_OPT_CAPS_AS_CALLER
 * (keep_caps is the root caller's own set, bwrap's default) nothing else
 * changes, so inheritable and ambient stay the caller's, as under bwrap.
 * Otherwise effective/permitted/inheritable become keep_caps, and the kept
 * ones are raised as ambient so a non-root command still holds them. */
void sbx_drop_caps(struct sbx_ctx *c)
{
    uint64_t keep = c->h->keep_caps;
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};

    if (syscall(SYS_capget, &hdr, data) < 0)
        sbx_fail(c, SBX_STEP_CAPS, -1, errno, SBX_D_NONE);
    uint64_t permitted = data[0].permitted | (uint64_t)data[1].permitted << 32;
    if (!permitted && !keep)
        return; /* nothing to drop; NO_NEW_PRIVS stops any gain at exec */
    for (int cap = 0; cap <= 63; cap++) {
        if (keep & (1ULL << cap))
            continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0)
            continue;
        /* EINVAL: past the kernel's last capability (they are numbered
         * without gaps), so every higher one is unknown to it too */
        if (errno == EINVAL)
            break;
        sbx_fail(c, SBX_STEP_CAPS, cap, errno, SBX_D_NONE);
    }
    if (c->h->opts & SBX_OPT_CAPS_AS_CALLER)
        return; /* bwrap's root default: nothing else changes */
    data[0].effective = data[0].permitted = data[0].inheritable = (uint32_t)keep;
    data[1].effective = data[1].permitted = data[1].inheritable = (uint32_t)(keep >> 32);
    if (syscall(SYS_capset, &hdr, data) < 0)
        sbx_fail(c, SBX_STEP_CAPS, -1, errno, SBX_D_NONE);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        sbx_fail(c, SBX_STEP_CAPS, -1, errno, SBX_D_NONE);
    for (int cap = 0; cap <= 63; cap++)
        if ((keep & (1ULL << cap)) && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0)
            sbx_fail(c, SBX_STEP_CAPS, cap, errno, SBX_D_NONE);
}

void sbx_no_new_privs(struct sbx_ctx *c)
{
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        sbx_fail(c, SBX_STEP_NO_NEW_PRIVS, -1, errno, SBX_D_NONE);
}

void sbx_install_seccomp(struct sbx_ctx *c)
{
    if (!c->h->seccomp_len)
        return;
    struct sock_fprog prog = {
        .len = (unsigned short)(c->h->seccomp_len / 8),
        .filter = (struct sock_filter *)(c->in.blob + c->h->seccomp_off),
    };
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
        sbx_fail(c, SBX_STEP_SECCOMP, -1, errno, SBX_D_NONE);
}
