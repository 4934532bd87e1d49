/* session_user.c: the ids and capabilities of a Session's command.
 *
 * In a session with several ids mapped, pid 1 keeps CAP_SETUID, CAP_SETGID
 * and CAP_SETPCAP in its user namespace (beyond the Spec's capabilities:
 * raised as ambient by the setup child, so they survive the exec of
 * sandbox-session); no command may hold more than the Spec grants. So, in
 * this order:
 * 1. pid 1, once as it starts, shrinks its bounding set to the Spec's
 *    capabilities (session_shrink_bounding; PR_CAPBSET_DROP needs
 *    CAP_SETPCAP), so no exec in the session can regain the others,
 *    whatever file capabilities or uid 0 would give. That leaves its
 *    permitted and effective sets as they were, and every process it forks
 *    inherits the bounding set. Then each call process, single-threaded
 *    and before its command exists:
 * 2. with SBX_SESSION_USER, takes the request's ids: setgroups, setresgid,
 *    setresuid, as raw system calls (one thread: nothing to signal). The
 *    kernel refuses an id the namespace does not map (EINVAL). Leaving uid
 *    0 clears the permitted, effective and ambient sets (the setuid fixup;
 *    only the command as uid 0 keeps capabilities, and it never leaves 0);
 * 3. sets effective, permitted and inheritable (and so ambient, which
 *    carries them across the exec of a file without capabilities): the
 *    Spec's set, as sbx_drop_caps gives a fresh sandbox's command, when the
 *    command runs as uid 0 or without `user=`; none at all when `user=`
 *    names a uid other than 0 (docker's rule for a non-root user: only
 *    the bounding set stays the Spec's, the most any exec could give back,
 *    and no_new_privs keeps a setuid-root file from giving it). A later
 *    setuid() needs CAP_SETUID, which is gone from every set, so the
 *    command cannot take another id back.
 * With new ids the call process makes itself non-dumpable again (a change
 * of ids resets the flag to fs.suid_dumpable), so its command, now of the
 * same uid, cannot ptrace it. no_new_privs, Landlock and the seccomp
 * filter are pid 1's, inherited unchanged.
 *
 * With one id mapped, pid 1 holds the Spec's set and nothing to switch
 * with: a `user=` request names pid 1's own ids (the caller checked), and
 * when they are not uid 0 the call process drops every capability it holds
 * (lowering them needs no privilege), bounding set aside. */
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

int session_shrink_bounding(uint64_t keep)
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
    if (syscall(SYS_setgroups, (size_t)call->n_groups, call->groups) < 0)
        return failed_at(step, SBX_STEP_SETGROUPS);
    if (syscall(SYS_setresgid, call->gid, call->gid, call->gid) < 0)
        return failed_at(step, SBX_STEP_GID_MAP);
    if (syscall(SYS_setresuid, call->uid, call->uid, call->uid) < 0)
        return failed_at(step, SBX_STEP_UID_MAP);
    return 0;
}

/* Effective, permitted and inheritable to `caps`: one capset, which also
 * lowers the ambient set to what stays both permitted and inheritable.
 * pid 1's ambient set holds the Spec's capabilities (the setup child
 * raised them, sbx_drop_caps), and only leaving uid 0 clears it, when
 * `caps` is 0 anyway: so the command keeps exactly the ambient set a fresh
 * sandbox's command has. Each call that changes capabilities commits new
 * credentials (the old ones freed through RCU): one, not one per cap. */
static int keep_only(uint64_t caps)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    data[0].effective = data[0].permitted = data[0].inheritable = (uint32_t)caps;
    data[1].effective = data[1].permitted = data[1].inheritable = (uint32_t)(caps >> 32);
    return (int)syscall(SYS_capset, &hdr, data);
}

/* One id mapped: `user=` can only name pid 1's own ids; not uid 0, it
 * keeps no capability. The ambient set is a subset of permitted and
 * inheritable, so with both empty there is nothing to drop. */
static int one_id_user(const struct session_call *call, int *step)
{
    if (call->uid != getuid() || call->gid != getgid()) {
        errno = EPERM;
        return failed_at(step, SBX_STEP_UID_MAP);
    }
    if (call->uid == 0)
        return 0;
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    if (syscall(SYS_capget, &hdr, data) < 0)
        return failed_at(step, SBX_STEP_CAPS);
    if (!(data[0].permitted | data[1].permitted | data[0].inheritable | data[1].inheritable))
        return 0;
    return keep_only(0) < 0 ? failed_at(step, SBX_STEP_CAPS) : 0;
}

int session_take_user(const struct session_call *call, int *step)
{
    if (!call->setid)
        return call->flags & SBX_SESSION_USER ? one_id_user(call, step) : 0;
    int user = (call->flags & SBX_SESSION_USER) != 0;
    if (user && switch_ids(call, step) < 0)
        return -1;
    if (keep_only(user && call->uid != 0 ? 0 : call->keep) < 0)
        return failed_at(step, SBX_STEP_CAPS);
    /* new ids reset the dumpable flag (to fs.suid_dumpable); a lowered
     * capability set alone does not: without them, pid 1's 0 is inherited */
    if (user && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        return failed_at(step, SBX_STEP_SESSION);
    return 0;
}
