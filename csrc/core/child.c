/* child.c: the sandbox's first process, from clone to execve.
 *
 * One step sequence (sbx_child_steps) for every executor of the core; what
 * differs is data, the executor's struct sbx_mode (internal.h): the native
 * spawn's child, which shares the caller's memory (CLONE_VM) while the
 * caller's thread waits (CLONE_VFORK); a Template's sandbox and standby,
 * cloned fork-style by the sandbox-template server (csrc/template/template.c,
 * standby.c) into a copy of its prepared root; a sandbox forked from a warm
 * process (forksandbox.c), which returns into its caller's code instead of
 * exec'ing. So every step is async-signal-safe and reads only the prepared
 * blob. A failing step writes a report (sbx_fail) and exits; the command is
 * never exec'd over a half-applied plan.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* The caller blocked every signal before clone; handlers it installed
 * (Python's, for one) must not run here, in its memory: they are always
 * reset. Ignored signals are the plan's decision (SBX_OPT_RESET_SIGNALS):
 * reset too, or left ignored as across fork and exec. */
static void reset_signals(int ignored_too)
{
    /* The kernel's struct sigaction, raw: musl's sigaction() takes a lock
     * for SIGABRT. All zero is SIG_DFL, no flags, an empty mask in every
     * layout; the handler comes first in every one but mips' and alpha's.
     * The libc's own signals (32-34) are reset too: the handler table is
     * this child's own (no CLONE_SIGHAND), and exec resets them anyway. */
    unsigned long dfl[8] = {0}, cur[8];
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        if (!ignored_too && syscall(SYS_rt_sigaction, sig, NULL, cur, (NSIG - 1) / 8) == 0 && cur[0] == (unsigned long)SIG_IGN)
            continue;
        syscall(SYS_rt_sigaction, sig, dfl, NULL, (NSIG - 1) / 8);
    }
}

/* The mask the command starts with: none blocked, or the spawning thread's
 * (as across fork and exec), as the plan says. */
static const sigset_t *command_mask(struct sbx_ctx *c, sigset_t *none)
{
    sigemptyset(none);
    return (c->h->opts & SBX_OPT_RESET_SIGNALS) ? none : &c->caller_mask;
}

void sbx_enter_cwd(struct sbx_ctx *c)
{
    const uint32_t *cands = (const void *)(c->in.blob + c->h->cwd_off);
    int err = ENOENT;
    for (uint32_t i = 0; i < c->h->n_cwd; i++) {
        if (chdir(sbx_str(c, cands[i])) == 0)
            return;
        err = errno;
        if (c->h->opts & SBX_OPT_CWD_STRICT)
            break;
    }
    sbx_fail(c, SBX_STEP_CWD, 0, err, SBX_D_NONE);
}

/* The isolation check: every probe path (a secret that must not be visible)
 * is proven absent, as the command would look for it (from its root and
 * cwd, following every link but the last), before it runs. Any answer but
 * "no such file" fails the start. The setup child may still hold more
 * capabilities than the command will: that can only find more, never less. */
void sbx_check_probe_paths(struct sbx_ctx *c)
{
    const uint32_t *paths = (const void *)(c->in.blob + c->h->probe_off);
    for (uint32_t i = 0; i < c->h->n_probe; i++) {
        int rc = sbx_path_exists(AT_FDCWD, sbx_str(c, paths[i]), 0);
        if (rc == 0)
            sbx_fail(c, SBX_STEP_ISOLATION, (int)i, EEXIST, SBX_D_EXISTS);
        if (rc != -ENOENT && rc != -ENOTDIR)
            sbx_fail(c, SBX_STEP_ISOLATION, (int)i, -rc, SBX_D_NONE);
    }
}

/* Build the root: a new one, pivoted into; or, in place, the ops of a warm
 * sandbox (a Template's or a WorkerPool task's) on the copy of its
 * template's root it starts in: nothing to pivot, nothing to detach, and no
 * MS_SLAVE pass. That root was built after MS_SLAVE|MS_REC, so its mounts are
 * slaves or private, never shared; a copy of a mount namespace keeps each
 * mount's propagation, and a mount made beneath one that is not shared
 * propagates nowhere: nothing done here reaches the template. */
