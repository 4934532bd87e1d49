/* forksandbox.c: sbx_fork_sandbox(), a sandbox forked from a warm process.
 *
 * A template process already sits in a prepared root (WorkerPool's zygote:
 * an interpreter with its imports done). Each task's sandbox is a fork of it
 * into new namespaces: clone3 without CLONE_VM, so the child gets a copy of
 * the caller's memory (the caller must be single-threaded: only the calling
 * thread is copied), sets itself up over the blob, and then RETURNS 0, as
 * fork() does, so the caller's code runs the task in it. The caller gets the
 * child's pid at once, and its end of a report pipe: sbx_fork_ready() reads
 * there whether the setup worked (so a zygote can go on meanwhile).
 *
 * sbx_fork_sandbox_cg: the child first writes "0" to each of cgroup_fds
 * (cgroup.procs files of the task's own cgroups, opened by the WorkerPool's
 * caller and passed through the zygote as fds only), as sbx_spawn_cg's does;
 * task_fds later closes them with every other fd not kept.
 *
 * The setup is child.c's sequence (sbx_child_steps) in SBX_MODE_FORK: the
 * child's mount namespace is a copy of the template's, so instead of a new
 * root and a pivot the plan's (task) operations are applied in place on it
 * (fresh tmpfs, proc, /dev/shm and devpts over the template's read-only
 * shared ones, private copies of writable files, per-task binds from
 * detached trees: newroot "/"); then lo up, cwd, the probe paths, rlimits,
 * the fd table (every fd but stdio and the kept ones is closed: there is no
 * exec to close them), session, capabilities, NO_NEW_PRIVS, Landlock and
 * seccomp; and instead of an exec, the ready report and the return.
 *
 * With CLONE_NEWPID the child is pid 1 of its pid namespace: when it exits,
 * or is killed, the kernel kills everything it started.
 *
 * libc: fork() tells the child's libc its new thread id through
 * CLONE_CHILD_SETTID on libc's own tid field (raise() and pthread_kill() read
 * it). A raw clone3 does the same here, on the field's address as the kernel
 * knows it (PR_GET_TID_ADDRESS: libc registered it with set_tid_address).
 * Nothing else of fork()'s bookkeeping matters in a single-threaded caller.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef PR_GET_TID_ADDRESS
#define PR_GET_TID_ADDRESS 40
#endif

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The lowest kept fd (a pass fd or the report pipe) at or above `lo`, or -1. */
static int next_kept(const struct sbx_ctx *c, int lo)
{
    int best = c->in.err_fd >= lo ? c->in.err_fd : -1;
    for (int k = 0; k < c->in.n_pass; k++)
        if (c->in.pass_fds[k] >= lo && (best < 0 || c->in.pass_fds[k] < best))
            best = c->in.pass_fds[k];
    return best;
}

/* stdio[i] becomes fd i; then every fd >= 3 but the pass fds and the report
 * pipe is closed (the caller's sockets, its other tasks' fds): nothing will
 * exec, so close-on-exec would not do it. The kept fds keep their flags. */
static void task_fds(struct sbx_ctx *c)
{
    for (int i = 0; i < 3; i++) {
        int src = c->in.stdio[i];
        if (src < 0 || src == i)
            continue;
        if (src < 3) /* an earlier dup2 may have replaced it */
            sbx_fail(c, SBX_STEP_STDIO, i, EINVAL, SBX_D_NONE);
        if (dup2(src, i) < 0)
            sbx_fail(c, SBX_STEP_STDIO, i, errno, SBX_D_NONE);
    }
    for (int lo = 3;;) {
        int keep = next_kept(c, lo);
        unsigned hi = keep < 0 ? ~0U : (unsigned)keep - 1;
        if (keep != lo && syscall(SYS_close_range, (unsigned)lo, hi, 0) < 0)
            sbx_fail(c, SBX_STEP_FDS, lo, errno, SBX_D_NONE);
        if (keep < 0)
            return;
        lo = keep + 1;
    }
}

/* Only a new user and pid namespace come with the clone (a pid namespace
 * can be entered no other way); the child, their owner, makes the others
 * itself. They are the same namespaces (owned by its user namespace), but
 * their cost (a network namespace's ~0.4 ms, the copy of the mount tree)
 * is then the child's, paid on another CPU, not the caller's: a zygote
 * forks one task after another. */
