/* init.c: sandbox-init, the pid 1 of a sandbox's pid namespace.
 *
 * The child that set the sandbox up shares its caller's memory, so it execs
 * this small program instead of staying resident:
 *     sandbox-init [--lock-file LOCK]... ERR_FD STATUS_FD PATH --[MASK] COMMAND [ARGS...]
 * It takes a read lock (fcntl F_SETLK, F_RDLCK, the whole file) on each LOCK,
 * a path inside the sandbox, before COMMAND exists, and holds it until the
 * sandbox ends: bwrap's --lock-file, which its pid 1 holds too (a lock that
 * fails is reported on ERR_FD, and nothing runs). It forks COMMAND (reporting an exec failure on ERR_FD, as the setup child
 * would; MASK, in hex, is the signal mask COMMAND starts with, default none
 * blocked), forwards the signals it receives to COMMAND, reaps every orphan
 * re-parented to it, and when COMMAND ends kills and reaps whatever is left
 * in the namespace, then writes COMMAND's raw wait status to STATUS_FD and
 * exits. Nothing outlives the command, and the caller may take the status
 * as the sandbox's end without waiting for pid 1's own exit, in which the
 * kernel tears the namespaces down (its mounts one by one).
 * Signals from inside the namespace cannot kill pid 1 (the kernel drops
 * those it has no handler for), so the status pipe, not our own exit
 * status, carries "killed by signal N" out.
 *
 *     sandbox-init --exec-default-signals PROGRAM [ARGS...]
 * only execs PROGRAM with every signal at its default disposition and none
 * blocked: the bwrap backend starts bwrap through it, since bwrap passes on
 * what it inherits and subprocess cannot reset ignored signals.
 *
 *     sandbox-init --enter-cgroups FD[,FD...] [--exec-default-signals] PROGRAM [ARGS...]
 * first writes "0" to each FD (a cgroup's v1 `tasks` or v2 cgroup.procs)
 * and closes it, so that PROGRAM and all it forks are born in those
 * cgroups: the bwrap backend starts bwrap so. A process that moves itself
 * takes no global lock on v1, where the caller moving bwrap's child by its
 * pid waits for an RCU grace period (ms). Exit status 124 if one cannot be
 * entered.
 *
 * It is built freestanding on x86_64 (no libc: raw syscalls, its own entry
 * point), because static glibc's start-up alone costs ~250 µs per exec in a
 * VM (CPUID exits while it sizes caches and resolves ifuncs); elsewhere it
 * falls back to libc's syscall().
 */
#include "execpath.h"
#include "sandbox.h"

#include <asm/unistd.h>
#include <linux/signal.h>

#define WNOHANG 1
#define WALL 0x40000000 /* __WALL: children whatever their exit signal */
#define ECHILD 10
#define SIGKILL_NR 9
#define F_SETFD 2
#define FD_CLOEXEC 1
#define F_SETLK 6
#define F_DUPFD_CLOEXEC 1030
#define F_RDLCK 0
#define O_RDONLY_CLOEXEC 02000000 /* O_RDONLY | O_CLOEXEC */
#define AT_FDCWD_ (-100)
#define SIGCHLD_NR 17

