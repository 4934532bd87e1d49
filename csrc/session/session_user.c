/* session_user.c: the ids and capabilities of a Session's command.
 *
 * In a session with several ids mapped, pid 1 keeps CAP_SETUID, CAP_SETGID
 * and CAP_SETPCAP in its user namespace (beyond the Spec's capabilities:
 * raised as ambient by the setup child, so they survive the exec of
 * sandbox-session); every command must hold exactly what a fresh sandbox of
 * the Spec gives its command. So each call process, single-threaded and
 * before its command exists, in this order:
 * 1. shrinks the bounding set to the Spec's capabilities (PR_CAPBSET_DROP
 *    needs CAP_SETPCAP, still effective here), so no exec can regain the
 *    others, whatever file capabilities or uid 0 would give;
 * 2. with SBX_SESSION_USER, takes the request's ids: setgroups, setresgid,
 *    setresuid, as raw system calls (one thread: nothing to signal). Under
 *    PR_SET_KEEPCAPS, since leaving uid 0 would clear the permitted set
 *    before step 3 could choose what stays. The kernel refuses an id the
 *    namespace does not map (EINVAL);
 * 3. sets effective, permitted and inheritable to the Spec's capabilities
 *    and raises them as ambient, as sbx_drop_caps does for a fresh sandbox,
 *    then clears KEEPCAPS: a later setuid() needs CAP_SETUID, which is gone
 *    from every set, so the command cannot take another id back.
 * The call process then stays non-dumpable (a change of ids resets the
 * flag to fs.suid_dumpable), so its command, now of the same uid, cannot
 * ptrace it. no_new_privs, Landlock and the seccomp filter are pid 1's,
 * inherited unchanged. */
#include "session.h"

#include <errno.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int failed_at(int *step, int which)
{
    *step = which;
    return -1;
}

static int shrink_bounding(uint64_t keep)
{
    for (int cap = 0; cap <= 63; cap++) {
        if (keep & (1ULL << cap))
            continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0)
            continue;
        if (errno == EINVAL) /* past the kernel's last capability */
            return 0;
        return -1;
    }
    return 0;
}

static int switch_ids(const struct session_call *call, int *step)
{
    if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0)
        return failed_at(step, SBX_STEP_CAPS);
    if (syscall(SYS_setgroups, (size_t)call->n_groups, call->groups) < 0)
        return failed_at(step, SBX_STEP_SETGROUPS);
    if (syscall(SYS_setresgid, call->gid, call->gid, call->gid) < 0)
        return failed_at(step, SBX_STEP_GID_MAP);
    if (syscall(SYS_setresuid, call->uid, call->uid, call->uid) < 0)
        return failed_at(step, SBX_STEP_UID_MAP);
    return 0;
}

static int keep_only(uint64_t keep)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    data[0].effective = data[0].permitted = data[0].inheritable = (uint32_t)keep;
    data[1].effective = data[1].permitted = data[1].inheritable = (uint32_t)(keep >> 32);
    if (syscall(SYS_capset, &hdr, data) < 0)
        return -1;
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        return -1;
    for (int cap = 0; cap <= 63; cap++)
        if ((keep & (1ULL << cap)) && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0)
            return -1;
    return prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0);
}

int session_take_user(const struct session_call *call, int *step)
{
    if (!call->setid) {
        /* one id: pid 1 holds nothing to switch with (the caller never asks) */
        errno = EPERM;
        return call->flags & SBX_SESSION_USER ? failed_at(step, SBX_STEP_UID_MAP) : 0;
    }
    if (shrink_bounding(call->keep) < 0)
        return failed_at(step, SBX_STEP_CAPS);
    if ((call->flags & SBX_SESSION_USER) && switch_ids(call, step) < 0)
        return -1;
    if (keep_only(call->keep) < 0)
        return failed_at(step, SBX_STEP_CAPS);
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        return failed_at(step, SBX_STEP_SESSION);
    return 0;
}