#define CLONED_NS (CLONE_NEWUSER | CLONE_NEWPID)

/* The first moments of the child: its cgroups, the parent-death signal,
 * and the namespaces the clone left to it. Signals stay as they are: the
 * caller's code runs on in this process. */
static void fork_start(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    sbx_stamp(c, SBX_T_CHILD);
    sbx_enter_cgroups(c); /* before anything else: every process the task makes is born inside */
    if (h->opts & SBX_OPT_DIE_WITH_PARENT)
        sbx_die_with_spawner(c, SIGKILL);
    if (c->in.spawner_fd >= 0)
        close(c->in.spawner_fd);
    unsigned long others = sbx_clone_flags(h->ns) & ~(unsigned long)CLONED_NS;
    if (c->in.join_netns_fd >= 0) /* joined at the clone (clone_joined): lo is up, and not ours to touch */
        others &= ~(unsigned long)CLONE_NEWNET;
    if (others && unshare((int)others) < 0)
        sbx_fail(c, SBX_STEP_CLONE, -1, errno, SBX_D_NONE);
}

/* Set up: instead of an exec, tell the parent, and return into the
 * caller's code. A record without a step says we are ready (EOF alone would
 * mean we died); its detail is the Landlock ABI applied. Our timing stamps
 * follow (our memory is not the parent's). */
static void return_ready(struct sbx_ctx *c)
{
    sbx_stamp(c, SBX_T_READY);
    sbx_report_fd(c->in.err_fd, SBX_STEP_NONE, -1, 0, c->res->landlock_abi);
    sbx_write_all(c->in.err_fd, c->res->t_ns, sizeof c->res->t_ns);
    close(c->in.err_fd);
}

const struct sbx_mode SBX_MODE_FORK = {
    .name = "fork",
    .start = fork_start,
    .netns_ready = 1,
    .fd_table = task_fds,
    .report_started = sbx_started_by_exec,
    .run = return_ready,
};

static int count_detached(const struct sbx_header *h, const struct sbx_op *ops)
{
    int n = 0;
    for (uint32_t i = 0; i < h->n_ops; i++)
        if (ops[i].kind == SBX_OP_BIND && (ops[i].flags & SBX_F_FROM_FD))
            n++;
    return n;
}

static unsigned long tid_address(void)
{
    unsigned long tid_addr = 0;
    return prctl(PR_GET_TID_ADDRESS, &tid_addr, 0, 0, 0) < 0 ? 0 : tid_addr;
}

static pid_t clone_task(unsigned long flags)
{
    unsigned long tid_addr = tid_address();
    if (!tid_addr)
        return -1;
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = flags | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID;
    args.child_tid = tid_addr;
    args.exit_signal = SIGCHLD;
    return (pid_t)syscall(SYS_clone3, &args, sizeof args);
}

/* A task in a leased network namespace N (a WorkerPool's own supply,
 * sandbox/netpool with an adopted factory): N is owned by a user namespace
 * Q that a process of the zygote's sandbox made with the zygote's euid, so
 * the zygote, capability-free in its own user namespace Z (Q's parent), has
 * every capability in Q (the kernel's owner rule) and may setns() into Q
 * and N. sbx_fork_sandbox_ns's caller stays where it is: a
 * CLONE_VM|CLONE_VFORK joiner enters Q and N and clones the task from
 * there, with CLONE_PARENT (the caller's child, SIGCHLD as the joiner's)
 * and a new user namespace T, a child of Q: the task holds no capability
 * over N (lo, routes, sysctls stay as the pool made them) and cannot
 * setns() into it, nor into Q, again. The task is a copy of the caller's
 * memory as the joiner shares it: it longjmps back into sbx_fork_task's
 * frame (on the caller's stack, above the joiner's mmapped one, as
 * _FORTIFY_SOURCE's longjmp check wants) and returns 0 from there, as a
 * fork would. benchmarks/owner_join.c is the standalone proof and its cost
 * (~0.2 ms of CPU against ~0.6 fresh). The zygote itself joins Q once and
 * clones from there (SBX_FORK_STAY, below): the same T, without a joiner. */
struct fork_joiner {
    int userns_fd, netns_fd;
    unsigned long flags, tid_addr;
    pid_t pid;
    int err, step;
    jmp_buf back;
};