void sbx_setup_filesystem(struct sbx_ctx *c)
{
    if (!(c->h->ns & SBX_NS_MOUNT))
        return;
    int in_place = sbx_in_place(c);
    /* Slave, so nothing done here propagates back to the host. */
    if (!in_place && mount(NULL, "/", NULL, MS_SLAVE | MS_REC, NULL) < 0)
        sbx_fail(c, SBX_STEP_MOUNT_PRIVATE, -1, errno, SBX_D_NONE);
    /* A Template's server keeps the host's tree, as this namespace still
     * shows it, to clone per-call binds from (mounts.c, sbx_clone_tree_at). */
    if ((c->h->opts & SBX_OPT_HOST_TREE) &&
        (c->host_tree_fd = sbx_open_tree(AT_FDCWD, "/", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)) < 0)
        sbx_fail(c, SBX_STEP_NEWROOT, -1, errno, SBX_D_SOURCE);
    mode_t saved = umask(0);
    sbx_open_sources(c);
    sbx_make_newroot(c);
    sbx_apply_ops(c);
    sbx_stamp(c, SBX_T_MOUNTS);
    if (in_place) {
        close(c->root_fd);
        c->root_fd = -1;
    } else {
        sbx_pivot(c);
    }
    umask(saved);
    sbx_stamp(c, SBX_T_PIVOT);
}

int sbx_send_started(struct sbx_ctx *c)
{
    struct sbx_stamps_report r = {SBX_STEP_NONE, c->res->landlock_abi, (int32_t)c->cgroup_tag,
                                  (int32_t)c->cgroup_left, {0}};
    for (int k = 0; k < SBX_N_STAMPS; k++)
        r.t_ns[k] = c->res->t_ns[k];
    /* pid 1 of its own pid namespace: getpid() names it there */
    int fds[2] = {(int)syscall(SYS_pidfd_open, getpid(), 0), c->in.lease_fd};
    if (fds[0] < 0)
        return -1;
    int rc = sbx_send_fds(c->in.err_fd, &r, sizeof r, fds, 2);
    int err = errno;
    close(fds[0]);
    errno = err;
    return rc;
}

int sbx_started_by_exec(struct sbx_ctx *c)
{
    (void)c;
    return 0;
}

static void optional_step(void (*step)(struct sbx_ctx *c), struct sbx_ctx *c)
{
    if (step)
        step(c);
}

/* Just before the exec. A Template's sandbox (memory of its own, not the
 * caller's) tells its caller it is running, with its stage times. */
static void mark_ready(struct sbx_ctx *c)
{
    sbx_stamp(c, SBX_T_READY);
    c->reached_exec = 1;
    if (c->mode->report_started(c) < 0)
        sbx_fail(c, SBX_STEP_EXEC, -1, errno, SBX_D_NONE);
}

/* Exec the pid-1 reaper from its fd (it need not be visible inside); it
 * forks the command and reports its status. Our memory is the caller's, so
 * we cannot stay resident as pid 1 ourselves. Its argv was built by the
 * parent (a large argv would not fit on this stack); its "--" separator
 * carries the command's signal mask if that is not empty. */
static _Noreturn void exec_reaper(struct sbx_ctx *c)
{
    sigset_t none;
    const sigset_t *mask = command_mask(c, &none);
    unsigned long bits = 0;
    for (int sig = 1; sig <= 64; sig++)
        if (sigismember(mask, sig) == 1)
            bits |= 1UL << (sig - 1);
    char sep[3 + 16] = "--";
    if (bits)
        sbx_fmt_uint(sep + 2, bits, 16);
    c->in.init_argv[4 + 2 * c->h->n_lock] = sep; /* after each "--lock-file PATH" (spawn.c) */
    mark_ready(c);
    syscall(SYS_execveat, c->in.init_fd, "", c->in.init_argv, c->in.envp, AT_EMPTY_PATH);
    sbx_fail(c, SBX_STEP_EXEC_INIT, -1, errno, SBX_D_NONE);
}

/* The command is itself an executable given as an fd (SBX_OPT_EXEC_FD: a
 * Template's server, which lives in the root it prepared but is not part
 * of it). */
