/* template_trees.c: detached trees the server clones for a sandbox from
 * its copy of the host's mount tree (HOST_TREE_FD), where it may clone
 * trees and its caller, unprivileged in its own mount namespace, may not:
 * the sources of per-call binds, and /dev/null for a proc's masks. */
#include "template.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <string.h>
#include <unistd.h>

/* One detached read-only clone of the host's /dev/null. The first is kept
 * (null_master) and the rest are cloned from it: one open_tree each, its
 * mount flags copied, instead of a path walk, a clone and a mount_setattr.
 * A kernel that cannot clone a detached mount (before 6.15) gets the walk. */
static int null_tree(struct tpl_server *s)
{
    const uint32_t flags = SBX_F_RDONLY | SBX_F_NODEV | SBX_F_NOSUID;
    if (s->null_master == -2)
        s->null_master = sbx_clone_tree_at(s->host_tree, "/dev/null", flags);
    if (s->null_master >= 0) {
        int tree = sbx_open_tree(s->null_master, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
        if (tree >= 0)
            return tree;
        close(s->null_master);
        s->null_master = -1;
    }
    return sbx_clone_tree_at(s->host_tree, "/dev/null", flags);
}

/* Whether /proc has `path` on this kernel (the caller's procfs: entries
 * outside sys/net are the same in every instance). A mask whose entry is
 * absent gets no tree: the last close of an unattached tree unmounts it,
 * and every such unmount waits for an expedited RCU grace period. */
static int proc_has(struct tpl_server *s, const char *path)
{
    int fd = sbx_openat2(s->proc_dir, path, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0,
                         RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS);
    if (fd < 0)
        return errno != ENOENT;
    close(fd);
    return 1;
}

/* How many trees a mask entry needs: none if its entry is absent (one
 * below sys/net always: the sandbox's network namespace may have what the
 * caller's lacks). */
static int trees_for(struct tpl_server *s, const char *entry)
{
    if (entry[0] != 'm')
        return 0;
    return strncmp(entry + 1, "sys/net/", 8) == 0 || proc_has(s, entry + 1);
}

int make_null_trees(struct tpl_server *s, const char *blob, int *out)
{
    const struct sbx_header *h = (const void *)blob;
    const struct sbx_op *ops = (const void *)(blob + h->ops_off);
    int n = 0;
    for (uint32_t i = 0; i < h->n_ops; i++) {
        if (ops[i].kind != SBX_OP_PROC)
            continue;
        for (uint32_t k = 0; k < ops[i].data_len; k += (uint32_t)strlen(blob + ops[i].data + k) + 1) {
            for (int want = trees_for(s, blob + ops[i].data + k); want > 0 && n < MAX_NULL_TREES; want--, n++) {
                out[n] = null_tree(s);
                if (out[n] < 0) {
                    close_all(out, n);
                    return 0;
                }
            }
        }
    }
    return n;
}

void close_all(int *fds, int n)
{
    for (int k = 0; k < n; k++)
        close(fds[k]);
}

int clone_binds(struct tpl_server *s, const char *blob, int *out, int *op)
{
    const struct sbx_header *h = (const void *)blob;
    const struct sbx_op *ops = (const void *)(blob + h->ops_off);
    int n = 0;
    for (uint32_t i = 0; i < h->n_ops; i++) {
        if (ops[i].kind != SBX_OP_BIND || !(ops[i].flags & SBX_F_FROM_FD))
            continue;
        out[n] = sbx_clone_tree_at(s->host_tree, blob + ops[i].src, ops[i].flags);
        if (out[n] < 0) {
            int err = errno;
            while (n > 0)
                close(out[--n]);
            *op = (int)i;
            errno = err;
            return -1;
        }
        n++;
    }
    return n;
}
