/* spawn.c: the caller's side of sbx_spawn(): make the pipes and the memory
 * the child needs, clone it, and collect its report. The blob is checked
 * first (wire.c). */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

unsigned long sbx_clone_flags(uint32_t ns)
{
    unsigned long f = 0;
    if (ns & SBX_NS_USER) f |= CLONE_NEWUSER;
    if (ns & SBX_NS_MOUNT) f |= CLONE_NEWNS;
    if (ns & SBX_NS_PID) f |= CLONE_NEWPID;
    if (ns & SBX_NS_NET) f |= CLONE_NEWNET;
    if (ns & SBX_NS_IPC) f |= CLONE_NEWIPC;
    if (ns & SBX_NS_UTS) f |= CLONE_NEWUTS;
    if (ns & SBX_NS_CGROUP) f |= CLONE_NEWCGROUP;
    return f;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A close-on-exec pipe whose ends are >= 3, so the child's dup2 of stdio
 * onto 0-2 can never overwrite them. */
int sbx_high_pipe(int fds[2])
{
    if (pipe2(fds, O_CLOEXEC) < 0)
        return -1;
    for (int i = 0; i < 2; i++) {
        if (fds[i] >= 3)
            continue;
        int hi = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
        int saved = errno;
        close(fds[i]);
        if (hi < 0) {
            close(fds[1 - i]);
            errno = saved;
            return -1;
        }
        fds[i] = hi;
    }
    return 0;
}

static void fail_early(struct sbx_result *res, int step, int err)
{
    res->step = step;
    res->err = err;
}

static void close_pipes(int errp[2], int statp[2])
{
    for (int i = 0; i < 2; i++) {
        close(errp[i]);
        if (statp[i] >= 0)
            close(statp[i]);
    }
}

/* The native spawn: the child shares the caller's memory, so it cannot
 * stay resident; it execs sandbox-init or the command, and the report
 * pipe's close at that exec tells the caller it has started. */
const struct sbx_mode SBX_MODE_SPAWN = {
    .name = "spawn",
    .start = sbx_child_start,
    .fd_table = sbx_command_fds,
    .report_started = sbx_started_by_exec,
    .run = sbx_exec_command,
};

/* Everything the child needs that scales with the input, allocated here
 * (the child may not allocate, and its stack is small): a slot per op for
 * source trees, sandbox-init's argv, and room for a /bin/sh retry. */
static int prepare_memory(struct sbx_input *in, const struct sbx_header *h, char fds[2][16])
{
    size_t argc = 0;
    while (in->argv[argc])
        argc++;
    in->src_fds = malloc((h->n_ops + 1) * sizeof *in->src_fds);
    in->init_argv = malloc((argc + 6 + 2 * h->n_lock) * sizeof *in->init_argv);
    in->sh_argv = malloc((argc + 2) * sizeof *in->sh_argv);
    if (!in->src_fds || !in->init_argv || !in->sh_argv) {
        free(in->src_fds);
        free(in->init_argv);
        free(in->sh_argv);
        return -1;
    }
    sbx_fmt_uint(fds[0], (unsigned)in->err_fd, 10);
    sbx_fmt_uint(fds[1], (unsigned)(in->status_fd >= 0 ? in->status_fd : 0), 10);
    char **a = in->init_argv;
    *a++ = "sandbox-init";
    const uint32_t *locks = (const void *)(in->blob + h->lock_off);
    for (uint32_t i = 0; i < h->n_lock; i++) { /* sbx_check_blob checked every offset */
        *a++ = "--lock-file";
        *a++ = (char *)(in->blob + locks[i]);
    }
    a[0] = fds[0];
    a[1] = fds[1];
    a[2] = (char *)(h->path ? in->blob + h->path : "");
    a[3] = "--"; /* the child writes the command's signal mask here: init_argv[4 + 2 * n_lock] */
    for (size_t i = 0; i <= argc; i++)
        a[4 + i] = in->argv[i];
    return 0;
}

/* The parent's scratch for the child: its memory, and the spawner pidfd. */
static void release_scratch(const struct sbx_input *in)
{
    free(in->src_fds);
    free(in->init_argv);
    free(in->sh_argv);
    if (in->spawner_fd >= 0)
        close(in->spawner_fd);
}

/* Clone the child: the caller's thread sleeps until it exec's or exits.
 * To run in a leased network namespace, a joiner is cloned instead: it
 * enters that namespace and clones the setup child from there. */
static pid_t clone_child(struct sbx_ctx *c, unsigned long flags)
{
    /* The command's mask, if the plan keeps it (sbx_clone_vm blocks all). */
    pthread_sigmask(SIG_SETMASK, NULL, &c->caller_mask);
    if (c->in.join_netns_fd < 0)
        return sbx_clone_vm(sbx_child_main, c, flags, SBX_CHILD_STACK);
    c->inner_flags = flags & ~(unsigned long)CLONE_NEWNET;
    pid_t joiner = sbx_clone_vm(sbx_joiner_main, c, 0, SBX_CHILD_STACK);
    if (joiner < 0)
        return -1;
    /* the joiner has exited: reap it; the setup child is ours now */
    while (waitpid(joiner, NULL, 0) < 0 && errno == EINTR)
        ;
    errno = EINVAL; /* if the joiner failed, its report says why */
    return c->inner_pid;
}

int sbx_spawn(const void *blob, size_t len, char *const argv[], char *const envp[], const int stdio[3],
              const int *pass_fds, int n_pass, int init_fd, const int join_ns[2], int listen_to,
              struct sbx_result *res)
{
    return sbx_spawn_cg(blob, len, argv, envp, stdio, pass_fds, n_pass, init_fd, join_ns, listen_to, NULL, 0, res);
}

int sbx_spawn_cg(const void *blob, size_t len, char *const argv[], char *const envp[], const int stdio[3],
                 const int *pass_fds, int n_pass, int init_fd, const int join_ns[2], int listen_to,
                 const int *cgroup_fds, int n_cgroup, struct sbx_result *res)
{
    memset(res, 0, sizeof *res);
    res->pid = -1;
    res->status_fd = -1;
    res->op = -1;
    res->t_ns[SBX_T_START] = now_ns();
    if (sbx_check_blob(blob, len) < 0 || !argv || !argv[0]) {
        fail_early(res, SBX_STEP_CONFIG, EINVAL);
        return -1;
    }
    const struct sbx_header *h = blob;
    int reaper = (h->opts & SBX_OPT_REAPER) != 0;
    if (h->n_listen && listen_to < 0) {
        fail_early(res, SBX_STEP_FORWARD, EBADF);
        return -1;
    }
    if ((reaper || (h->opts & SBX_OPT_EXEC_FD)) && init_fd < 0) {
        fail_early(res, SBX_STEP_EXEC_INIT, EBADF);
        return -1;
    }
    int errp[2], statp[2] = {-1, -1};
    if (sbx_high_pipe(errp) < 0) {
        fail_early(res, SBX_STEP_PIPE, errno);
        return -1;
    }
    if (reaper && sbx_high_pipe(statp) < 0) {
        fail_early(res, SBX_STEP_PIPE, errno);
        close(errp[0]);
        close(errp[1]);
        return -1;
    }
    struct sbx_input in = SBX_INPUT_NONE;
    in.blob = blob;
    in.argv = argv;
    in.envp = envp;
    for (int i = 0; i < 3; i++)
        in.stdio[i] = stdio[i];
    in.pass_fds = pass_fds;
    in.n_pass = n_pass;
    in.cgroup_fds = cgroup_fds;
    in.n_cgroup = n_cgroup > 0 && cgroup_fds ? n_cgroup : 0;
    in.init_fd = init_fd;
    in.err_fd = errp[1];
    in.status_fd = statp[1];
    in.listen_to = listen_to;
    if (join_ns) {
        in.join_userns_fd = join_ns[0];
        in.join_netns_fd = join_ns[1];
    }
    char fds[2][16];
    if (prepare_memory(&in, h, fds) < 0) {
        fail_early(res, SBX_STEP_PIPE, ENOMEM);
        close_pipes(errp, statp);
        return -1;
    }
    in.spawner_fd = sbx_open_spawner();
    struct sbx_ctx c;
    sbx_ctx_init(&c, &SBX_MODE_SPAWN, &in, res);
    pid_t pid = clone_child(&c, sbx_clone_flags(h->ns));
    int clone_err = errno;
    res->t_ns[SBX_T_RETURN] = now_ns();
    close(errp[1]);
    if (reaper)
        close(statp[1]);
    release_scratch(&in);
    struct sbx_report r = {SBX_STEP_CRASHED, -1, 0, SBX_D_NONE};
    if (pid < 0) {
        /* a joiner that failed has reported why; a failed clone has not */
        if (in.join_netns_fd < 0 || !sbx_read_report(errp[0], &r)) {
            r.step = SBX_STEP_CLONE;
            r.err = clone_err;
        }
        close(errp[0]);
        if (reaper)
            close(statp[0]);
        fail_early(res, r.step, r.err);
        return -1;
    }
    int reported = sbx_read_report(errp[0], &r);
    close(errp[0]);
    res->t_ns[SBX_T_DONE] = now_ns();
    if (!reported && c.reached_exec) {
        res->pid = pid;
        res->status_fd = statp[0];
        return 0;
    }
    sbx_reap_failed_setup(pid, &r, res);
    if (reaper)
        close(statp[0]);
    return -1;
}
