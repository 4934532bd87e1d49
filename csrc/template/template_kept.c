/* template_kept.c: what a recycled sandbox's reset keeps rather than makes
 * again, and the proof that it is as the last reset left it.
 *
 * Each check runs in pid 1 once every process of the last request has been
 * reaped, and reads what the kernel keeps about the object itself (a
 * directory's stat, a namespace's counters), never a path a command could
 * have planted; anything it cannot prove unchanged is made again
 * (csrc/template/template_recycle.c, reset). What a command can still hold there
 * without a process (an fd in flight in a socket's queue, which the kernel
 * collects later) shows in the same counters: an open inode in a tmpfs's
 * inode count, a socket in the namespace's sockets, a pty in its devpts.
 */
#include "template.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/mount.h>

int tpl_beneath_another(const struct sbx_ctx *c, uint32_t i)
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

/* Whether path a is b or lies beneath it. */
static int at_or_beneath(const char *a, const char *b)
{
    size_t n = sbx_strlen(b);
    return n && strncmp(a, b, n) == 0 && (a[n] == '/' || a[n] == 0 || b[n - 1] == '/');
}

int tpl_shares_place(const struct sbx_ctx *c, uint32_t i)
{
    const char *dest = sbx_str(c, c->ops[i].dest);
    for (uint32_t j = 0; j < c->h->n_ops; j++) {
        uint32_t kind = c->ops[j].kind;
        if (j == i || kind == SBX_OP_DIR || kind == SBX_OP_SYMLINK || kind == SBX_OP_REMOUNT_RO ||
            kind == SBX_OP_CHMOD)
            continue;
        const char *other = sbx_str(c, c->ops[j].dest);
        if (at_or_beneath(dest, other) || at_or_beneath(other, dest))
            return 1;
    }
    return 0;
}

/* A mount the reset made that the command left as it was is kept: an empty
 * Tmpfs, a devpts. Its root, pinned by an fd of pid 1's, is unchanged down
 * to its stat: a directory's ctime is set by the kernel on every entry
 * made, removed or renamed in it and on every change of its own mode,
 * owner, times or xattrs, and no process can set it back (utimensat sets
 * only atime and mtime, and moves ctime to now); so an unchanged ctime,
 * atime and mtime mean its root's metadata and entries are as they were.
 * (The command's uid may own that root: mapped to the server's, it can
 * chmod it or set a user xattr on it, which moves its ctime.) A command
 * that read the directory moved its atime: made again.
 * - A Tmpfs (nothing of the plan lies in it): its root is still the
 *   filesystem's only inode, and its blocks in use are as many as then.
 * - A devpts: its ptmx node's stat is unchanged too, and no pty is left
 *   (the kernel adds and removes a pty's node without touching the
 *   directory's times, so its entries are counted). */
#define MAX_KEPT 16
static struct kept_mount {
    const char *dest; /* in the reset blob (NULL: free) */
    int fd;           /* the root: O_PATH for a tmpfs, O_RDONLY for a devpts (its entries are read) */
    struct stat st, ptmx;
    uint64_t used_blocks;
} kept[MAX_KEPT];

/* Whether op k of the blob is a Tmpfs or devpts that nothing of the plan
 * lies in, on the template's root (detached on its own). */
static int keepable(const struct sbx_ctx *c, uint32_t k)
{
    uint32_t kind = c->ops[k].kind;
    if ((kind != SBX_OP_TMPFS && kind != SBX_OP_DEVPTS) || tpl_beneath_another(c, k))
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

static int same_stat(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_mode == b->st_mode && a->st_uid == b->st_uid &&
           a->st_gid == b->st_gid && a->st_nlink == b->st_nlink && a->st_size == b->st_size &&
           a->st_rdev == b->st_rdev && same_time(&a->st_ctim, &b->st_ctim) && same_time(&a->st_mtim, &b->st_mtim) &&
           same_time(&a->st_atim, &b->st_atim);
}

/* One inode in use, and its blocks as they were. */
static int one_inode(int fd, uint64_t *used_blocks)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) < 0 || sf.f_files == 0 || sf.f_files - sf.f_ffree != 1)
        return 0;
    *used_blocks = sf.f_blocks - sf.f_bfree;
    return 1;
}

