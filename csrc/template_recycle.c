/* template_recycle.c: a recycled standby (sandbox.Template(spec, recycle=True)).
 *
 * A standby (csrc/standby.c) builds its world before any request; a
 * recycled one then serves request after request in the same pid, mount,
 * user-owned and network namespaces, instead of exiting after one. For that
 * its pid 1 never takes the command's identity: it stays in the server's
 * user namespace with the server's capabilities over the sandbox's
 * namespaces, non-dumpable. Its command child, made ahead of each request
 * (sharing its memory until exec, CLONE_VM, while pid 1 waits on a socket
 * pair), takes what belongs to the command as a standby does, before the
 * request (sbx_command_identity: a session keyring of its own, the
 * command's user namespace, made ahead, a child of the server's; session,
 * no capability, no new privileges, Landlock, the filter where it allows
 * what follows), then the request itself and what it decides (cwd, rlimits,
 * fds; pid 1 checks the probe paths for it), and execs. The command
 * therefore holds no capability over pid 1 or any of its namespaces, cannot
 * ptrace it (non-dumpable, another user namespace's), nor signal it (the
 * kernel drops a pid namespace's init's default-handled signals sent from
 * inside), and gets none of its fds.
 *
 * When the command ends, pid 1 kills and reaps whatever is left, writes the
 * status, and resets what a task could have changed before it takes the
 * next request:
 * - every mount the sandbox made (each Tmpfs, /dev/shm, devpts, an mqueue,
 *   a writable File's private copy, and whatever lies beneath them) is
 *   detached and made again, from the reset blob the caller stored, but an
 *   empty Tmpfs the command left as it was (kept_tmpfs); only mounts on the
 *   template's read-only root are detached by path, so no path a task
 *   planted is followed; its proc (nothing of it is the command's to write)
 *   only with a new network namespace, once that is entered (/proc/sys/net
 *   shows the reader's: covers made on the last one's entries would not
 *   apply to the next);
 * - a fresh IPC namespace (SysV objects, POSIX queues), then the mqueue;
 * - the network namespace is kept if no socket is left in it (all died
 *   with their processes: the command holds no capability over the
 *   namespace, so links, addresses, routes and sysctls are as they were);
 *   else a fresh one, with its loopback up (a TIME_WAIT, say, stays in the
 *   old one), and its proc again; a recycled Template makes its own rather
 *   than leasing from the pool (warm_plan.recycle_plan);
 * - the hostname, written again;
 * - a fresh user namespace for the next command (user keyrings live
 *   there), unless the filter refuses every keyring syscall
 *   (SBX_OPT_KEYS_REFUSED); each command joins a session keyring of its own;
 * - its own cwd, umask and rlimits were never the command's (CLONE_VM
 *   without CLONE_FS: the command's chdir and umask are its own).
 * Any failure ends pid 1, and the server makes a fresh standby instead.
 * What it shares with its predecessor: the pid namespace (pid numbers keep
 * counting), the mount namespace's read-only template root, and whatever
 * the Spec lets a task write outside the sandbox (a writable Bind of a host
 * directory).
 */
#include "template.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/mount.h>

#ifndef KEYCTL_JOIN_SESSION_KEYRING
#define KEYCTL_JOIN_SESSION_KEYRING 1 /* linux/keyctl.h */
#endif
#ifndef UMOUNT_NOFOLLOW
#define UMOUNT_NOFOLLOW 8
#endif

/* What the command child leaves here (its memory is ours until its exec). */
static struct {
    volatile int execing; /* set just before the exec: a child gone without it has failed and reported */
    int step, err;
    int probe_op, probe_err, probe_detail; /* pid 1's probe check for it: a failure to report (err 0: none) */
} command;

/* The command child, made ahead of its request (CLONE_VM, on a stack of
 * pid 1's; pid 1 waits on `c->keep_fd`'s peer meanwhile and touches none of
 * this memory): a session keyring of its own, the command's user namespace
 * and identity (the filter too, where it allows what follows), then, as a
 * standby, the request, and what the request decides. Just before its exec
 * it hands pid 1 the request's report socket (pid 1 holds none of the
 * request's fds: they came to this child's fd table). */
