/* util.c: async-signal-safe helpers for the child, and raw syscall wrappers. */
#include "internal.h"
#include "execpath.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

void sbx_ctx_take_input(struct sbx_ctx *c, const struct sbx_input *in)
{
    c->in = *in;
    c->h = (const void *)in->blob;
    c->ops = (const void *)(in->blob + c->h->ops_off);
}

void sbx_ctx_init(struct sbx_ctx *c, const struct sbx_mode *mode, const struct sbx_input *in,
                  struct sbx_result *res)
{
    memset(c, 0, sizeof *c);
    c->mode = mode;
    c->res = res;
    c->root_fd = -1;
    c->proc_fd = -1;
    c->host_tree_fd = -1;
    c->userns_fd = -1;
    c->keep_fd = -1;
    c->inner_pid = -1;
    sbx_ctx_take_input(c, in);
}

const char *sbx_str(const struct sbx_ctx *c, uint32_t off)
{
    return off ? c->in.blob + off : NULL;
}

int64_t sbx_now_ns(void)
{
    struct timespec ts;
    /* clock_gettime is async-signal-safe (POSIX) and served by the vDSO. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void sbx_stamp(struct sbx_ctx *c, int which)
{
    c->res->t_ns[which] = (uint64_t)sbx_now_ns();
}

void sbx_report_fd(int fd, int step, int op, int err, int detail)
{
    struct sbx_report r = {step, op, err, detail};
    sbx_write_all(fd, &r, sizeof r);
}

/* The parent's side of sbx_report_fd: 1 if a whole report was read, 0 at
 * EOF without one (the writer exec'd or exited, closing its end). */
int sbx_read_report(int fd, struct sbx_report *r)
{
    size_t got = 0;
    while (got < sizeof *r) {
        ssize_t n = read(fd, (char *)r + got, sizeof *r - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    return got == sizeof *r;
}

/* The sandbox never ran its command: record why (a child that died without
 * a report crashed; its signal is the error), and kill and reap what is
 * left of it so nothing survives. */
void sbx_reap_failed_setup(pid_t pid, const struct sbx_report *r, struct sbx_result *res)
{
    res->step = r->step;
    res->op = r->op;
    res->err = r->err;
    res->detail = r->detail;
    kill(pid, SIGKILL);
    while (waitpid(pid, &res->wait_status, 0) < 0 && errno == EINTR)
        ;
    if (res->step == SBX_STEP_CRASHED && WIFSIGNALED(res->wait_status))
        res->err = WTERMSIG(res->wait_status);
}

void sbx_close_all_but(int *keep, int n, unsigned from)
{
    for (int i = 1; i < n; i++) /* insertion sort: a few fds */
        for (int j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
            int t = keep[j];
            keep[j] = keep[j - 1];
            keep[j - 1] = t;
        }
    unsigned lo = from;
    for (int k = 0; k < n; k++) {
        if (keep[k] < 0 || (unsigned)keep[k] < lo) /* none, one below `from` or twice */
            continue;
        if ((unsigned)keep[k] > lo)
            syscall(SYS_close_range, lo, (unsigned)keep[k] - 1, 0);
        lo = (unsigned)keep[k] + 1;
    }
    syscall(SYS_close_range, lo, ~0U, 0);
}

_Noreturn void sbx_fail(struct sbx_ctx *c, int step, int op, int err, int detail)
{
    if (c->in.lease_fd >= 0) {
        struct sbx_report r = {step, op, err, detail};
        sbx_send_fds(c->in.err_fd, &r, sizeof r, &c->in.lease_fd, 1);
    } else {
        sbx_report_fd(c->in.err_fd, step, op, err, detail);
    }
    _exit(125);
}

#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL /* linux/pidfd.h, 6.9 */
#endif

/* A pidfd of the calling thread, to be checked by the child it clones
 * (sbx_die_with_spawner); -1 where the kernel has no thread pidfds. */
int sbx_open_spawner(void)
{
    return (int)syscall(SYS_pidfd_open, (pid_t)syscall(SYS_gettid), PIDFD_THREAD);
}

/* The parent-death signal comes when the thread that cloned us exits, but
 * only if it is armed by then: a spawner that died between our clone and
 * this prctl has already re-parented us, and no signal will come. Its
 * pidfd, readable once it has exited, closes that window (as bwrap's
 * getppid() check does; in a new pid namespace getppid() says 0). */
void sbx_die_with_spawner(struct sbx_ctx *c, int sig)
{
    if (prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) < 0)
        sbx_fail(c, SBX_STEP_PDEATHSIG, -1, errno, SBX_D_NONE);
    struct pollfd spawner = {c->in.spawner_fd, POLLIN, 0};
    if (c->in.spawner_fd >= 0 && poll(&spawner, 1, 0) == 1)
        _exit(125);
}

size_t sbx_strlen(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

char *sbx_stpcpy(char *dst, const char *src)
{
    while ((*dst = *src++))
        dst++;
    return dst;
}

char *sbx_fmt_uint(char *dst, unsigned long value, unsigned base)
{
    char tmp[32];
    int n = 0;
    do {
        tmp[n++] = "0123456789abcdef"[value % base];
        value /= base;
    } while (value);
    while (n)
        *dst++ = tmp[--n];
    *dst = 0;
    return dst;
}

int sbx_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int sbx_write_file(int dirfd, const char *path, const char *text)
{
    int fd = openat(dirfd, path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = sbx_write_all(fd, text, sbx_strlen(text));
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

static long libc_execve(const char *path, char *const argv[], char *const envp[])
{
    execve(path, argv, envp);
    return -errno;
}

/* Returns only on failure, with errno set to what should be reported. */
int sbx_exec_search(const char *file, char *const argv[], char *const envp[], const char *path, char **sh_argv)
{
    errno = sbx_exec_path(file, argv, envp, path, libc_execve, sh_argv);
    return -1;
}

int sbx_set_rlimit(int resource, uint64_t soft, uint64_t hard)
{
    /* the kernel's struct rlimit64, whatever the width of rlim_t */
    struct {
        uint64_t cur, max;
    } limit = {soft, hard};
    return (int)syscall(SYS_prlimit64, 0, resource, &limit, NULL);
}

int sbx_open_tree(int dfd, const char *path, unsigned flags)
{
    return (int)syscall(SYS_open_tree, dfd, path, flags);
}

int sbx_move_mount(int from_dfd, const char *from, int to_dfd, const char *to, unsigned flags)
{
    return (int)syscall(SYS_move_mount, from_dfd, from, to_dfd, to, flags);
}

int sbx_mount_setattr(int dfd, const char *path, unsigned flags, uint64_t set, uint64_t clr)
{
    struct mount_attr attr = {.attr_set = set, .attr_clr = clr};
    return (int)syscall(SYS_mount_setattr, dfd, path, flags, &attr, sizeof attr);
}

int sbx_fsopen(const char *fstype, unsigned flags)
{
    return (int)syscall(SYS_fsopen, fstype, flags);
}

int sbx_fsconfig(int fd, unsigned cmd, const char *key, const void *value, int aux)
{
    return (int)syscall(SYS_fsconfig, fd, cmd, key, value, aux);
}

int sbx_fsmount(int fd, unsigned flags, unsigned attrs)
{
    return (int)syscall(SYS_fsmount, fd, flags, attrs);
}

int sbx_openat2(int dfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve)
{
    struct open_how how = {.flags = flags, .mode = mode, .resolve = resolve};
    return (int)syscall(SYS_openat2, dfd, path, &how, sizeof how);
}

int sbx_path_exists(int dirfd, const char *path, uint64_t resolve)
{
    /* O_PATH: nothing is opened for reading (no device or FIFO is touched);
     * O_NOFOLLOW: a final symlink is the entry itself. */
    int fd = sbx_openat2(dirfd, path, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0, resolve);
    if (fd < 0)
        return -errno;
    close(fd);
    return 0;
}

int sbx_pivot_root(const char *new_root, const char *put_old)
{
    return (int)syscall(SYS_pivot_root, new_root, put_old);
}

/* Open `rel` under the procfs this child uses: its own root's /proc
 * natively (the host's, before the pivot), or the fd a Template holds. */
int sbx_proc_open(const struct sbx_ctx *c, const char *rel, int flags)
{
    if (c->in.proc_dir >= 0)
        return openat(c->in.proc_dir, rel, flags | O_CLOEXEC);
    char path[64];
    sbx_stpcpy(sbx_stpcpy(path, "/proc/"), rel);
    return open(path, flags | O_CLOEXEC);
}

/* chmod `rel` under that procfs (a magic link: its target is changed). */
int sbx_proc_chmod(const struct sbx_ctx *c, const char *rel, unsigned mode)
{
    if (c->in.proc_dir >= 0)
        return fchmodat(c->in.proc_dir, rel, mode, 0);
    char path[64];
    sbx_stpcpy(sbx_stpcpy(path, "/proc/"), rel);
    return chmod(path, mode);
}

/* The caller's read of an fd: until one byte or EOF (a signal or an error
 * ends the wait too, as bwrap's read), then the fd is closed. */
void sbx_block_on(int fd)
{
    char b;
    if (fd < 0)
        return;
    while (read(fd, &b, 1) < 0 && errno == EINTR)
        ;
    close(fd);
}
