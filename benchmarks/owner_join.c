/* owner_join.c: a proof, and the cost, of the WorkerPool's lease design,
 * which needs no capability in the zygote (issue 26 item 2; standalone).
 *
 *     gcc -O2 -D_FORTIFY_SOURCE=2 -o /tmp/owner_join benchmarks/owner_join.c
 *     /tmp/owner_join          # three tasks, each checking what it can and cannot do
 *     /tmp/owner_join time     # CPU per sandbox: joined this way, against a fresh netns
 *
 * Runs as root and unprivileged (it makes its own user namespaces).
 *
 * Why not the process-wide pool as it is: setns(CLONE_NEWNET) needs
 * CAP_SYS_ADMIN over the namespace's owning user namespace and over the
 * joiner's own. The pool's namespaces are owned by its user namespace P, a
 * child of the caller's (as root: the host's initial one). The zygote, in a
 * user namespace Z of its own and with no capability, has none over P; a
 * task, whose user namespace the fork itself makes, has none either. Giving
 * the zygote CAP_SYS_ADMIN over P (as a pooled Template's server has) would
 * give a Python process running the caller's preload host-root's as root.
 *
 * The design shown here: the namespace N is owned by a user namespace Q
 * that is a child of Z, made by the zygote's euid (a factory forked from the
 * zygote would make Q and N). A capability-free process of Z then has every
 * capability in Q (cap_capable's owner rule: Q's parent is its user
 * namespace, Q's owner its euid), so a CLONE_VM|CLONE_VFORK helper of the
 * zygote can setns(Q), setns(N) and clone3(CLONE_NEWUSER|CLONE_NEWPID|
 * CLONE_PARENT) the task as a copy of the zygote's memory. The pid namespace
 * is then owned by the task's user namespace T (it can mount its /proc); the
 * task longjmps back into the zygote's frame, as if fork() had returned 0
 * (to a higher stack address: _FORTIFY_SOURCE's longjmp check passes). T
 * is a child of Q: the task has no capability over N (it cannot set lo's
 * flags, nor join N or Q again). The package does this now: the factory
 * is sandbox/workerpool/nsfactory.py, the caller's NetnsPool adopts it
 * (slots.py), and sbx_fork_sandbox_ns (csrc/core/forksandbox.c) joins a lease. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/sched.h>
#include <net/if.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define DIE(what) do { fprintf(stderr, "%s: %s\n", what, strerror(errno)); exit(1); } while (0)

static void put(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        DIE(path);
    close(fd);
}

static void map_self(unsigned uid, unsigned gid)
{
    char buf[64];
    put("/proc/self/setgroups", "deny");
    snprintf(buf, sizeof buf, "%u %u 1", uid, uid);
    put("/proc/self/uid_map", buf);
    snprintf(buf, sizeof buf, "%u %u 1", gid, gid);
    put("/proc/self/gid_map", buf);
}

static jmp_buf back;
static int q_fd, n_fd;

static int helper(void *arg)
{
    (void)arg;
    if (setns(q_fd, CLONE_NEWUSER) < 0) { perror("helper setns(Q)"); _exit(1); }
    if (setns(n_fd, CLONE_NEWNET) < 0) { perror("helper setns(N)"); _exit(2); }
    unsigned long tid_addr = 0;
    prctl(PR_GET_TID_ADDRESS, &tid_addr, 0, 0, 0);
    struct clone_args a;
    memset(&a, 0, sizeof a);
    a.flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_PARENT | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID;
    a.child_tid = tid_addr;
    long pid = syscall(SYS_clone3, &a, sizeof a);
    if (pid == 0)
        longjmp(back, 1); /* the task: back into the zygote's frame */
    _exit(pid < 0 ? 3 : 0);
}

static unsigned long ino(const char *path)
{
    struct stat st;
    if (stat(path, &st) < 0)
        DIE(path);
    return st.st_ino;
}