static int joiner_main(void *arg)
{
    struct fork_joiner *j = arg;
    j->step = SBX_STEP_JOIN_NETNS;
    if (setns(j->userns_fd, CLONE_NEWUSER) < 0 || setns(j->netns_fd, CLONE_NEWNET) < 0) {
        j->err = errno;
        _exit(0);
    }
    struct clone_args args;
    memset(&args, 0, sizeof args); /* exit_signal 0: CLONE_PARENT takes the joiner's (SIGCHLD) */
    args.flags = j->flags | CLONE_PARENT | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID;
    args.child_tid = j->tid_addr;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0)
        longjmp(j->back, 1);
    j->step = SBX_STEP_CLONE;
    j->err = pid < 0 ? errno : 0;
    j->pid = (pid_t)pid;
    _exit(0);
}

/* The joiner's part, in the zygote: (the task's pid, or -1 with j->step and
 * errno set). */
static pid_t clone_joined(struct fork_joiner *j)
{
    j->pid = -1;
    j->err = 0;
    j->step = SBX_STEP_CLONE;
    j->tid_addr = tid_address();
    if (!j->tid_addr)
        return -1;
    pid_t joiner = sbx_clone_vm(joiner_main, j, 0, SBX_CHILD_STACK);
    if (joiner < 0)
        return -1;
    while (waitpid(joiner, NULL, 0) < 0 && errno == EINTR)
        ;
    errno = j->err;
    return j->pid;
}

/* A caller that forks task after task into leases of one supply (a
 * WorkerPool's zygote: SBX_FORK_STAY) joins their owner Q itself, once, and
 * stays there, rather than through a joiner per fork (its clone, stack and
 * exit, and the caller's wait for it: the joiner, preempted by the task it
 * just cloned, kept the zygote waiting ~1 ms per fork). The caller must be
 * single-threaded and share no fs (setns(CLONE_NEWUSER)'s rule). In Q it
 * makes a network namespace of its own to live in, `home`: for each fork
 * it enters the lease's namespace, clones the task (into a user namespace T,
 * a child of Q, as the joiner's), and goes home, so that a socket it makes
 * later (a spare's) is never counted as the lease's. What it holds in Q it
 * held already (the owner rule); it runs no task code, and its tasks, in T,
 * hold nothing of it. A lease of another owner fails (EXDEV): Q cannot be
 * left for a sibling. */
static struct {
    int joined; /* 1: in Q; -1: joining failed */
    dev_t dev;  /* Q's nsfs identity */
    ino_t ino;
    int home;
} owner = {0, 0, 0, -1};

static int stay_in_owner(int userns_fd)
{
    struct stat st;
    if (owner.joined < 0 || fstat(userns_fd, &st) < 0) {
        errno = owner.joined < 0 ? EPERM : errno;
        return -1;
    }
    if (owner.joined) {
        errno = EXDEV;
        return st.st_dev == owner.dev && st.st_ino == owner.ino ? 0 : -1;
    }
    if (setns(userns_fd, CLONE_NEWUSER) < 0) /* still where it was: the next lease may try again */
        return -1;
    owner.joined = -1; /* in Q there is no way back: without a home there, no lease is entered again */
    if (unshare(CLONE_NEWNET) < 0)
        return -1;
    owner.home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (owner.home < 0)
        return -1;
    owner.joined = 1;
    owner.dev = st.st_dev;
    owner.ino = st.st_ino;
    return 0;
}

/* CPython's fork hooks (PyOS_BeforeFork, PyOS_AfterFork_Parent and
 * _Child), set once by a zygote that calls the fork holding the GIL
 * (ctypes.PyDLL): called here around the clone rather than from Python
 * before and after the call. Every page written after a fork is a
 * copy-on-write fault, and each call made from Python writes pages of its
 * own (the call's objects, ctypes' machinery): ~35 more in every task. */
static void (*py_before_fork)(void), (*py_after_parent)(void), (*py_after_child)(void);

int sbx_fork_python_hooks(void (*before)(void), void (*after_parent)(void), void (*after_child)(void))
{
    if (!before != !after_parent || !before != !after_child)
        return -1; /* all three or none */
    py_before_fork = before;
    py_after_parent = after_parent;
    py_after_child = after_child;
    return 0;
}