static _Noreturn void exec_from_fd(struct sbx_ctx *c)
{
    char *argv[8], number[16];
    size_t n = 0;
    for (; c->in.argv[n] && n < 6; n++)
        argv[n] = c->in.argv[n];
    if (c->in.argv[n])
        sbx_fail(c, SBX_STEP_CONFIG, -1, E2BIG, SBX_D_NONE);
    if (c->h->opts & SBX_OPT_HOST_TREE) {
        if (fcntl(c->host_tree_fd, F_SETFD, 0) < 0)
            sbx_fail(c, SBX_STEP_FDS, c->host_tree_fd, errno, SBX_D_NONE);
        sbx_fmt_uint(number, (unsigned)c->host_tree_fd, 10);
        argv[n++] = number;
    }
    argv[n] = NULL;
    mark_ready(c);
    syscall(SYS_execveat, c->in.init_fd, "", argv, c->in.envp, AT_EMPTY_PATH);
    sbx_fail(c, SBX_STEP_EXEC, -1, errno, SBX_D_NONE);
}

/* Join a leased network namespace (entering first the user namespace that
 * owns it, so that joining is permitted), then clone the setup child into
 * new namespaces from there. Its user namespace is then a child of the
 * owner's, so it holds no capability over the leased netns and cannot
 * reconfigure it. CLONE_PARENT makes it our caller's child, as if the caller
 * had cloned it; CLONE_VFORK keeps us until it has exec'd (or failed). */
int sbx_joiner_main(void *arg)
{
    struct sbx_ctx *c = arg;
    if (c->in.join_userns_fd >= 0 && setns(c->in.join_userns_fd, CLONE_NEWUSER) < 0)
        sbx_fail(c, SBX_STEP_JOIN_NETNS, -1, errno, SBX_D_NONE);
    if (setns(c->in.join_netns_fd, CLONE_NEWNET) < 0)
        sbx_fail(c, SBX_STEP_JOIN_NETNS, -1, errno, SBX_D_NONE);
    pid_t pid = sbx_clone_vm(sbx_child_main, c, CLONE_PARENT | c->inner_flags, SBX_CHILD_STACK);
    if (pid < 0)
        sbx_fail(c, SBX_STEP_CLONE, -1, errno, SBX_D_NONE);
    c->inner_pid = pid;
    _exit(0);
}

/* Our pid as the caller numbers it (its /proc, ours still), on `fd`, then
 * close it: the caller knows the sandbox exists before it is set up. */
static void report_started(struct sbx_ctx *c, int fd)
{
    char line[32];
    ssize_t n = readlink("/proc/self", line, sizeof line - 1);
    if (n <= 0)
        sbx_fail(c, SBX_STEP_STARTED, -1, n < 0 ? errno : EIO, SBX_D_NONE);
    line[n++] = '\n';
    if (sbx_write_all(fd, line, (size_t)n) < 0 && errno != EPIPE)
        sbx_fail(c, SBX_STEP_STARTED, -1, errno, SBX_D_NONE);
    close(fd);
}

/* The first moments of a spawned sandbox's first process (SBX_MODE_SPAWN's
 * start; the other modes have their own): signals as the caller left them
 * must not reach handlers, the parent-death signal, and (SBX_OPT_SYNC) the
 * caller told we exist, its status fds closed here. */
void sbx_child_start(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    sbx_stamp(c, SBX_T_CHILD);
    sbx_enter_cgroups(c); /* before anything else: every process it makes is born inside */
    reset_signals((h->opts & SBX_OPT_RESET_SIGNALS) != 0);
    /* The signal comes when the spawning *thread* exits. During setup every
     * signal is blocked (and the thread waits for us): only SIGKILL can end
     * a setup stuck in a blocking call when the caller dies. */
    if (h->opts & SBX_OPT_DIE_WITH_PARENT)
        sbx_die_with_spawner(c, SIGKILL);
    if ((h->opts & SBX_OPT_SYNC) && h->started_fd >= 0)
        report_started(c, h->started_fd);
    if ((h->opts & SBX_OPT_SYNC) && h->info_fd >= 0)
        close(h->info_fd);
    if ((h->opts & SBX_OPT_SYNC) && h->json_status_fd >= 0)
        close(h->json_status_fd);
}