#include <sys/resource.h>
#include <time.h>
static double cpu(void){struct rusage a,b;getrusage(RUSAGE_SELF,&a);getrusage(RUSAGE_CHILDREN,&b);return a.ru_utime.tv_sec+a.ru_stime.tv_sec+b.ru_utime.tv_sec+b.ru_stime.tv_sec+(a.ru_utime.tv_usec+a.ru_stime.tv_usec+b.ru_utime.tv_usec+b.ru_stime.tv_usec)/1e6;}
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc, char **argv)
{
    unsigned uid = getuid(), gid = getgid();
    /* the zygote's own user namespace Z (as the native spawn makes it) */
    if (unshare(CLONE_NEWUSER) < 0)
        DIE("unshare Z");
    map_self(uid, gid);
    /* Q and N, made by a process of Z with the zygote's euid */
    int p[2];
    if (pipe(p) < 0)
        DIE("pipe");
    pid_t maker = fork();
    if (maker == 0) {
        if (unshare(CLONE_NEWUSER) < 0) DIE("unshare Q");
        map_self(uid, gid);
        if (unshare(CLONE_NEWNET) < 0) DIE("unshare N");
        if (write(p[1], "x", 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    char c;
    if (read(p[0], &c, 1) != 1) DIE("maker");
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/user", maker);
    q_fd = open(path, O_RDONLY);
    snprintf(path, sizeof path, "/proc/%d/ns/net", maker);
    n_fd = open(path, O_RDONLY);
    if (q_fd < 0 || n_fd < 0) DIE("open ns");
    unsigned long n_ino = ino(path);
    kill(maker, SIGKILL);
    waitpid(maker, NULL, 0);
    /* the zygote holds no capability at all */
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[2];
    memset(none, 0, sizeof none);
    if (syscall(SYS_capset, &hdr, none) < 0) DIE("capset");
    if (setns(n_fd, CLONE_NEWNET) == 0 || errno != EPERM) { fprintf(stderr, "the zygote itself could join N\n"); return 1; }

    if (argc > 1 && strcmp(argv[1], "time") == 0) {
        volatile int n = 300;
        for (volatile int mode = 0; mode < 2; mode++) {
            double c0 = cpu(), t0 = now();
            for (int i = 0; i < n; i++) {
                if (setjmp(back) == 0) {
                    static char stack2[64 * 1024] __attribute__((aligned(16)));
                    int st;
                    if (mode == 0) {
                        pid_t h = clone(helper, stack2 + sizeof stack2, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
                        waitpid(h, &st, 0);
                        wait(&st);
                    } else {
                        struct clone_args a; memset(&a, 0, sizeof a);
                        a.flags = CLONE_NEWUSER | CLONE_NEWPID; a.exit_signal = SIGCHLD;
                        long pid = syscall(SYS_clone3, &a, sizeof a);
                        if (pid == 0) { if (unshare(CLONE_NEWNET) < 0) _exit(9); _exit(0); }
                        waitpid(pid, &st, 0);
                        if (st) { fprintf(stderr, "fresh failed %x\n", st); return 1; }
                    }
                    continue;
                }
                _exit(0);
            }
            printf("%s: %.0f us wall, %.0f us CPU per sandbox (user+pid ns, %s)\n", mode ? "fresh netns" : "joined via Q", (now() - t0) / n * 1e6, (cpu() - c0) / n * 1e6, mode ? "unshare(CLONE_NEWNET) in the child" : "CLONE_VM helper: setns Q, setns N, clone3 CLONE_PARENT");
        }
        return 0;
    }
    volatile int round = 0;
    for (round = 0; round < 3; round++) {
        fflush(stdout);
        if (setjmp(back) == 0) {
            static char stack[64 * 1024] __attribute__((aligned(16)));
            pid_t h = clone(helper, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
            if (h < 0) DIE("clone helper");
            int st;
            waitpid(h, &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st)) { fprintf(stderr, "helper failed %x\n", st); return 1; }
            pid_t task = wait(&st); /* the task is our child (CLONE_PARENT) */
            printf("round %d: task %d ended with %d\n", round, task, WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st));
            continue;
        }
        /* the task, returned into main's frame with our memory */
        int bad = 0;
        if (getpid() != 1) { printf("  task: pid %d, not 1\n", getpid()); bad = 1; }
        if (ino("/proc/self/ns/net") != n_ino) { printf("  task: not in N\n"); bad = 1; }
        if (gettid() != getpid()) { printf("  task: glibc tid wrong\n"); bad = 1; }
        /* no capability over N: lo cannot be brought up */
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        struct ifreq ifr;
        memset(&ifr, 0, sizeof ifr);
        strcpy(ifr.ifr_name, "lo");
        ioctl(s, SIOCGIFFLAGS, &ifr);
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) == 0 || errno != EPERM) { printf("  task: could configure N (%s)\n", strerror(errno)); bad = 1; }
        if (setns(n_fd, CLONE_NEWNET) == 0 || errno != EPERM) { printf("  task: could setns N again\n"); bad = 1; }
        if (setns(q_fd, CLONE_NEWUSER) == 0) { printf("  task: could join Q\n"); bad = 1; }
        /* its own mount namespace and a proc of its own pid namespace */
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) { perror("  task: mount ns"); bad = 1; }
        else if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) { perror("  task: mount proc"); bad = 1; }
        else {
            char buf[32] = {0};
            if (readlink("/proc/self", buf, sizeof buf - 1) < 0 || strcmp(buf, "1")) { printf("  task: /proc/self=%s\n", buf); bad = 1; }
        }
        printf("  task (round %d): uid %d, %s\n", round, getuid(), bad ? "FAILED" : "ok");
        fflush(stdout);
        _exit(bad);
    }
    return 0;
}