static void call_hook(void (*hook)(void))
{
    if (hook)
        hook();
}

static int fail_early(struct sbx_result *res, int step, int err)
{
    res->step = step;
    res->err = err;
    return -1;
}

int sbx_fork_sandbox(const void *blob, size_t len, const int stdio[3], const int *pass_fds, int n_pass,
                     const int *trees, int n_trees, struct sbx_result *res)
{
    return sbx_fork_sandbox_cg(blob, len, stdio, pass_fds, n_pass, trees, n_trees, NULL, 0, res);
}

int sbx_fork_sandbox_cg(const void *blob, size_t len, const int stdio[3], const int *pass_fds, int n_pass,
                        const int *trees, int n_trees, const int *cgroup_fds, int n_cgroup,
                        struct sbx_result *res)
{
    return sbx_fork_sandbox_ns(blob, len, stdio, pass_fds, n_pass, trees, n_trees, cgroup_fds, n_cgroup, NULL, res);
}

int sbx_fork_sandbox_ns(const void *blob, size_t len, const int stdio[3], const int *pass_fds, int n_pass,
                        const int *trees, int n_trees, const int *cgroup_fds, int n_cgroup, const int join_ns[2],
                        struct sbx_result *res)
{
    return sbx_fork_task(blob, len, stdio, pass_fds, n_pass, trees, n_trees, cgroup_fds, n_cgroup, join_ns,
                         SBX_FORK_HOOKS, res);
}

void sbx_python_before_fork(void)
{
    call_hook(py_before_fork);
}

void sbx_python_after_parent(void)
{
    call_hook(py_after_parent);
}

int sbx_fork_task(const void *blob, size_t len, const int stdio[3], const int *pass_fds, int n_pass,
                  const int *trees, int n_trees, const int *cgroup_fds, int n_cgroup, const int join_ns[2],
                  unsigned opts, struct sbx_result *res)
{
    memset(res, 0, sizeof *res);
    res->pid = -1;
    res->status_fd = -1;
    res->op = -1;
    res->t_ns[SBX_T_START] = now_ns();
    if (sbx_check_blob(blob, len) < 0)
        return fail_early(res, SBX_STEP_CONFIG, EINVAL);
    const struct sbx_header *h = blob;
    const struct sbx_op *ops = (const void *)((const char *)blob + h->ops_off);
    const char *newroot = (const char *)blob + h->newroot;
    int joined = join_ns && join_ns[1] >= 0;
    if ((h->opts & SBX_OPT_REAPER) || h->n_listen || count_detached(h, ops) != n_trees ||
        newroot[0] != '/' || newroot[1] != 0 || (joined && (join_ns[0] < 0 || !(h->ns & SBX_NS_NET))))
        return fail_early(res, SBX_STEP_CONFIG, EINVAL);
    int stay = joined && (opts & SBX_FORK_STAY);
    if (stay && (stay_in_owner(join_ns[0]) < 0 || setns(join_ns[1], CLONE_NEWNET) < 0))
        return fail_early(res, SBX_STEP_JOIN_NETNS, errno);
    int errp[2];
    if (sbx_high_pipe(errp) < 0) {
        int err = errno;
        if (stay)
            (void)setns(owner.home, CLONE_NEWNET);
        return fail_early(res, SBX_STEP_PIPE, err);
    }
    struct sbx_input in = SBX_INPUT_NONE;
    in.blob = blob;
    for (int i = 0; i < 3; i++)
        in.stdio[i] = stdio[i];
    in.pass_fds = pass_fds;
    in.n_pass = n_pass;
    in.bind_fds = trees;
    in.cgroup_fds = cgroup_fds;
    in.n_cgroup = n_cgroup > 0 && cgroup_fds ? n_cgroup : 0;
    in.err_fd = errp[1];
    in.join_userns_fd = joined ? join_ns[0] : -1;
    in.join_netns_fd = joined ? join_ns[1] : -1;
    in.src_fds = malloc((h->n_ops + 1) * sizeof *in.src_fds);
    if (!in.src_fds) {
        close(errp[0]);
        close(errp[1]);
        if (stay)
            (void)setns(owner.home, CLONE_NEWNET);
        return fail_early(res, SBX_STEP_PIPE, ENOMEM);
    }
    in.spawner_fd = sbx_open_spawner();
    struct sbx_ctx c;
    sbx_ctx_init(&c, &SBX_MODE_FORK, &in, res);
    /* Every signal blocked across the clone: no handler of the caller's may
     * run in the child before it is set up. Both sides restore the mask. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    unsigned long flags = sbx_clone_flags(h->ns) & CLONED_NS;
    struct fork_joiner j = {.userns_fd = in.join_userns_fd, .netns_fd = in.join_netns_fd, .flags = flags};
    pid_t pid;
    if (opts & SBX_FORK_HOOKS)
        call_hook(py_before_fork);
    if (!joined || stay)
        pid = clone_task(flags);
    else if (setjmp(j.back) == 0)
        pid = clone_joined(&j);
    else
        pid = 0; /* the task, back from joiner_main */
    if (pid == 0) {
        close(errp[0]);
        sbx_child_steps(&c);
        free(in.src_fds);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        call_hook(py_after_child);
        return 0;
    }
    int clone_err = errno;
    if (stay) /* a later socket of ours is not the lease's */
        (void)setns(owner.home, CLONE_NEWNET);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (opts & SBX_FORK_HOOKS)
        call_hook(py_after_parent);
    res->t_ns[SBX_T_RETURN] = now_ns();
    free(in.src_fds);
    if (in.spawner_fd >= 0)
        close(in.spawner_fd);
    close(errp[1]);
    if (pid < 0) {
        close(errp[0]);
        return fail_early(res, joined && !stay ? j.step : SBX_STEP_CLONE, clone_err);
    }
    res->pid = pid;
    res->status_fd = errp[0];
    return pid;
}