/* The root, the network and the hostname: what a standby sandbox of a
 * Template prepares before any request, and the others after their id maps. */
static void setup_world(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    sbx_setup_filesystem(c);
    if ((h->ns & SBX_NS_NET) && !(c->mode->netns_ready && c->in.join_netns_fd >= 0))
        sbx_loopback_up(c);
    if (h->n_listen)
        sbx_make_listeners(c);
    if (h->hostname && sethostname(sbx_str(c, h->hostname), sbx_strlen(sbx_str(c, h->hostname))) < 0)
        sbx_fail(c, SBX_STEP_HOSTNAME, -1, errno, SBX_D_NONE);
}

/* The command's identity: a session of its own, no capability, no new
 * privileges, Landlock. `handed`: sandbox-init comes next and gets a
 * catchable parent-death signal (pending across its exec); it checks
 * whether the caller process is really gone. Set before seccomp; what is
 * left until exec (no-new-privs, Landlock, seccomp) cannot block. */
static void take_identity(struct sbx_ctx *c, int handed)
{
    const struct sbx_header *h = c->h;
    if ((h->opts & SBX_OPT_NEW_SESSION) && setsid() < 0)
        sbx_fail(c, SBX_STEP_SESSION, -1, errno, SBX_D_NONE);
    sbx_drop_caps(c);
    if (handed && (h->opts & SBX_OPT_DIE_WITH_PARENT) && prctl(PR_SET_PDEATHSIG, SBX_PDEATH_SIGNAL, 0, 0, 0) < 0)
        sbx_fail(c, SBX_STEP_PDEATHSIG, -1, errno, SBX_D_NONE);
    sbx_no_new_privs(c);
    sbx_apply_landlock(c);
    /* A resident pid 1 whose filter allows what it does from here on takes
     * it now (seccomp.resident), and its command inherits it. */
    if (sbx_stays_resident(c) && (h->opts & SBX_OPT_SECCOMP_EARLY))
        sbx_install_seccomp(c);
}

int sbx_stays_resident(const struct sbx_ctx *c)
{
    return c->mode->stay_resident && (c->h->opts & SBX_OPT_REAPER);
}

/* sandbox-init is handed the report and status pipes; a resident reaper
 * keeps its report socket, close-on-exec, away from the command */
static int handed(const struct sbx_ctx *c)
{
    return (c->h->opts & SBX_OPT_REAPER) && !sbx_stays_resident(c);
}

void sbx_command_fds(struct sbx_ctx *c)
{
    sbx_place_fds(c);
    if (handed(c)) {
        const int keep[] = {c->in.err_fd, c->in.status_fd};
        sbx_setup_stdio_fds(c, keep, 2);
    } else {
        sbx_setup_stdio_fds(c, NULL, 0);
    }
}

void sbx_exec_command(struct sbx_ctx *c)
{
    if (c->h->opts & SBX_OPT_REAPER)
        exec_reaper(c);
    if (c->h->opts & SBX_OPT_EXEC_FD)
        exec_from_fd(c);
    sigset_t none;
    sigprocmask(SIG_SETMASK, command_mask(c, &none), NULL);
    mark_ready(c);
    sbx_exec_search(c->in.argv[0], c->in.argv, c->in.envp, sbx_str(c, c->h->path), c->in.sh_argv);
    sbx_fail(c, SBX_STEP_EXEC, -1, errno, SBX_D_NONE);
}

/* The id maps of a new user namespace (none: one made ahead). */
static void map_ids(struct sbx_ctx *c)
{
    if (c->mode->userns_ahead)
        return;
    sbx_setup_userns(c);
    sbx_stamp(c, SBX_T_IDMAP);
}

static void join_prepared_userns(struct sbx_ctx *c)
{
    if (c->userns_fd < 0)
        return;
    if (setns(c->userns_fd, CLONE_NEWUSER) < 0)
        sbx_fail(c, SBX_STEP_CLONE, -1, errno, SBX_D_NONE);
    close(c->userns_fd);
    c->userns_fd = -1;
}