/* Whether the devpts root `fd` holds nothing but its ptmx node. */
static int ptmx_alone(int fd)
{
    char buf[1024];
    if (lseek(fd, 0, SEEK_SET) < 0)
        return 0;
    long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
    if (n <= 0)
        return 0;
    int others = 0;
    for (long at = 0; at < n;) {
        const struct dirent64 *d = (const void *)(buf + at);
        if (strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0 && strcmp(d->d_name, "ptmx") != 0)
            others++;
        at += d->d_reclen;
    }
    /* all of it in one read: a devpts with only ptmx has three entries */
    return !others && syscall(SYS_getdents64, fd, buf, sizeof buf) == 0;
}

static int untouched(const struct kept_mount *k, uint32_t kind)
{
    struct stat st, ptmx;
    uint64_t blocks;
    if (fstat(k->fd, &st) < 0 || !same_stat(&st, &k->st))
        return 0;
    if (kind == SBX_OP_TMPFS)
        return one_inode(k->fd, &blocks) && blocks == k->used_blocks;
    return fstatat(k->fd, "ptmx", &ptmx, AT_SYMLINK_NOFOLLOW) == 0 && same_stat(&ptmx, &k->ptmx) &&
           ptmx_alone(k->fd);
}

static struct kept_mount *kept_at(const char *dest)
{
    for (int k = 0; k < MAX_KEPT; k++)
        if (kept[k].dest && strcmp(kept[k].dest, dest) == 0)
            return &kept[k];
    return NULL;
}

static void forget(struct kept_mount *k)
{
    close(k->fd);
    k->dest = NULL;
}

void tpl_choose_kept(const struct sbx_ctx *c, unsigned char *skip)
{
    for (uint32_t k = 0; k < c->h->n_ops; k++) {
        struct kept_mount *rec = keepable(c, k) ? kept_at(sbx_str(c, c->ops[k].dest)) : NULL;
        skip[k] = rec && untouched(rec, c->ops[k].kind);
        if (rec && !skip[k])
            forget(rec);
    }
}

/* A record of the mount at `dest` as the reset made it: 0, or -1. */
static int record(struct kept_mount *rec, const char *dest, uint32_t kind)
{
    /* A devpts root's entries are read through this fd before each request:
     * without O_NOATIME that read would move the atime the next check
     * compares (relatime updates it while it is not later than the mtime),
     * and the devpts would be made again every other request. O_NOATIME
     * needs the inode's owner or CAP_FOWNER over it: without it, as before. */
    int flags = kind == SBX_OP_TMPFS ? O_PATH : O_RDONLY | O_NOATIME;
    int fd = open(dest, flags | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == EPERM && (flags & O_NOATIME))
        fd = open(dest, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fstat(fd, &rec->st) < 0 || (kind == SBX_OP_TMPFS && !one_inode(fd, &rec->used_blocks)) ||
        (kind == SBX_OP_DEVPTS && (fstatat(fd, "ptmx", &rec->ptmx, AT_SYMLINK_NOFOLLOW) < 0 || !ptmx_alone(fd)))) {
        close(fd);
        return -1;
    }
    rec->fd = fd;
    rec->dest = dest;
    return 0;
}

