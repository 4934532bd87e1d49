/* idmap.c: user namespace id maps.
 *
 * A process that has just entered a new user namespace may write its own
 * uid_map and gid_map once, mapping exactly its own outer id (the
 * "unprivileged" form: one line, one id). For gid_map that is only allowed
 * after "deny" has been written to setgroups, so that dropping groups can
 * never grant access that a negative group ACL forbade on the host.
 */
#include "internal.h"

#include <errno.h>
#include <sched.h>

static void write_map(struct sbx_ctx *c, const char *file, unsigned inside, unsigned outside, int step)
{
    char line[64];
    char *w = sbx_fmt_uint(line, inside, 10);
    *w++ = ' ';
    w = sbx_fmt_uint(w, outside, 10);
    sbx_stpcpy(w, " 1\n");
    if (sbx_write_file(file, line) < 0)
        sbx_fail(c, step, -1, errno, SBX_D_NONE);
}

static void map_self(struct sbx_ctx *c, unsigned uid, unsigned gid, unsigned outer_uid, unsigned outer_gid)
{
    if (sbx_write_file("/proc/self/setgroups", "deny") < 0 && errno != ENOENT)
        sbx_fail(c, SBX_STEP_SETGROUPS, -1, errno, SBX_D_NONE);
    write_map(c, "/proc/self/uid_map", uid, outer_uid, SBX_STEP_UID_MAP);
    write_map(c, "/proc/self/gid_map", gid, outer_gid, SBX_STEP_GID_MAP);
}

/* Map the ids seen during setup: the final ones, or 0 when devpts needs root. */
void sbx_setup_userns(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    if (!(h->ns & SBX_NS_USER))
        return;
    if (h->opts & SBX_OPT_MAP_ROOT_FIRST)
        map_self(c, 0, 0, h->host_uid, h->host_gid);
    else
        map_self(c, h->uid, h->gid, h->host_uid, h->host_gid);
}

/* After setup as root-in-namespace, enter a nested user namespace whose only
 * ids are the requested ones. The sandbox then does not own the namespaces
 * its mounts live in, so even with capabilities it cannot undo them. */
void sbx_nested_userns(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    if (!(h->opts & SBX_OPT_MAP_ROOT_FIRST))
        return;
    if (unshare(CLONE_NEWUSER) < 0)
        sbx_fail(c, SBX_STEP_NESTED_USERNS, -1, errno, SBX_D_NONE);
    map_self(c, h->uid, h->gid, 0, 0);
}
