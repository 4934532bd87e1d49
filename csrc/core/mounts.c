/* mounts.c: build the new root and apply the plan's operations in order.
 *
 * Kernel mechanisms, in the order they are used:
 * - Sources are cloned (sources.c) with open_tree(OPEN_TREE_CLONE|
 *   AT_RECURSIVE) while the host tree is still the root, their flags set on
 *   the detached clone.
 * - The new root is a tmpfs on a host directory of this private mount
 *   namespace. Destinations are opened with openat2(RESOLVE_IN_ROOT), which
 *   resolves '..' and absolute symlinks as if the new root were '/', so no
 *   destination can lead out to the host (bwrap's CVE-2026-87766). Missing
 *   parents are created one component at a time with mkdirat() on a parent
 *   that was itself resolved that way.
 * - Trees are attached with move_mount() onto those fds; fresh filesystems
 *   (tmpfs, proc, devpts, mqueue, overlay) come from fsopen()/fsmount().
 * - pivot_root(".", ".") stacks the old root on the new one; a lazy unmount
 *   of "." then drops the host tree from the namespace.
 * - In place (newroot "/", a Template's sandbox): the root is the copy of
 *   the template's prepared tree this mount namespace starts with; the ops
 *   (fresh filesystems, private files, per-call binds) go on top of it, and
 *   there is nothing to pivot. Every source is then a path of that copy,
 *   cloned before the first op covers anything, or (a per-call bind) a tree
 *   the server cloned from the copy of the host tree it keeps: a detached
 *   tree can be attached in another mount namespace than the one it was
 *   cloned in, by whoever may mount there.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define EMPTY_PATHS (MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH)

static const char *const dev_nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
static const char *const dev_links[][2] = {
    {"fd", "/proc/self/fd"},         {"stdin", "/proc/self/fd/0"},
    {"stdout", "/proc/self/fd/1"},   {"stderr", "/proc/self/fd/2"},
    {"core", "/proc/kcore"},         {"ptmx", "pts/ptmx"},
};

static int open_inside(struct sbx_ctx *c, const char *path, uint64_t flags)
{
    return sbx_openat2(c->root_fd, path, flags | O_CLOEXEC, 0, SBX_RESOLVE_INSIDE);
}

/* Open the parent directory of `path` inside the new root, creating missing
 * components with `pmode`. Copies the last component into `name`. */
static int open_parent(struct sbx_ctx *c, int i, const char *path, uint32_t pmode, char name[256])
{
    char buf[4096];
    size_t len = sbx_strlen(path);
    if (len >= sizeof buf)
        sbx_fail(c, SBX_STEP_OP, i, ENAMETOOLONG, SBX_D_PARENTS);
    sbx_stpcpy(buf, path);
    size_t last = len;
    while (last > 0 && buf[last - 1] != '/')
        last--;
    if (len - last >= 256 || last == len)
        sbx_fail(c, SBX_STEP_OP, i, len - last >= 256 ? ENAMETOOLONG : EEXIST, SBX_D_CREATE);
    sbx_stpcpy(name, buf + last);
    buf[last > 1 ? last - 1 : 1] = 0; /* the parent: "/a/b" or "/" */

    int fd = open_inside(c, buf, O_PATH | O_DIRECTORY);
    if (fd >= 0 || errno != ENOENT) {
        if (fd < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_PARENTS);
        return fd;
    }
    /* Walk down from the root, creating each missing component. */
    int cur = open_inside(c, "/", O_PATH | O_DIRECTORY);
    for (size_t k = 1; cur >= 0; k++) {
        if (buf[k] != '/' && buf[k] != 0)
            continue;
        char saved = buf[k];
        buf[k] = 0;
        const char *comp = buf + k;
        while (comp > buf && comp[-1] != '/')
            comp--;
        int next = open_inside(c, buf, O_PATH | O_DIRECTORY);
        if (next < 0 && errno == ENOENT) {
            if (mkdirat(cur, comp, pmode) < 0 && errno != EEXIST)
                sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_PARENTS);
            next = open_inside(c, buf, O_PATH | O_DIRECTORY);
        }
        if (next < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_PARENTS);
        close(cur);
        cur = next;
        buf[k] = saved;
        if (!saved)
            return cur;
    }
    sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_PARENTS);
}