void tpl_record_kept(const struct sbx_ctx *c, const unsigned char *skip)
{
    for (uint32_t k = 0; k < c->h->n_ops; k++) {
        if (skip[k] || !keepable(c, k))
            continue;
        struct kept_mount *rec = kept_at(sbx_str(c, c->ops[k].dest));
        for (int j = 0; !rec && j < MAX_KEPT; j++)
            rec = kept[j].dest ? NULL : &kept[j];
        if (!rec)
            return;
        if (rec->dest)
            forget(rec);
        record(rec, sbx_str(c, c->ops[k].dest), c->ops[k].kind);
    }
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

/* A network namespace is kept when it holds no socket any more: every
 * process of the last request is gone, and with them every socket but
 * TCP's that outlive their owners (TIME_WAIT, FIN_WAIT, orphans). Links,
 * addresses, routes and sysctls were never the command's to change (it
 * holds no capability over the namespace). The namespace's own counters
 * say it: /proc/net/sockstat's "sockets: used" counts every socket of the
 * namespace, of any family, still allocated (an orphan, a FIN_WAIT one,
 * one in flight in another's queue too), but for the socket pair pid 1
 * and its maker keep there; "tw" its TCP TIME_WAIT entries (IPv4 and IPv6:
 * one death row per namespace), FRAG its queued fragments. Reading
 * /proc/net/tcp and the like instead walks the kernel's global hash tables,
 * every namespace's buckets: about 2 ms of CPU.
 *
 * This network namespace's sockstat and sockstat6, open since it was made
 * (a /proc/net file shows the namespace it was opened in; each read at
 * offset 0 shows its counters now): -1, not open yet; sockstat6 -2, none
 * (no IPv6 here). */
static int sockstat_fd = -1, sockstat6_fd = -1;

void tpl_net_renewed(void)
{
    if (sockstat_fd >= 0)
        close(sockstat_fd);
    if (sockstat6_fd >= 0)
        close(sockstat6_fd);
    sockstat_fd = sockstat6_fd = -1;
}

static int read_counters(int fd, char *buf, size_t len)
{
    ssize_t n = pread(fd, buf, len - 1, 0);
    if (n <= 0 || (size_t)n == len - 1)
        return -1;
    buf[n] = 0;
    return 0;
}

int tpl_net_empty(const struct sbx_ctx *c, long own)
{
    char buf[1024];
    if (sockstat_fd < 0 && (sockstat_fd = sbx_proc_open(c, "thread-self/net/sockstat", O_RDONLY)) < 0)
        return 0;
    if (sockstat6_fd == -1 && (sockstat6_fd = sbx_proc_open(c, "thread-self/net/sockstat6", O_RDONLY)) < 0)
        sockstat6_fd = errno == ENOENT ? -2 : -1;
    if (sockstat6_fd == -1 || read_counters(sockstat_fd, buf, sizeof buf) < 0)
        return 0;
    if (stat_after(buf, "sockets: used ") != own || stat_after(buf, " tw ") != 0 || stat_after(buf, "FRAG: inuse ") != 0)
        return 0;
    if (sockstat6_fd == -2)
        return 1;
    return read_counters(sockstat6_fd, buf, sizeof buf) == 0 && stat_after(buf, "FRAG6: inuse ") == 0;
}

/* An IPC namespace is kept when it holds no object: no SysV shared memory
 * segment, message queue or semaphore set (the namespace's own counts,
 * SHM_INFO, MSG_INFO, SEM_INFO: a segment marked for removal but still
 * attached is counted until it goes), and no POSIX queue, each an entry of
 * its mqueue filesystem's root, whose stat moves with every queue made or
 * removed (its size counts them; mtime and ctime). Its sysctls (limits,
 * next ids) are not the command's to write: /proc/sys is read-only in
 * every sandbox of a root caller, and the files belong to uid 0 of the
 * template's user namespace, which an unprivileged caller's does not map.
 *
 * The root of this IPC namespace's mqueue filesystem (every POSIX queue of
 * the namespace is an entry there, whether or not the sandbox mounts it),
 * and its stat as the reset left it: -1, none (never kept). */
static int mq_root = -1;
static struct stat mq_st;

void tpl_ipc_renewed(void)
{
    if (mq_root >= 0)
        close(mq_root);
    int fs = (int)syscall(SYS_fsopen, "mqueue", FSOPEN_CLOEXEC);
    mq_root = -1;
    if (fs < 0)
        return;
    if (syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) == 0)
        mq_root = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, 0);
    close(fs);
    if (mq_root >= 0 && fstat(mq_root, &mq_st) < 0) {
        close(mq_root);
        mq_root = -1;
    }
}

int tpl_ipc_empty(void)
{
    struct shm_info shm;
    struct msginfo msg;
    struct seminfo sem;
    struct stat st;
    union {
        int val;
        struct semid_ds *buf;
        unsigned short *array;
        struct seminfo *__buf;
    } arg = {.__buf = &sem};
    if (mq_root < 0 || shmctl(0, SHM_INFO, (struct shmid_ds *)(void *)&shm) < 0 || shm.used_ids ||
        msgctl(0, MSG_INFO, (struct msqid_ds *)(void *)&msg) < 0 || msg.msgpool ||
        semctl(0, 0, SEM_INFO, arg) < 0 || sem.semusz)
        return 0;
    return fstat(mq_root, &st) == 0 && same_stat(&st, &mq_st);
}