static int death_note_fd = -1;
static uint64_t death_note_base;

static int is_fault(int sig, const siginfo_t *info)
{
    int synchronous = sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE || sig == SIGTRAP;
    return synchronous && info->si_code > 0; /* > 0: raised by the kernel, not by kill() or raise() */
}

static void note_death(int sig, siginfo_t *info, void *context)
{
    (void)context;
    uint64_t word = death_note_base + (uint64_t)sig;
    sbx_write_all(death_note_fd, &word, sizeof word);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    if (!is_fault(sig, info))
        _exit(128 + sig);
    /* return: the faulting instruction runs again, and its signal, now
     * with the default action, kills even a pid namespace's init */
}

int sbx_task_death_notes(int note_fd, uint64_t died_base)
{
    static const int fatal[] = {SIGHUP, SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGUSR1, SIGSEGV,
                                SIGUSR2, SIGALRM, SIGTERM, SIGSTKFLT, SIGXCPU, SIGVTALRM, SIGPROF, SIGIO,
                                SIGPWR, SIGSYS};
    static int installed; /* a fork inherits the handlers: the zygote installs them once, a task sets its fd */
    death_note_fd = note_fd;
    death_note_base = died_base;
    if (installed)
        return 0;
    installed = 1;
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_sigaction = note_death;
    act.sa_flags = SA_SIGINFO;
    sigfillset(&act.sa_mask);
    for (size_t i = 0; i < sizeof fatal / sizeof *fatal; i++) {
        struct sigaction now;
        if (sigaction(fatal[i], NULL, &now) < 0)
            return -1;
        if (!(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_DFL && sigaction(fatal[i], &act, NULL) < 0)
            return -1;
    }
    return 0;
}

int sbx_fork_ready(int report_fd, int pid, struct sbx_result *res)
{
    struct sbx_report r = {SBX_STEP_CRASHED, -1, 0, SBX_D_NONE};
    uint64_t t[SBX_N_STAMPS];
    int reported = sbx_read_report(report_fd, &r);
    int stamped = reported && r.step == SBX_STEP_NONE && read(report_fd, t, sizeof t) == (ssize_t)sizeof t;
    close(report_fd);
    res->status_fd = -1;
    res->t_ns[SBX_T_DONE] = now_ns();
    if (reported && r.step == SBX_STEP_NONE) {
        for (int k = SBX_T_CHILD; stamped && k <= SBX_T_READY; k++)
            res->t_ns[k] = t[k];
        res->landlock_abi = r.detail;
        return 0;
    }
    sbx_reap_failed_setup(pid, &r, res);
    res->pid = -1;
    return -1;
}
