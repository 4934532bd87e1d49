/* detach.c: a host directory as a detached mount tree, for a sandbox that
 * can no longer see the host (a task forked from a template, whose mount
 * namespace is a copy of the template's).
 *
 * open_tree(OPEN_TREE_CLONE) clones only mounts of the caller's own mount
 * namespace, and needs CAP_SYS_ADMIN over it. So a short-lived child does it:
 * cloned with CLONE_VM|CLONE_VFORK (it runs on our memory while we wait),
 * CLONE_FILES (the tree's fd lands in our fd table) and new user and mount
 * namespaces (where it holds that capability over a copy of our mounts; no id
 * map is needed, lookups still check our own ids). It clones the tree
 * recursively, sets the bind's flags on it (only ever set: a flag the kernel
 * locked stays), and exits. The detached tree can then be attached with
 * move_mount() in any mount namespace whose owner we hold capabilities in,
 * such as the task's (mounts.c, SBX_F_DETACHED).
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct detach_job {
    const char *path;
    uint64_t attrs;
    int fd;
    int detail, err;
};

static int detach_child(void *arg)
{
    struct detach_job *job = arg;
    int tree = sbx_open_tree(AT_FDCWD, job->path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0) {
        job->err = errno;
        _exit(1);
    }
    if (sbx_mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, job->attrs, 0) < 0) {
        job->err = errno;
        job->detail = SBX_D_ATTR;
        close(tree);
        _exit(1);
    }
    job->fd = tree;
    _exit(0);
}

int sbx_detach_tree(const char *path, uint32_t flags, struct sbx_result *res)
{
    struct detach_job job = {.path = path, .fd = -1, .detail = SBX_D_SOURCE};
    memset(res, 0, sizeof *res);
    res->pid = -1;
    res->status_fd = -1;
    res->op = -1;
    if (flags & SBX_F_NOSUID)
        job.attrs |= MOUNT_ATTR_NOSUID;
    if (flags & SBX_F_NODEV)
        job.attrs |= MOUNT_ATTR_NODEV;
    if (flags & SBX_F_RDONLY)
        job.attrs |= MOUNT_ATTR_RDONLY;
    pid_t pid = sbx_clone_vm(detach_child, &job, CLONE_FILES | CLONE_NEWUSER | CLONE_NEWNS, 64 * 1024);
    if (pid < 0) {
        res->step = SBX_STEP_CLONE;
        res->err = errno;
        return -1;
    }
    while (waitpid(pid, &res->wait_status, 0) < 0 && errno == EINTR)
        ;
    if (job.fd < 0) {
        res->step = SBX_STEP_SOURCE;
        res->detail = job.detail;
        res->err = job.err ? job.err : EIO;
        return -1;
    }
    return job.fd;
}