/* Open (creating if needed) a directory or an empty file to mount on.
 * The kernel refuses to attach a directory on a non-directory or the
 * reverse (EINVAL from move_mount); bwrap finds out earlier, making the
 * mount point (ensure_dir: ENOTDIR, ensure_file: EISDIR): report it so. */
static int mountpoint(struct sbx_ctx *c, int i, const char *path, int is_dir, uint32_t pmode)
{
    int fd = open_inside(c, path, O_PATH);
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode) == !!is_dir)
            sbx_fail(c, SBX_STEP_OP, i, is_dir ? ENOTDIR : EISDIR, SBX_D_CREATE);
        return fd;
    }
    if (errno != ENOENT)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_RESOLVE);
    char name[256];
    int parent = open_parent(c, i, path, pmode, name);
    if (is_dir) {
        if (mkdirat(parent, name, 0755) < 0 && errno != EEXIST)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
    } else {
        int f = openat(parent, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0444);
        if (f < 0 && errno != EEXIST)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
        if (f >= 0)
            close(f);
    }
    close(parent);
    fd = open_inside(c, path, O_PATH);
    if (fd < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_RESOLVE);
    return fd;
}

/* Attach the tree `tree` on `dest`; if that covered the new root itself,
 * reopen the root so later lookups start on top of the new mount. */
