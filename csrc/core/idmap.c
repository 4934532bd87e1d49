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
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

/* Write `text` to a file of our /proc/<pid> directory. The directory fd was
 * opened before the pivot, so this works even in a sandbox without /proc. */
static int write_proc(struct sbx_ctx *c, const char *name, const char *text)
{
    return sbx_write_file(c->proc_fd, name, text);
}

static void write_map(struct sbx_ctx *c, const char *file, unsigned inside, unsigned outside, int step)
{
    char line[64];
    char *w = sbx_fmt_uint(line, inside, 10);
    *w++ = ' ';
    w = sbx_fmt_uint(w, outside, 10);
    sbx_stpcpy(w, " 1\n");
    if (write_proc(c, file, line) < 0)
        sbx_fail(c, step, -1, errno, SBX_D_NONE);
}

static void map_self(struct sbx_ctx *c, unsigned uid, unsigned gid, unsigned outer_uid, unsigned outer_gid)
{
    if (write_proc(c, "setgroups", "deny") < 0 && errno != ENOENT)
        sbx_fail(c, SBX_STEP_SETGROUPS, -1, errno, SBX_D_NONE);
    write_map(c, "uid_map", uid, outer_uid, SBX_STEP_UID_MAP);
    write_map(c, "gid_map", gid, outer_gid, SBX_STEP_GID_MAP);
}

/* The ids the first user namespace maps: 0 when devpts needs root during
 * setup, else the final ones. */
static void setup_ids(const struct sbx_header *h, unsigned *uid, unsigned *gid)
{
    int root = (h->opts & SBX_OPT_MAP_ROOT_FIRST) != 0;
    *uid = root ? 0 : h->uid;
    *gid = root ? 0 : h->gid;
}

void sbx_setup_userns(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    unsigned uid, gid;
    if (!(h->ns & SBX_NS_USER))
        return;
    c->proc_fd = sbx_proc_open(c, "self", O_PATH | O_DIRECTORY);
    if (c->proc_fd < 0)
        sbx_fail(c, SBX_STEP_UID_MAP, -1, errno, SBX_D_NONE);
    if ((h->opts & SBX_OPT_SYNC) && h->userns_block_fd >= 0) {
        /* bwrap's --userns-block-fd: the caller writes the maps, then says so */
        sbx_block_on(h->userns_block_fd);
    } else {
        setup_ids(h, &uid, &gid);
        map_self(c, uid, gid, h->host_uid, h->host_gid);
    }
    /* The limit lives in this namespace's sysctl view, written while the
     * host /proc is still reachable (the sandbox's /proc/sys is read-only). */
    if (h->opts & SBX_OPT_DISABLE_USERNS) {
        int sys = sbx_proc_open(c, "sys/user", O_PATH | O_DIRECTORY);
        if (sys < 0 || sbx_write_file(sys, "max_user_namespaces", "1") < 0)
            sbx_fail(c, SBX_STEP_DISABLE_USERNS, -1, errno, SBX_D_NONE);
        close(sys);
    }
}

/* After setup, enter a nested user namespace whose only ids are the final
 * ones. The sandbox then does not own the namespaces its mounts, hostname
 * and network live in, so even capabilities could not undo them.
 * With DISABLE_USERNS (bwrap's --disable-userns), the outer namespace's
 * user.max_user_namespaces was set to 1 during setup: the nested namespace
 * uses it up, and the count is charged up the hierarchy, so nothing inside
 * can create another one. That is checked here, before the command runs. */
void sbx_nested_userns(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    unsigned uid, gid;
    if (!(h->opts & SBX_OPT_NESTED_USERNS))
        return;
    if (unshare(CLONE_NEWUSER) < 0)
        sbx_fail(c, SBX_STEP_NESTED_USERNS, -1, errno, SBX_D_NONE);
    setup_ids(h, &uid, &gid);
    map_self(c, h->uid, h->gid, uid, gid);
    if ((h->opts & SBX_OPT_DISABLE_USERNS) && unshare(CLONE_NEWUSER) == 0)
        sbx_fail(c, SBX_STEP_DISABLE_USERNS, -1, EEXIST, SBX_D_NONE);
}