#if defined(__x86_64__) && !defined(SBX_INIT_LIBC)
static long sys6(long n, long a, long b, long c, long d, long e, long f)
{
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
#else
#include <errno.h>
#include <unistd.h>
static long sys6(long n, long a, long b, long c, long d, long e, long f)
{
    long r = syscall(n, a, b, c, d, e, f);
    return r < 0 ? -errno : r;
}
#endif

#define SYS(n, a, b, c) sys6(__NR_##n, (long)(a), (long)(b), (long)(c), 0, 0, 0)

static _Noreturn void die(int code)
{
    for (;;)
        SYS(exit_group, code, 0, 0);
}

static void write_all(int fd, const void *buf, long len)
{
    const char *p = buf;
    while (len > 0) {
        long n = SYS(write, fd, p, len);
        if (n == -4) /* EINTR */
            continue;
        if (n < 0)
            return;
        p += n;
        len -= n;
    }
}

static void report(int fd, int step, int op, int err)
{
    struct sbx_report r = {.step = step, .op = op, .err = err, .detail = SBX_D_NONE};
    write_all(fd, &r, sizeof r);
}

/* struct flock on 64-bit Linux: l_type, l_whence, l_start, l_len, l_pid */
struct flock_ {
    short type, whence;
    long start, len;
    int pid;
};

/* A read lock on each of `paths` (n of them), held by this process through
 * an fd above `above` (close-on-exec: COMMAND does not get it); a POSIX lock
 * is this process's own, so COMMAND's copies of the fds going away at its
 * exec leave it. The fds, in increasing order, go into `fds`. */
static void take_locks(char **paths, int n, int above, int err_fd, int *fds)
{
    for (int i = 0; i < n; i++) {
        long fd = sys6(__NR_openat, AT_FDCWD_, (long)paths[i], O_RDONLY_CLOEXEC, 0, 0, 0);
        long high = fd < 0 ? fd : SYS(fcntl, fd, F_DUPFD_CLOEXEC, (i ? fds[i - 1] : above) + 1);
        if (fd >= 0) /* before the lock: closing any fd of a file drops the process's locks on it */
            SYS(close, fd, 0, 0);
        struct flock_ lock = {.type = F_RDLCK, .whence = 0 /* SEEK_SET */, .start = 0, .len = 0, .pid = 0};
        long err = high < 0 ? high : SYS(fcntl, high, F_SETLK, &lock);
        if (err < 0) {
            report(err_fd, SBX_STEP_LOCK_FILE, i, (int)-err);
            die(125);
        }
        fds[i] = (int)high;
    }
}

/* Close every fd from 3 up but `keep` (n of them, in increasing order). */
static void close_all_but(const int *keep, int n)
{
    int from = 3;
    for (int i = 0; i < n; i++) {
        if (keep[i] > from)
            SYS(close_range, from, keep[i] - 1, 0);
        from = keep[i] + 1;
    }
    SYS(close_range, from, ~0U, 0);
}

static unsigned long parse_hex(const char *s)
{
    unsigned long v = 0;
    for (; *s; s++)
        v = v << 4 | (unsigned long)(*s <= '9' ? *s - '0' : (*s | 0x20) - 'a' + 10);
    return v;
}

static int streq(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

static int parse_fd(const char *s)
{
    long v = 0;
    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 65535)
            return -1;
        v = v * 10 + (*s - '0');
    }
    return (int)v;
}

static void set_mask(unsigned long mask)
{
    sys6(__NR_rt_sigprocmask, 2 /* SIG_SETMASK */, (long)&mask, 0, sizeof mask, 0, 0);
}

static _Noreturn void exec_default_signals(char **argv, char **envp)
{
    /* all zero: SIG_DFL, no flags, whatever this architecture's layout */
    static const unsigned long dfl[8];
    const long nsig = 8 * sizeof(unsigned long); /* the kernel's sigset, as in set_mask */
    for (long sig = 1; sig <= nsig; sig++)
        if (sig != 9 && sig != 19) /* SIGKILL, SIGSTOP */
            sys6(__NR_rt_sigaction, sig, (long)dfl, 0, nsig / 8, 0, 0);
    set_mask(0);
    SYS(execve, argv[0], argv, envp);
    die(127);
}

/* Write "0" to each fd of the comma-separated list `fds`, and close it. */
static void enter_cgroups(const char *fds)
{
    char one[8];
    while (*fds) {
        int n = 0;
        while (*fds && *fds != ',' && n < (int)sizeof one - 1)
            one[n++] = *fds++;
        one[n] = 0;
        if (*fds == ',')
            fds++;
        int fd = parse_fd(one);
        if (fd < 0 || SYS(write, fd, "0", 1) != 1)
            die(124);
        SYS(close, fd, 0, 0);
    }
}

static long raw_execve(const char *path, char *const argv[], char *const envp[])
{
    return SYS(execve, path, argv, envp);
}