static int command_main(void *arg)
{
    struct sbx_ctx *c = arg;
    /* pid 1's (the caller's) would carry a key one tenant adds to the next */
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL) < 0 && errno != ENOSYS)
        sbx_fail(c, SBX_STEP_SESSION, -1, errno, SBX_D_NONE);
    sbx_command_identity(c);
    tpl_take_request(c, 1);
    sbx_enter_cgroups(c);
    if (c->h->n_probe) { /* pid 1 checks them, from the request's cwd (check_probes) */
        char b = 'p';
        if (write(c->keep_fd, &b, 1) != 1 || read(c->keep_fd, &b, 1) != 1)
            _exit(125);
        if (command.probe_err)
            sbx_fail(c, SBX_STEP_ISOLATION, command.probe_op, command.probe_err, command.probe_detail);
    }
    sbx_command_request(c); /* a failing step reports on the report socket and exits */
    sbx_stamp(c, SBX_T_READY);
    if (sbx_send_fds(c->keep_fd, "r", 1, &c->in.err_fd, 1) < 0)
        _exit(125);
    if (!(c->h->opts & SBX_OPT_SECCOMP_EARLY))
        sbx_install_seccomp(c); /* else taken with the identity */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    c->reached_exec = 1;
    command.execing = 1;
    sbx_exec_search(c->in.argv[0], c->in.argv, c->in.envp, sbx_str(c, c->h->path), c->in.sh_argv);
    command.step = SBX_STEP_EXEC;
    command.err = errno;
    _exit(errno == ENOENT ? 127 : 126);
}

/* The isolation check of the request the command child took (c->in, its
 * memory and ours), as sbx_check_probe_paths makes it, but by pid 1: every
 * probe path proven absent from the request's cwd, with pid 1's view (it
 * can see more than the command, never less: /proc/1 is itself). A failure
 * is left in `command` for the child to report; a cwd that does not exist
 * is the child's to report too. */
static void check_probes(struct sbx_ctx *c)
{
    const uint32_t *cands = (const void *)(c->in.blob + c->h->cwd_off), *paths = (const void *)(c->in.blob + c->h->probe_off);
    command.probe_err = 0;
    uint32_t i = 0, n_cwd = (c->h->opts & SBX_OPT_CWD_STRICT) && c->h->n_cwd ? 1 : c->h->n_cwd;
    while (i < n_cwd && chdir(sbx_str(c, cands[i])) < 0)
        i++;
    for (uint32_t k = 0; i < n_cwd && k < c->h->n_probe && !command.probe_err; k++) {
        int rc = sbx_path_exists(AT_FDCWD, sbx_str(c, paths[k]), 0);
        command.probe_op = (int)k;
        command.probe_err = rc == 0 ? EEXIST : (rc != -ENOENT && rc != -ENOTDIR) ? -rc : 0;
        command.probe_detail = rc == 0 ? SBX_D_EXISTS : SBX_D_NONE;
    }
    if (chdir("/") < 0 && !command.probe_err) {
        command.probe_op = -1;
        command.probe_err = errno;
        command.probe_detail = SBX_D_NONE;
    }
}

/* The command child's word on `sock`: a probe check to make (one byte, no
 * fd: answered), the request's report socket, just before its exec; then
 * EOF, once it has exec'd (its end is close-on-exec) or died. The report
 * socket, or -1 if none came (it ended before). */
