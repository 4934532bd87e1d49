/* probe.c: can this host run the native backend? One real clone into the
 * requested namespaces, an id map, and the mount API calls the setup uses. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct probe_arg {
    struct sbx_ctx ctx;
    struct sbx_header h;
};

static int probe_child(void *arg)
{
    struct sbx_ctx *c = arg;
    sbx_setup_userns(c);
    if (!(c->h->ns & SBX_NS_MOUNT))
        _exit(0);
    if (mount(NULL, "/", NULL, MS_SLAVE | MS_REC, NULL) < 0)
        sbx_fail(c, SBX_STEP_MOUNT_PRIVATE, -1, errno, SBX_D_NONE);
    int tree = sbx_open_tree(AT_FDCWD, "/", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        sbx_fail(c, SBX_STEP_SOURCE, -1, errno, SBX_D_SOURCE);
    if (sbx_mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0) < 0)
        sbx_fail(c, SBX_STEP_SOURCE, -1, errno, SBX_D_ATTR);
    int fs = sbx_fsopen("tmpfs", FSOPEN_CLOEXEC);
    if (fs < 0 || sbx_fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 || sbx_fsmount(fs, FSMOUNT_CLOEXEC, 0) < 0)
        sbx_fail(c, SBX_STEP_NEWROOT, -1, errno, SBX_D_MOUNT);
    int fd = sbx_openat2(AT_FDCWD, "/", O_PATH | O_CLOEXEC, 0, RESOLVE_IN_ROOT);
    if (fd < 0)
        sbx_fail(c, SBX_STEP_OP, -1, errno, SBX_D_RESOLVE);
    _exit(0);
}

/* The child runs on our memory while we wait (sbx_clone_vm), so its
 * context lives in this frame: concurrent probes share nothing. */
int sbx_probe(uint32_t ns, struct sbx_result *res)
{
    struct probe_arg a;
    int errp[2];
    memset(res, 0, sizeof *res);
    memset(&a, 0, sizeof a);
    if (pipe2(errp, O_CLOEXEC) < 0) {
        res->step = SBX_STEP_PIPE;
        res->err = errno;
        return -1;
    }
    a.h.ns = ns;
    a.h.host_uid = (uint32_t)getuid();
    a.h.host_gid = (uint32_t)getgid();
    a.h.uid = a.h.host_uid;
    a.h.gid = a.h.host_gid;
    struct sbx_input in = SBX_INPUT_NONE;
    in.blob = (const char *)&a.h; /* a header alone: no ops, no strings */
    in.err_fd = errp[1];
    sbx_ctx_init(&a.ctx, &SBX_MODE_SPAWN, &in, res);
    pid_t pid = sbx_clone_vm(probe_child, &a.ctx, sbx_clone_flags(ns), 64 * 1024);
    int err = errno;
    close(errp[1]);
    if (pid < 0) {
        close(errp[0]);
        res->step = SBX_STEP_CLONE;
        res->err = err;
        return -1;
    }
    struct sbx_report r;
    ssize_t n = read(errp[0], &r, sizeof r);
    close(errp[0]);
    while (waitpid(pid, &res->wait_status, 0) < 0 && errno == EINTR)
        ;
    if (n == (ssize_t)sizeof r) {
        res->step = r.step;
        res->err = r.err;
        res->detail = r.detail;
        return -1;
    }
    return 0;
}