static _Noreturn void run_command(int err_fd, const char *path, unsigned long mask, char **argv, char **envp)
{
    long argc = 0;
    while (argv[argc])
        argc++;
    char *sh_argv[argc + 2];
    set_mask(mask);
    int err = sbx_exec_path(argv[0], argv, envp, path, raw_execve, sh_argv);
    report(err_fd, SBX_STEP_EXEC, -1, err);
    die(err == SBX_ENOENT ? 127 : 126);
}

/* SBX_PDEATH_SIGNAL arrives when the thread that spawned the sandbox exits,
 * which need not be the caller's death. The caller holds the read end of
 * the status pipe until it has collected our status: once no reader is left,
 * poll() reports POLLERR on our write end, and the sandbox ends. The signal
 * can come before that: when a multi-threaded caller is killed, the kernel
 * re-parents us (and signals) as the spawning thread exits, while another
 * thread may still hold the process's files. So after the first such signal
 * the write end stays watched until the reader is gone. */
#define POLLIN 0x001
#define POLLERR 0x008
#define SFD_FLAGS 02004000 /* SFD_CLOEXEC | SFD_NONBLOCK */

struct pollfd_ {
    int fd;
    short events, revents;
};

/* What reap() needs from a signal: struct signalfd_siginfo opens with
 * ssi_signo, ssi_errno, ssi_code, ssi_pid and is 128 bytes long. */
struct sfd_info {
    unsigned int signo;
    int errno_, code;
    unsigned int pid;
    char rest[112];
};

/* The command has ended: kill(-1) from pid 1 reaches every other process of
 * this pid namespace and of those nested in it; each is reaped (orphans are
 * re-parented here) until none is left, and only then does the status go
 * out, so that the caller's wait may end with it. */
static _Noreturn void finish(int status, int status_fd)
{
    SYS(kill, -1, SIGKILL_NR, 0);
    int other;
    long pid;
    while ((pid = sys6(__NR_wait4, -1, (long)&other, WALL, 0, 0, 0)) != -ECHILD)
        if (pid < 0 && pid != -4) /* not EINTR: nothing left to wait for */
            break;
    /* Every process of the sandbox has been reaped (each by its parent, or
     * here): RUSAGE_CHILDREN now covers them all. The kernel's struct
     * rusage opens with two timevals, then ru_maxrss (KiB). */
    long ru[18]; /* filled by the kernel; no initializer (a freestanding build has no memset) */
    struct sbx_end_status end;
    end.status = status;
    end.pad = 0;
    end.utime_us = end.stime_us = end.maxrss_kb = -1;
    if (SYS(getrusage, -1 /* RUSAGE_CHILDREN */, ru, 0) == 0) {
        end.utime_us = (int64_t)ru[0] * 1000000 + ru[1];
        end.stime_us = (int64_t)ru[2] * 1000000 + ru[3];
        end.maxrss_kb = ru[4];
    }
    write_all(status_fd, &end, sizeof end);
    int sig_nr = status & 0x7f;
    die(sig_nr ? 128 + sig_nr : (status >> 8) & 0xff);
}

static void forward_or_reap(const struct sfd_info *info, long command, int status_fd)
{
    if (info->signo != SIGCHLD_NR) {
        /* A sender in an ancestor pid namespace shows as pid 0; a signal
         * sent from inside (the command's kill(0, sig) reaches its whole
         * process group, pid 1 included) already reached its targets. */
        if (info->pid == 0)
            SYS(kill, command, info->signo, 0);
        return;
    }
    int status;
    long pid;
    while ((pid = sys6(__NR_wait4, -1, (long)&status, WNOHANG, 0, 0, 0)) > 0) {
        if (pid == command)
            finish(status, status_fd);
    }
}

/* Wait for signals (every one stays blocked and is read from a signalfd):
 * reap on SIGCHLD; forward to the command what came from outside. */