static int await_command(struct sbx_ctx *c, int sock)
{
    int fd = -1;
    for (;;) {
        char b, control[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {.iov_base = &b, .iov_len = 1};
        struct msghdr h = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
        ssize_t n = recvmsg(sock, &h, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return fd;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&h);
        if (fd < 0 && cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
            memcpy(&fd, CMSG_DATA(cm), sizeof fd);
        else if (b == 'p' && fd < 0) {
            check_probes(c);
            if (write(sock, &b, 1) != 1)
                return -1;
        }
    }
}

/* Whether op i's destination lies beneath an earlier op's (a mount made
 * on a fresh one, detached with it). */
static int beneath_another(const struct sbx_ctx *c, uint32_t i)
{
    const char *dest = sbx_str(c, c->ops[i].dest);
    for (uint32_t j = 0; j < i; j++) {
        const char *top = sbx_str(c, c->ops[j].dest);
        size_t n = sbx_strlen(top);
        if (n && strncmp(dest, top, n) == 0 && (dest[n] == '/' || top[n - 1] == '/'))
            return 1;
    }
    return 0;
}

/* Detach every fresh mount of the reset blob that lies on the template's
 * read-only root (those beneath go with it), last first. */
static int detach_fresh(const struct sbx_ctx *c, const unsigned char *skip)
{
    for (uint32_t k = c->h->n_ops; k-- > 0;) {
        uint32_t kind = c->ops[k].kind;
        if (kind == SBX_OP_DIR || kind == SBX_OP_SYMLINK || kind == SBX_OP_REMOUNT_RO || kind == SBX_OP_CHMOD ||
            beneath_another(c, k) || skip[k])
            continue;
        if (umount2(sbx_str(c, c->ops[k].dest), MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL)
            return -1;
    }
    return 0;
}

/* An empty Tmpfs the command left as the reset made it is kept rather than
 * made again: its root's inode, pinned by an O_PATH fd of pid 1's, was the
 * only inode of the filesystem (nothing of the plan lies beneath it) and
 * still is, and its stat is unchanged. A directory's ctime is set by the
 * kernel on every entry made, removed or renamed in it and on every change
 * of its own mode, owner, times or xattrs, and no process can set it back
 * (utimensat sets only atime and mtime, and moves ctime to now); so an
 * unchanged ctime, atime and mtime, with one inode in use, means the
 * filesystem is as it was, down to its root's metadata. (The command's uid
 * may own that root: mapped to the server's, it can chmod it or set a
 * user xattr on it, which moves its ctime.) A command that read the
 * directory moved its atime: made again. */
#define MAX_KEPT 16
static struct kept_tmpfs {
    const char *dest; /* in the reset blob (NULL: free) */
    int fd;
    struct stat st;
    uint64_t used_blocks;
} kept[MAX_KEPT];

/* Whether op k of the blob is an Tmpfs that nothing of the plan lies in,
 * on the template's root (detached on its own). */
static int keepable(const struct sbx_ctx *c, uint32_t k)
{
    if (c->ops[k].kind != SBX_OP_TMPFS || beneath_another(c, k))
        return 0;
    const char *top = sbx_str(c, c->ops[k].dest);
    size_t n = sbx_strlen(top);
    for (uint32_t j = 0; j < c->h->n_ops; j++) {
        const char *dest = sbx_str(c, c->ops[j].dest);
        if (j != k && dest && strncmp(dest, top, n) == 0 && (dest[n] == '/' || dest[n] == 0 || top[n - 1] == '/'))
            return 0;
    }
    return 1;
}

static int same_time(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* One inode in use, and its blocks as they were (-1: unknown). */
static int one_inode(int fd, uint64_t *used_blocks)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) < 0 || sf.f_files == 0 || sf.f_files - sf.f_ffree != 1)
        return 0;
    *used_blocks = sf.f_blocks - sf.f_bfree;
    return 1;
}

static int untouched(const struct kept_tmpfs *k)
{
    struct stat st;
    uint64_t blocks;
    if (fstat(k->fd, &st) < 0 || !one_inode(k->fd, &blocks) || blocks != k->used_blocks)
        return 0;
    return st.st_dev == k->st.st_dev && st.st_ino == k->st.st_ino && st.st_mode == k->st.st_mode &&
           st.st_uid == k->st.st_uid && st.st_gid == k->st.st_gid && st.st_nlink == k->st.st_nlink &&
           st.st_size == k->st.st_size && same_time(&st.st_ctim, &k->st.st_ctim) &&
           same_time(&st.st_mtim, &k->st.st_mtim) && same_time(&st.st_atim, &k->st.st_atim);
}

static struct kept_tmpfs *kept_at(const char *dest)
{
    for (int k = 0; k < MAX_KEPT; k++)
        if (kept[k].dest && strcmp(kept[k].dest, dest) == 0)
            return &kept[k];
    return NULL;
}

static void forget(struct kept_tmpfs *k)
{
    close(k->fd);
    k->dest = NULL;
}

/* Before the reset: skip[k] for each op of the blob kept as it is; every
 * other record goes (its mount is detached and made again). */
static void choose_kept(const struct sbx_ctx *c, unsigned char *skip)
{
    for (uint32_t k = 0; k < c->h->n_ops; k++) {
        struct kept_tmpfs *rec = keepable(c, k) ? kept_at(sbx_str(c, c->ops[k].dest)) : NULL;
        skip[k] = rec && untouched(rec);
        if (rec && !skip[k])
            forget(rec);
    }
}

/* After the reset: a record of each keepable Tmpfs it made. Opened by path
 * in pid 1's own mount namespace while no process of a command exists. */
static void record_kept(const struct sbx_ctx *c, const unsigned char *skip)
{
    for (uint32_t k = 0; k < c->h->n_ops; k++) {
        if (skip[k] || !keepable(c, k))
            continue;
        struct kept_tmpfs *rec = kept_at(sbx_str(c, c->ops[k].dest));
        for (int j = 0; !rec && j < MAX_KEPT; j++)
            rec = kept[j].dest ? NULL : &kept[j];
        if (!rec)
            return;
        if (rec->dest)
            forget(rec);
        int fd = open(sbx_str(c, c->ops[k].dest), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;
        if (fstat(fd, &rec->st) < 0 || !one_inode(fd, &rec->used_blocks)) {
            close(fd);
            continue;
        }
        rec->fd = fd;
        rec->dest = sbx_str(c, c->ops[k].dest);
    }
}

/* A detached clone of one of its proc's masks (a read-only, nodev bind of
 * /dev/null), made in its own mount namespace: the masks of the proc it
 * mounts again are cloned from it (the server's, made in another mount
 * namespace, cannot be cloned here). -1 if its proc has none. */
static int own_null_master(const struct sbx_ctx *c)
{
    char path[4096];
    for (uint32_t i = 0; i < c->h->n_ops; i++) {
        const struct sbx_op *op = &c->ops[i];
        if (op->kind != SBX_OP_PROC)
            continue;
        for (uint32_t k = 0; k < op->data_len; k += (uint32_t)sbx_strlen(c->in.blob + op->data + k) + 1) {
            const char *entry = c->in.blob + op->data + k;
            if (entry[0] != 'm' || sbx_strlen(sbx_str(c, op->dest)) + sbx_strlen(entry) + 2 > sizeof path)
                continue;
            sbx_stpcpy(sbx_stpcpy(sbx_stpcpy(path, sbx_str(c, op->dest)), "/"), entry + 1);
            int fd = sbx_open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
            if (fd >= 0)
                return fd;
        }
    }
    return -1;
}

/* The number after `label` in `buf` (a /proc/net/sockstat), or -1. */
static long stat_after(const char *buf, const char *label)
{
    const char *at = strstr(buf, label);
    if (!at)
        return -1;
    at += strlen(label);
    long v = 0;
    if (*at < '0' || *at > '9')
        return -1;
    for (; *at >= '0' && *at <= '9'; at++)
        v = v * 10 + (*at - '0');
    return v;
}

/* Whether the network namespace holds no socket any more: every process
 * of the last request is gone, and with them every socket but TCP's that
 * outlive their owners (TIME_WAIT, FIN_WAIT, orphans). Links, addresses,
 * routes and sysctls were never the command's to change (it holds no
 * capability over the namespace). The namespace's own counters say it:
 * /proc/net/sockstat's "sockets: used" counts every socket of the
 * namespace, of any family, that a process made, still allocated (an
 * orphan or a FIN_WAIT one too), "tw" its TCP TIME_WAIT entries (IPv4 and
 * IPv6: one death row per namespace), FRAG its queued fragments. Reading
 * /proc/net/tcp and the like instead walks the kernel's global hash tables,
 * every namespace's buckets: about 2 ms of CPU. Read through the caller's
 * procfs, as this process's own (thread-self). */
static int net_empty(const struct sbx_ctx *c)
{
    char buf[1024];
    int fd = sbx_proc_open(c, "thread-self/net/sockstat", O_RDONLY);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0 || n == sizeof buf - 1)
        return 0;
    buf[n] = 0;
    if (stat_after(buf, "sockets: used ") != 0 || stat_after(buf, " tw ") != 0 || stat_after(buf, "FRAG: inuse ") != 0)
        return 0;
    fd = sbx_proc_open(c, "thread-self/net/sockstat6", O_RDONLY);
    if (fd < 0)
        return errno == ENOENT; /* no IPv6 here */
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0 || n == sizeof buf - 1)
        return 0;
    buf[n] = 0;
    return stat_after(buf, "FRAG6: inuse ") == 0;
}