/* With the caller's sync fds, at bwrap's points: join --userns2's
 * namespace before the nested one (one made ahead is nested already), wait
 * on --block-fd once everything that needs privilege is done (the cwd and
 * what follows are the command's). The id maps are written by now. */
static void last_privileged_steps(struct sbx_ctx *c)
{
    const struct sbx_header *h = c->h;
    int sync = (h->opts & SBX_OPT_SYNC) != 0;
    if (sync && h->userns2_fd >= 0 && setns(h->userns2_fd, CLONE_NEWUSER) < 0)
        sbx_fail(c, SBX_STEP_USERNS2, -1, errno, SBX_D_NONE);
    if (!c->mode->userns_ahead)
        sbx_nested_userns(c);
    if (c->proc_fd >= 0) {
        close(c->proc_fd);
        c->proc_fd = -1;
    }
    if (sync)
        sbx_block_on(h->block_fd);
}

/* The table of contents: every step, in order, for every executor (the
 * mode's calls are what differs; nsjail's containProc has this shape).
 * A standby of a Template (csrc/template/standby.c) is cloned ahead of any request
 * into every namespace but its user namespace: it builds its world while it
 * still holds its server's capabilities over them, then joins its user
 * namespace, a child of the server's made ahead (sbx_prepare_userns), takes
 * the command's identity (identity_before_request) and only then waits for
 * a request (take_request), which fills in the command's side of `c`.
 * Either way the command holds no capability over any namespace it lives in. */
void sbx_child_steps(struct sbx_ctx *c)
{
    const struct sbx_mode *m = c->mode;
    m->start(c);
    map_ids(c);
    setup_world(c);
    if (m->resident_before_identity) {
        optional_step(m->take_request, c);
        m->stay_resident(c); /* its command children take the requests (sbx_command_identity) */
    }
    join_prepared_userns(c);
    if (m->identity_before_request)
        take_identity(c, 0);
    optional_step(m->take_request, c);
    last_privileged_steps(c);
    sbx_enter_cwd(c);
    sbx_check_probe_paths(c);
    sbx_apply_rlimits(c);
    m->fd_table(c);
    if (!m->identity_before_request)
        take_identity(c, handed(c));
    if (sbx_stays_resident(c))
        m->stay_resident(c);
    sbx_install_seccomp(c);
    m->run(c);
}

void sbx_command_identity(struct sbx_ctx *c)
{
    join_prepared_userns(c);
    take_identity(c, 0);
}

void sbx_command_request(struct sbx_ctx *c)
{
    last_privileged_steps(c);
    sbx_enter_cwd(c);
    sbx_apply_rlimits(c);
    c->mode->fd_table(c);
}

/* In a child that shares our memory and fds, cloned into a new user
 * namespace: map the ids (nesting as the plan says), and leave an fd of the
 * user namespace the command will live in. */
static int userns_helper(void *arg)
{
    struct sbx_ctx *c = arg;
    sbx_setup_userns(c);
    sbx_nested_userns(c);
    c->userns_fd = sbx_proc_open(c, "thread-self/ns/user", O_RDONLY);
    if (c->userns_fd < 0)
        sbx_fail(c, SBX_STEP_UID_MAP, -1, errno, SBX_D_NONE);
    _exit(0);
}

int sbx_prepare_userns(struct sbx_ctx *c)
{
    if (!(c->h->ns & SBX_NS_USER))
        return 0;
    pid_t pid = sbx_clone_vm(userns_helper, c, CLONE_FILES | CLONE_NEWUSER, SBX_CHILD_STACK);
    if (pid < 0)
        return -1;
    int status, err = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (c->proc_fd >= 0) {
        close(c->proc_fd); /* the helper's /proc/<pid> */
        c->proc_fd = -1;
    }
    if (c->userns_fd < 0)
        err = EIO; /* the helper reported why on err_fd */
    errno = err;
    return err ? -1 : 0;
}

int sbx_child_main(void *arg)
{
    sbx_child_steps(arg);
    _exit(125); /* not reached: the spawn mode execs or fails */
}