static _Noreturn void reap(long command, int status_fd)
{
    unsigned long all = ~0UL;
    int sfd = (int)sys6(__NR_signalfd4, -1, (long)&all, sizeof all, SFD_FLAGS, 0, 0);
    if (sfd < 0)
        die(125);
    struct pollfd_ fds[2] = {{sfd, POLLIN, 0}, {status_fd, 0, 0}};
    long watched = 1; /* 2 once the spawning thread is gone */
    for (;;) {
        if (sys6(__NR_ppoll, (long)fds, watched, 0, 0, 8, 0) < 0)
            continue;
        if (fds[1].revents & POLLERR)
            die(125);
        struct sfd_info info;
        while (SYS(read, sfd, &info, sizeof info) == sizeof info) {
            if (info.signo == SBX_PDEATH_SIGNAL)
                watched = 2;
            else
                forward_or_reap(&info, command, status_fd);
        }
    }
}

/* The entry: called by _start (the assembly below) or main, so not static. */
int sbx_init_main(long argc, char **argv, char **envp);

int sbx_init_main(long argc, char **argv, char **envp)
{
    if (argc >= 4 && streq(argv[1], "--enter-cgroups")) {
        enter_cgroups(argv[2]);
        argc -= 2;
        argv += 2;
        if (argc < 3 || !streq(argv[1], "--exec-default-signals")) {
            SYS(execve, argv[1], argv + 1, envp);
            die(127);
        }
    }
    if (argc >= 3 && streq(argv[1], "--exec-default-signals"))
        exec_default_signals(argv + 2, envp);
    char *locks[SBX_MAX_LOCK_FILES];
    int n_locks = 0;
    for (; argc >= 3 && streq(argv[1], "--lock-file"); argc -= 2, argv += 2) {
        if (n_locks == SBX_MAX_LOCK_FILES)
            die(125);
        locks[n_locks++] = argv[2];
    }
    if (argc < 6 || argv[4][0] != '-' || argv[4][1] != '-')
        die(125);
    int err_fd = parse_fd(argv[1]), status_fd = parse_fd(argv[2]);
    if (err_fd < 0 || status_fd < 0)
        die(125);
    SYS(fcntl, err_fd, F_SETFD, FD_CLOEXEC);
    SYS(fcntl, status_fd, F_SETFD, FD_CLOEXEC);
    int kept[SBX_MAX_LOCK_FILES + 1]; /* the status pipe, then the locks' fds above it */
    kept[0] = status_fd;
    take_locks(locks, n_locks, status_fd > err_fd ? status_fd : err_fd, err_fd, kept + 1);
    /* every signal stays blocked here; reap() reads them from a signalfd */
    set_mask(~0UL);
    /* Not dumpable: the command (same uid) can then neither ptrace us (and
     * turn our parent-death signal into EINTR) nor take our status pipe with
     * pidfd_getfd. The command's execve makes it dumpable again. */
    SYS(prctl, 4 /* PR_SET_DUMPABLE */, 0, 0);
    long command = sys6(__NR_clone, SIGCHLD_NR, 0, 0, 0, 0, 0);
    if (command < 0) {
        report(err_fd, SBX_STEP_FORK, -1, (int)-command);
        die(125);
    }
    if (command == 0)
        run_command(err_fd, argv[3], parse_hex(argv[4] + 2), argv + 5, envp);
    /* Keep only the status pipe and the locks: the command's stdio and
     * passed fds must reach EOF when the command (not this reaper) closes them. */
    for (int fd = 0; fd < 3; fd++)
        SYS(close, fd, 0, 0);
    close_all_but(kept, n_locks + 1);
    reap(command, status_fd);
}

#if defined(__x86_64__) && !defined(SBX_INIT_LIBC)
/* The kernel enters here with the stack holding argc, argv..., NULL, envp. */
__asm__(".text\n.global _start\n_start:\n"
        "  xor %ebp, %ebp\n"
        "  mov (%rsp), %rdi\n"
        "  lea 8(%rsp), %rsi\n"
        "  lea 16(%rsp,%rdi,8), %rdx\n"
        "  and $-16, %rsp\n"
        "  call sbx_init_main\n"
        "  hlt\n");
#else
int main(int argc, char **argv, char **envp)
{
    return sbx_init_main(argc, argv, envp);
}
#endif