/* Everything of the last request gone, make the sandbox as its standby
 * was: 0, or -1 (pid 1 then ends, and the server replaces it). */
static int reset(struct sbx_ctx *c)
{
    struct tpl_sandbox *t = TPL_SANDBOX(c);
    struct tpl_server *s = t->srv;
    const struct sbx_header *h = (const void *)s->stored_blob, *rh = (const void *)s->reset_blob;
    static unsigned char *skip;
    if (!t->src_fds && !(t->src_fds = malloc((rh->n_ops + 1) * sizeof *t->src_fds)))
        return -1;
    if (!skip && !(skip = calloc(rh->n_ops + 1, 1)))
        return -1;
    /* A network namespace left empty is kept, and the proc with it (its
     * sys/net covers are that namespace's); else both are made again. */
    int keep_net = (h->ns & SBX_NS_NET) && s->reset_kept_blob && net_empty(c);
    /* the reset blob's ops, in place, as this sandbox's own setup did them */
    struct sbx_input in = SBX_INPUT_NONE;
    in.blob = keep_net ? s->reset_kept_blob : s->reset_blob;
    in.src_fds = t->src_fds;
    in.proc_dir = c->in.proc_dir;
    sbx_ctx_take_input(c, &in);
    if (!t->own_null) { /* before its proc goes */
        if (s->null_master >= 0)
            close(s->null_master);
        s->null_master = own_null_master(c);
        t->own_null = 1;
    }
    choose_kept(c, skip);
    if (detach_fresh(c, skip) < 0)
        return -1;
    if ((h->ns & SBX_NS_IPC) && unshare(CLONE_NEWIPC) < 0)
        return -1;
    if ((h->ns & SBX_NS_NET) && !keep_net && unshare(CLONE_NEWNET) < 0)
        return -1;
    /* its proc again, after the network namespace: /proc/sys/net shows the
     * reader's, and the covers made on the last one's entries would not
     * apply; its masks are cloned from the server's /dev/null, kept */
    int nulls[MAX_NULL_TREES];
    in.null_trees = nulls;
    in.n_null_trees = make_null_trees(s, in.blob, nulls);
    sbx_ctx_take_input(c, &in);
    /* From here a failing step reports nowhere (err_fd -1) and exits. */
    c->skip_ops = skip;
    sbx_setup_filesystem(c);
    c->skip_ops = NULL;
    record_kept(c, skip);
    close_all(c->in.null_trees, c->in.n_null_trees); /* those its proc did not use */
    if ((h->ns & SBX_NS_NET) && !keep_net)
        sbx_loopback_up(c);
    in.blob = s->stored_blob;
    sbx_ctx_take_input(c, &in);
    if (h->hostname && sethostname(sbx_str(c, h->hostname), sbx_strlen(sbx_str(c, h->hostname))) < 0)
        return -1;
    /* The commands' user namespace holds their user keyrings (the session
     * keyring is each command's own). When the filter refuses every keyring
     * syscall whatever its arguments (SBX_OPT_KEYS_REFUSED), no command can
     * reach one, and nothing else of a user namespace is a command's to
     * change: its id maps are written once, and a command holds no
     * capability in it (dropped before the exec; one gained in a nested user
     * namespace of its own is that namespace's, which dies with it). */
    if (c->userns_fd >= 0 && (h->opts & SBX_OPT_KEYS_REFUSED))
        return 0;
    if (c->userns_fd >= 0)
        close(c->userns_fd);
    c->userns_fd = -1;
    /* Its helper writes its own id maps through /proc/<pid>, which a
     * non-dumpable process's files deny an unprivileged owner; no process
     * but this one is left in the sandbox meanwhile. */
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) < 0)
        return -1;
    int rc = sbx_prepare_userns(c);
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        _exit(125);
    return rc;
}

