/* sources.c: the sources of bind operations, as detached trees.
 *
 * - Sources are cloned with open_tree(OPEN_TREE_CLONE|AT_RECURSIVE) while the
 *   host tree is still the root: a symlinked source binds its target, and a
 *   recursive clone keeps submounts the kernel locked together visible.
 * - Flags are set on the detached clone with mount_setattr(AT_RECURSIVE):
 *   only ever *set* (nosuid, nodev, ro), so a flag the kernel locked in a less
 *   privileged namespace is never cleared, and read-only reaches every submount.
 * mounts.c attaches them.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <unistd.h>

/* The mount attributes an op's flags ask for, one for one. */
unsigned sbx_bind_attrs(uint32_t flags)
{
    unsigned attrs = 0;
    if (flags & SBX_F_NOSUID)
        attrs |= MOUNT_ATTR_NOSUID;
    if (flags & SBX_F_NODEV)
        attrs |= MOUNT_ATTR_NODEV;
    if (flags & SBX_F_RDONLY)
        attrs |= MOUNT_ATTR_RDONLY;
    return attrs;
}

/* A caller's fd as a bind source (SBX_F_FD_SOURCE, bwrap's --bind-fd): a
 * mount of the caller's namespace cannot be cloned from this one (EINVAL),
 * so the tree is cloned at the path the fd's magic link shows, as bwrap
 * does, and must be the fd's own file (else something was swapped in). */
static int clone_fd_source(struct sbx_ctx *c, uint32_t i, const char *link)
{
    char path[4096];
    struct stat want, got;
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0 || stat(link, &want) < 0)
        sbx_fail(c, SBX_STEP_SOURCE, (int)i, errno, SBX_D_SOURCE);
    path[n] = 0;
    int tree = sbx_open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        sbx_fail(c, SBX_STEP_SOURCE, (int)i, errno, SBX_D_SOURCE);
    if (fstat(tree, &got) < 0 || got.st_dev != want.st_dev || got.st_ino != want.st_ino)
        sbx_fail(c, SBX_STEP_SOURCE, (int)i, ESTALE, SBX_D_SOURCE);
    return tree;
}

/* Clone op i's source tree with its flags set; -1 if it is optional and missing. */
int sbx_clone_source(struct sbx_ctx *c, uint32_t i)
{
    const struct sbx_op *op = &c->ops[i];
    int bind = op->kind == SBX_OP_BIND;
    const char *src = bind ? sbx_str(c, op->src) : "/proc";
    unsigned attrs = bind ? sbx_bind_attrs(op->flags) : MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    int tree = bind && (op->flags & SBX_F_FD_SOURCE)
                   ? clone_fd_source(c, i, src)
                   : sbx_open_tree(AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0) {
        if (errno == ENOENT && (op->flags & SBX_F_OPTIONAL))
            return -1;
        sbx_fail(c, SBX_STEP_SOURCE, (int)i, errno, SBX_D_SOURCE);
    }
    if (sbx_mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, attrs, 0) < 0)
        sbx_fail(c, SBX_STEP_SOURCE, (int)i, errno, SBX_D_ATTR);
    return tree;
}

static int under(const char *path, const char *dir)
{
    size_t n = sbx_strlen(dir);
    for (size_t k = 0; k < n; k++)
        if (path[k] != dir[k])
            return 0;
    return path[n] == 0 || path[n] == '/' || (n == 1 && dir[0] == '/');
}

/* Sources the new root's tmpfs would change are cloned now, before it is
 * mounted: those under its host directory (the tmpfs covers them) and those
 * above it, such as "/" (a recursive clone taken later would carry the
 * tmpfs along, and the sandbox would see its own scaffolding at /tmp instead
 * of the host's /tmp). The others are cloned when their op runs, so a spec
 * with thousands of binds never holds thousands of fds at once. */
void sbx_open_sources(struct sbx_ctx *c)
{
    const char *newroot = sbx_str(c, c->h->newroot);
    int from_fd = 0;
    for (uint32_t i = 0; i < c->h->n_ops; i++) {
        const struct sbx_op *op = &c->ops[i];
        c->in.src_fds[i] = -1;
        if (op->kind == SBX_OP_BIND && (op->flags & SBX_F_FROM_FD))
            c->in.src_fds[i] = c->in.bind_fds[from_fd++];
        else if (op->kind == SBX_OP_BIND) {
            const char *src = sbx_str(c, op->src);
            /* an fd's path may be anywhere, under the new root's directory too */
            int early = under(src, newroot) || under(newroot, src) || (op->flags & SBX_F_FD_SOURCE);
            c->in.src_fds[i] = early ? sbx_clone_source(c, i) : SBX_SRC_DEFERRED;
        }
    }
}

int sbx_clone_tree_at(int root, const char *path, uint32_t flags)
{
    int at = sbx_openat2(root, path, O_PATH | O_CLOEXEC, 0, SBX_RESOLVE_INSIDE);
    if (at < 0)
        return -1;
    int tree = sbx_open_tree(at, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH);
    int err = errno;
    close(at);
    if (tree >= 0 && sbx_mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, sbx_bind_attrs(flags), 0) < 0) {
        err = errno;
        close(tree);
        tree = -1;
    }
    errno = err;
    return tree;
}