static void attach(struct sbx_ctx *c, int i, int tree, int dest, const char *path)
{
    if (sbx_move_mount(tree, "", dest, "", EMPTY_PATHS) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    if (path[0] == '/' && path[1] == 0) {
        int fd = open(sbx_str(c, c->h->newroot), O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_RESOLVE);
        close(c->root_fd);
        c->root_fd = fd;
    }
}

/* A fresh filesystem of `type`, configured with key/value pairs, as a
 * detached mount fd. */
static int fresh_fs(struct sbx_ctx *c, int i, const char *type, const char *const *kv, unsigned attrs)
{
    int fs = sbx_fsopen(type, FSOPEN_CLOEXEC);
    if (fs < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    for (; kv && kv[0]; kv += 2)
        if (sbx_fsconfig(fs, FSCONFIG_SET_STRING, kv[0], kv[1], 0) < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    if (sbx_fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    int mnt = sbx_fsmount(fs, FSMOUNT_CLOEXEC, attrs);
    if (mnt < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    close(fs);
    return mnt;
}

/* Clone `name` under `dirfd` (or an absolute host path) as a detached tree
 * with `attrs` set, and attach it on `dest_fd`. */
static void rebind(struct sbx_ctx *c, int i, int src_fd, const char *src, unsigned attrs, int recursive, int dest_fd)
{
    unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0);
    int tree = src_fd >= 0 ? sbx_open_tree(src_fd, "", flags | AT_EMPTY_PATH) : sbx_open_tree(AT_FDCWD, src, flags);
    if (tree < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_SOURCE);
    if (sbx_mount_setattr(tree, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), attrs, 0) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_ATTR);
    if (sbx_move_mount(tree, "", dest_fd, "", EMPTY_PATHS) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    close(tree);
}

/* overlayfs, made in the sandbox's user namespace (allowed since 5.11):
 * - "userxattr": its markers are user.overlay.* xattrs (trusted.* needs
 *   CAP_SYS_ADMIN in the initial namespace); it also turns redirect_dir and
 *   metacopy off, so no xattr of a layer makes overlay follow a path.
 * - one "lowerdir+" per layer, top first, as an fd: no option string limits them.
 * - upper and work: a fresh tmpfs's, as fds (FSCONFIG_SET_FD, 6.13), or
 *   upper/ and work/ of a host directory kept. overlay clones each layer's
 *   mount privately, which must be one of this namespace (a detached one:
 *   EINVAL), so the tmpfs is attached on the new root's host directory,
 *   where the new root's tmpfs covers it and the pivot drops it.
 * - without an upper, a single layer gets an empty directory beneath it.
 * Built before the new root's tmpfs hides any host path (overlay resolves
 * a layer at fsconfig time), kept in src_fds[i] for its op to attach. */
static void ovl_set(struct sbx_ctx *c, int i, int fs, unsigned cmd, const char *key, const void *value, int aux)
{
    if (sbx_fsconfig(fs, cmd, key, value, aux) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_SOURCE);
}

/* Directory `name` under `at` as the fd `key` names: made if missing, but a
 * layer (a path: fsconfig would take at most 255 bytes of one as a string). */
static void ovl_dir_fd(struct sbx_ctx *c, int i, int fs, int at, const char *name, const char *key)
{
    if (at != AT_FDCWD && mkdirat(at, name, 0755) < 0 && errno != EEXIST)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | (at == AT_FDCWD ? 0 : O_NOFOLLOW) | O_CLOEXEC);
    if (fd < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_SOURCE);
    ovl_set(c, i, fs, FSCONFIG_SET_FD, key, NULL, fd);
    close(fd);
}

/* The first pass: the layers and a kept upper; the context's fd. */
static int overlay_layers(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    int fs = sbx_fsopen("overlay", FSOPEN_CLOEXEC);
    if (fs < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    ovl_set(c, i, fs, FSCONFIG_SET_FLAG, "userxattr", NULL, 0);
    for (uint32_t k = 0; k < op->data_len; k += (uint32_t)sbx_strlen(c->in.blob + op->data + k) + 1)
        ovl_dir_fd(c, i, fs, AT_FDCWD, c->in.blob + op->data + k, "lowerdir+");
    if (op->src) {
        if (mkdir(sbx_str(c, op->src), 0700) < 0 && errno != EEXIST)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
        int dir = open(sbx_str(c, op->src), O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_SOURCE);
        ovl_dir_fd(c, i, fs, dir, "upper", "upperdir");
        ovl_dir_fd(c, i, fs, dir, "work", "workdir");
        close(dir);
    }
    return fs;
}

/* The second pass: a tmpfs's upper (or empty lower), then the mount. */
static int overlay_tree(struct sbx_ctx *c, int i, const struct sbx_op *op, int fs)
{
    char size[32];
    const char *kv[] = {"mode", "755", op->size ? "size" : NULL, size, NULL};
    sbx_fmt_uint(size, op->size, 10);
    int single = op->data_len == sbx_strlen(c->in.blob + op->data) + 1;
    if (!op->src && (!(op->flags & SBX_F_RDONLY) || single)) {
        int mnt = fresh_fs(c, i, "tmpfs", kv, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
        if (sbx_move_mount(mnt, "", AT_FDCWD, sbx_str(c, c->h->newroot), MOVE_MOUNT_F_EMPTY_PATH) < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
        close(mnt);
        int tmp = open(sbx_str(c, c->h->newroot), O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (tmp < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_RESOLVE);
        ovl_dir_fd(c, i, fs, tmp, (op->flags & SBX_F_RDONLY) ? "empty" : "upper",
                   (op->flags & SBX_F_RDONLY) ? "lowerdir+" : "upperdir");
        if (!(op->flags & SBX_F_RDONLY))
            ovl_dir_fd(c, i, fs, tmp, "work", "workdir");
        close(tmp);
    }
    if (sbx_fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    int mnt = sbx_fsmount(fs, FSMOUNT_CLOEXEC, sbx_bind_attrs(op->flags));
    if (mnt < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    close(fs);
    return mnt;
}

/* Every overlay's host paths resolved before a tmpfs covers the new root's directory. */
static void open_overlays(struct sbx_ctx *c)
{
    for (uint32_t i = 0; i < c->h->n_ops; i++)
        if (c->ops[i].kind == SBX_OP_OVERLAY)
            c->in.src_fds[i] = overlay_layers(c, (int)i, &c->ops[i]);
    for (uint32_t i = 0; i < c->h->n_ops; i++)
        if (c->ops[i].kind == SBX_OP_OVERLAY)
            c->in.src_fds[i] = overlay_tree(c, (int)i, &c->ops[i], c->in.src_fds[i]);
}

static void op_overlay(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    int fd = mountpoint(c, i, sbx_str(c, op->dest), 1, op->parent_mode);
    attach(c, i, c->in.src_fds[i], fd, sbx_str(c, op->dest));
    close(fd);
    close(c->in.src_fds[i]);
    c->in.src_fds[i] = -1;
}

int sbx_in_place(const struct sbx_ctx *c)
{
    const char *dir = sbx_str(c, c->h->newroot);
    return dir[0] == '/' && dir[1] == 0;
}

void sbx_make_newroot(struct sbx_ctx *c)
{
    const char *dir = sbx_str(c, c->h->newroot);
    open_overlays(c);
    if (sbx_in_place(c)) {
        c->root_fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (c->root_fd < 0)
            sbx_fail(c, SBX_STEP_NEWROOT, -1, errno, SBX_D_RESOLVE);
        return;
    }
    if (mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") < 0)
        sbx_fail(c, SBX_STEP_NEWROOT, -1, errno, SBX_D_MOUNT);
    c->root_fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (c->root_fd < 0)
        sbx_fail(c, SBX_STEP_NEWROOT, -1, errno, SBX_D_RESOLVE);
}

static void op_bind(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    int tree = c->in.src_fds[i] == SBX_SRC_DEFERRED ? sbx_clone_source(c, (uint32_t)i) : c->in.src_fds[i];
    struct stat st;
    if (tree < 0)
        return; /* optional source missing: skipped, as bwrap's -try */
    if (fstat(tree, &st) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_SOURCE);
    const char *dest = sbx_str(c, op->dest);
    int fd = mountpoint(c, i, dest, S_ISDIR(st.st_mode), op->parent_mode);
    attach(c, i, tree, fd, dest);
    close(fd);
    close(tree);
    c->in.src_fds[i] = -1;
}

/* A new filesystem (fresh_fs's `type`, `kv`, `attrs`) attached at op->dest: its mount's fd. */
static int fresh_at_dest(struct sbx_ctx *c, int i, const struct sbx_op *op, const char *type, const char *const *kv,
                         unsigned attrs)
{
    const char *dest = sbx_str(c, op->dest);
    int fd = mountpoint(c, i, dest, 1, op->parent_mode);
    int mnt = fresh_fs(c, i, type, kv, attrs);
    attach(c, i, mnt, fd, dest);
    close(fd);
    return mnt;
}

static void op_tmpfs(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    char mode[16], size[32];
    const char *kv[] = {"mode", mode, op->size ? "size" : NULL, size, NULL};
    sbx_fmt_uint(mode, op->mode, 8);
    sbx_fmt_uint(size, op->size, 10);
    close(fresh_at_dest(c, i, op, "tmpfs", kv, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV));
}

/* A mask of a Template's sandbox: one of the /dev/null clones its server
 * made from the host tree (its root may have no /dev/null to clone). */
static void attach_null(struct sbx_ctx *c, int i, int dest_fd)
{
    int tree = c->in.null_trees[--c->in.n_null_trees];
    if (sbx_move_mount(tree, "", dest_fd, "", EMPTY_PATHS) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    close(tree);
}

/* The plan's covers of a procfs just attached (plan.PROC_COVERS), in order:
 * "r<path>" binds the entry read-only over itself with everything below it,
 * "m<path>" binds the host's /dev/null over it without device access, so it
 * cannot be opened. Paths are relative to the procfs's root and resolved
 * beneath it (the lookup crosses the read-only covers already made). */
static void cover_proc(struct sbx_ctx *c, int i, const struct sbx_op *op, int mnt)
{
    const unsigned ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    for (uint32_t k = 0; k < op->data_len; k += (uint32_t)sbx_strlen(c->in.blob + op->data + k) + 1) {
        const char *entry = c->in.blob + op->data + k;
        int sub = sbx_openat2(mnt, entry + 1, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS);
        if (sub < 0)
            continue; /* not present on this kernel */
        if (entry[0] == 'm' && c->in.n_null_trees > 0)
            attach_null(c, i, sub);
        else if (entry[0] == 'm')
            rebind(c, i, -1, "/dev/null", ro, 0, sub);
        else
            rebind(c, i, sub, NULL, ro, 1, sub);
        close(sub);
    }
}

static void op_proc(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    const char *dest = sbx_str(c, op->dest);
    int fd = mountpoint(c, i, dest, 1, op->parent_mode);
    int mnt = (op->flags & SBX_F_FRESH) ? -1 : sbx_clone_source(c, (uint32_t)i);
    if (op->flags & SBX_F_FRESH)
        mnt = fresh_fs(c, i, "proc", NULL, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
    attach(c, i, mnt, fd, dest);
    cover_proc(c, i, op, mnt);
    close(mnt);
    close(fd);
    c->in.src_fds[i] = -1;
}

/* A private devpts instance on `pts`. */
static void mount_devpts(struct sbx_ctx *c, int i, int pts)
{
    static const char *const pts_kv[] = {"ptmxmode", "0666", "mode", "620", NULL};
    int mnt = fresh_fs(c, i, "devpts", pts_kv, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC);
    if (sbx_move_mount(mnt, "", pts, "", EMPTY_PATHS) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_MOUNT);
    close(mnt);
}

static void op_devpts(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    int fd = mountpoint(c, i, sbx_str(c, op->dest), 1, op->parent_mode);
    mount_devpts(c, i, fd);
    close(fd);
}

/* A minimal /dev as bwrap's --dev: a tmpfs (op->mode) holding binds of the
 * host's harmless device nodes, the usual links, shm (op->shm_mode), and a
 * private devpts. */
static void op_dev(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    char mode[16];
    const char *tmpfs_kv[] = {"mode", mode, NULL};
    sbx_fmt_uint(mode, op->mode, 8);
    int dev = fresh_at_dest(c, i, op, "tmpfs", tmpfs_kv, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    for (size_t k = 0; k < sizeof dev_nodes / sizeof *dev_nodes; k++) {
        char host[32];
        sbx_stpcpy(sbx_stpcpy(host, "/dev/"), dev_nodes[k]);
        int f = openat(dev, dev_nodes[k], O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0444);
        if (f < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
        close(f);
        int node = openat(dev, dev_nodes[k], O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (node < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_RESOLVE);
        rebind(c, i, -1, host, MOUNT_ATTR_NOSUID, 0, node);
        close(node);
    }
    for (size_t k = 0; k < sizeof dev_links / sizeof *dev_links; k++)
        if (symlinkat(dev_links[k][1], dev, dev_links[k][0]) < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
    if (mkdirat(dev, "shm", op->shm_mode) < 0 || mkdirat(dev, "pts", 0755) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
    if (!(op->flags & SBX_F_NO_DEVPTS)) {
        int pts = openat(dev, "pts", O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (pts < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_RESOLVE);
        mount_devpts(c, i, pts);
        close(pts);
    }
    close(dev);
}

/* POSIX message queues: an mqueue filesystem shows the queues of the IPC
 * namespace of whoever creates it (fsopen), which needs CAP_SYS_ADMIN over
 * that namespace's owner: in a new user namespace, only with a new IPC
 * namespace too (else EPERM, as under bwrap). No flags, as bwrap mounts it. */
static void op_mqueue(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    close(fresh_at_dest(c, i, op, "mqueue", NULL, 0));
}

static void op_dir(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    const char *dest = sbx_str(c, op->dest);
    int fd = open_inside(c, dest, O_PATH | O_DIRECTORY);
    if (fd < 0 && errno == ENOENT) {
        char name[256];
        int parent = open_parent(c, i, dest, op->parent_mode, name);
        if (mkdirat(parent, name, op->mode) < 0 && errno != EEXIST)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
        close(parent);
        fd = open_inside(c, dest, O_PATH | O_DIRECTORY);
    }
    if (fd < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
    close(fd);
}

static void op_symlink(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    char name[256], have[4096];
    const char *target = sbx_str(c, op->src);
    int parent = open_parent(c, i, sbx_str(c, op->dest), op->parent_mode, name);
    if (symlinkat(target, parent, name) < 0) {
        /* idempotent, as bwrap >= 0.9: an identical link is fine */
        ssize_t n = errno == EEXIST ? readlinkat(parent, name, have, sizeof have - 1) : -1;
        if (n < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno == EINVAL ? EEXIST : errno, SBX_D_EXISTS);
        have[n] = 0;
        for (ssize_t k = 0; k <= n; k++)
            if (have[k] != target[k])
                sbx_fail(c, SBX_STEP_OP, i, EEXIST, SBX_D_EXISTS);
    }
    close(parent);
}

/* A private file bound on dest: for one sandbox of a Template, whose root
 * is shared and read-only, or over an earlier file (bwrap's --ro-bind-data
 * over a --file). The file is made on a small tmpfs of its own and that
 * file alone is bound on dest (read-only with SBX_F_RDONLY). */
static void op_private_file(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    static const char *const kv[] = {"mode", "700", NULL};
    const char *dest = sbx_str(c, op->dest);
    int fd = mountpoint(c, i, dest, 0, op->parent_mode);
    int fs = fresh_fs(c, i, "tmpfs", kv, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    int f = openat(fs, "f", O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, op->mode);
    if (f < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
    if (sbx_write_all(f, c->in.blob + op->data, op->data_len) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_WRITE);
    close(f);
    int tree = sbx_open_tree(fs, "f", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_SOURCE);
    if ((op->flags & SBX_F_RDONLY) && sbx_mount_setattr(tree, "", AT_EMPTY_PATH, MOUNT_ATTR_RDONLY, 0) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_ATTR);
    attach(c, i, tree, fd, dest);
    close(tree);
    close(fs);
    close(fd);
}

static void op_file(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    char name[256];
    const char *dest = sbx_str(c, op->dest);
    if (op->flags & SBX_F_FRESH) {
        op_private_file(c, i, op);
        return;
    }
    close(open_parent(c, i, dest, op->parent_mode, name));
    /* O_NONBLOCK: a FIFO a previous tenant planted here must not block the
     * open (no reader: ENXIO); anything but a regular file is refused. */
    int fd = sbx_openat2(c->root_fd, dest, O_CREAT | O_WRONLY | O_TRUNC | O_NONBLOCK | O_CLOEXEC, op->mode,
                         SBX_RESOLVE_INSIDE);
    struct stat st;
    if (fd < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CREATE);
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
        sbx_fail(c, SBX_STEP_OP, i, ENXIO, SBX_D_CREATE);
    if (sbx_write_all(fd, c->in.blob + op->data, op->data_len) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_WRITE);
    close(fd);
    if (op->flags & SBX_F_RDONLY) {
        int self = open_inside(c, dest, O_PATH | O_NOFOLLOW);
        if (self < 0)
            sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_RESOLVE);
        rebind(c, i, self, NULL, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, self);
        close(self);
    }
}

static void op_remount_ro(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    int fd = open_inside(c, sbx_str(c, op->dest), O_PATH);
    if (fd < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_RESOLVE);
    if (sbx_mount_setattr(fd, "", AT_EMPTY_PATH, sbx_bind_attrs(op->flags), 0) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_ATTR);
    close(fd);
}

static void op_chmod(struct sbx_ctx *c, int i, const struct sbx_op *op)
{
    char path[64];
    int fd = open_inside(c, sbx_str(c, op->dest), O_PATH);
    if (fd < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_RESOLVE);
    /* chmod through the fd's magic link: the file was resolved inside the
     * new root, and a procfs (the host's, before the pivot) is reachable. */
    sbx_fmt_uint(sbx_stpcpy(path, "self/fd/"), (unsigned)fd, 10);
    if (sbx_proc_chmod(c, path, op->mode) < 0)
        sbx_fail(c, SBX_STEP_OP, i, errno, SBX_D_CHMOD);
    close(fd);
}

void sbx_apply_ops(struct sbx_ctx *c)
{
    for (uint32_t i = 0; i < c->h->n_ops; i++) {
        const struct sbx_op *op = &c->ops[i];
        if (c->skip_ops && c->skip_ops[i])
            continue;
        switch (op->kind) {
        case SBX_OP_BIND: op_bind(c, (int)i, op); break;
        case SBX_OP_TMPFS: op_tmpfs(c, (int)i, op); break;
        case SBX_OP_PROC: op_proc(c, (int)i, op); break;
        case SBX_OP_DEV: op_dev(c, (int)i, op); break;
        case SBX_OP_DIR: op_dir(c, (int)i, op); break;
        case SBX_OP_SYMLINK: op_symlink(c, (int)i, op); break;
        case SBX_OP_FILE: op_file(c, (int)i, op); break;
        case SBX_OP_REMOUNT_RO: op_remount_ro(c, (int)i, op); break;
        case SBX_OP_CHMOD: op_chmod(c, (int)i, op); break;
        case SBX_OP_DEVPTS: op_devpts(c, (int)i, op); break;
        case SBX_OP_MQUEUE: op_mqueue(c, (int)i, op); break;
        case SBX_OP_OVERLAY: op_overlay(c, (int)i, op); break;
        default: sbx_fail(c, SBX_STEP_OP, (int)i, EINVAL, SBX_D_NONE);
        }
    }
}

void sbx_pivot(struct sbx_ctx *c)
{
    if (fchdir(c->root_fd) < 0 || sbx_pivot_root(".", ".") < 0 || umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        sbx_fail(c, SBX_STEP_PIVOT, -1, errno, SBX_D_NONE);
    close(c->root_fd);
    c->root_fd = -1;
}