/* The command has ended: whatever is left of it goes, then its status. */
static void finish(int report, int status)
{
    int other;
    kill(-1, SIGKILL);
    while (waitpid(-1, &other, 0) > 0 || errno == EINTR)
        ;
    sbx_write_all(report, &status, sizeof status);
}

/* One request after another (SBX_MODE_RECYCLE's stay_resident): a command
 * child made ahead takes it and execs, pid 1 serves and reaps it, then
 * resets the sandbox. */
static _Noreturn void recycle_reaper(struct sbx_ctx *c)
{
    struct tpl_sandbox *t = TPL_SANDBOX(c);
    static char stack[SBX_CHILD_STACK] __attribute__((aligned(16)));
    static struct tpl_inherited inherited; /* what its commands inherit, before any request */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0 || tpl_inherited_take(c, &inherited) < 0)
        sbx_fail(c, SBX_STEP_EXEC_INIT, -1, errno, SBX_D_NONE);
    for (;;) {
        int sp[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
            _exit(125);
        struct sbx_ctx saved = *c; /* the command child's steps move fds in this memory */
        c->keep_fd = sp[1];        /* kept off the request's fd numbers (sbx_place_fds) */
        command.execing = 0;
        command.step = 0;
        pid_t pid = clone(command_main, stack + sizeof stack, CLONE_VM | SIGCHLD, c);
        close(sp[1]);
        int report = pid < 0 ? -1 : await_command(c, sp[0]);
        close(sp[0]);
        struct sbx_input got = c->in; /* the request, as the child took it */
        *c = saved;
        sbx_stamp(c, SBX_T_RETURN);
        if (report < 0 || !command.execing || command.step) {
            /* it failed (and reported, to the request's caller or, before
             * any request, to the server) or found the caller gone */
            int status = 0;
            if (pid > 0)
                waitpid(pid, &status, 0);
            if (report >= 0 && command.step) { /* its exec failed: reported here */
                c->in.err_fd = report;
                sbx_fail(c, command.step, -1, command.err, SBX_D_NONE);
            }
            _exit(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && report < 0 ? 0 : 125);
        }
        c->in.err_fd = report;
        if (sbx_send_started(c) < 0) {
            kill(pid, SIGKILL);
            _exit(125);
        }
        if (got.scrub)
            memset(got.scrub, 0, got.scrub_len);
        finish(report, sbx_serve_command(pid));
        close(report);
        c->in.err_fd = -1;
        t->srv->standby_taken[t->slot] = TAKEN_RESETTING; /* the next request waits for us (serving_fast) */
        free(got.sh_argv);
        free((void *)got.argv);
        free((void *)got.envp);
        /* a command may have changed what the next would inherit from us */
        if (reset(c) < 0 || !tpl_inherited_same(&inherited))
            _exit(125);
        tpl_drop_pending_signals(); /* none is for the next command */
        __atomic_store_n(&t->srv->standby_taken[t->slot], 0, __ATOMIC_SEQ_CST);
        __atomic_thread_fence(__ATOMIC_SEQ_CST); /* before its command child reads srv->serving */
    }
}

static void recycle_start(struct sbx_ctx *c)
{
    tpl_standby_start(c);
}

const struct sbx_mode SBX_MODE_RECYCLE = {
    .name = "recycle",
    .start = recycle_start,
    .userns_ahead = 1,
    .resident_before_identity = 1,
    .take_request = sbx_no_step, /* its command child takes each request (command_main) */
    .fd_table = sbx_command_fds,
    .stay_resident = recycle_reaper,
    .on_running = sbx_no_step,
    .report_started = sbx_send_started,
    .run = sbx_exec_command,
};
