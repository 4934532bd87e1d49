/* child.c: the sandbox's first process, from clone to execve.
 *
 * It shares the caller's memory (CLONE_VM) while the caller's thread waits
 * (CLONE_VFORK), so every step is async-signal-safe and reads only the
 * prepared blob. A failing step writes a report to the close-on-exec pipe
 * and exits; the command is never exec'd over a half-applied plan.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

/* The caller blocked every signal before clone; handlers it installed
 * (Python's, for one) must not run here, in its memory: they are always
 * reset. Ignored signals are the plan's decision (SBX_OPT_RESET_SIGNALS):
 * reset too, or left ignored as across fork and exec. */
static void reset_signals(int ignored_too)
{
    struct sigaction dfl, cur;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        if (!ignored_too && sigaction(sig, NULL, &cur) == 0 && cur.sa_handler == SIG_IGN)
            continue;
        sigaction(sig, &dfl, NULL); /* glibc-internal signals fail harmlessly */
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
    const uint32_t *cands = (const void *)(c->blob + c->h->cwd_off);
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
    const uint32_t *paths = (const void *)(c->blob + c->h->probe_off);
    for (uint32_t i = 0; i < c->h->n_probe; i++) {
        int rc = sbx_path_exists(AT_FDCWD, sbx_str(c, paths[i]), 0);
        if (rc == 0)
            sbx_fail(c, SBX_STEP_ISOLATION, (int)i, EEXIST, SBX_D_EXISTS);
        if (rc != -ENOENT && rc != -ENOTDIR)
            sbx_fail(c, SBX_STEP_ISOLATION, (int)i, -rc, SBX_D_NONE);
    }
}

static void setup_filesystem(struct sbx_ctx *c)
{
    if (!(c->h->ns & SBX_NS_MOUNT))
        return;
    /* Slave, so nothing done here propagates back to the host. */
    if (mount(NULL, "/", NULL, MS_SLAVE | MS_REC, NULL) < 0)
        sbx_fail(c, SBX_STEP_MOUNT_PRIVATE, -1, errno, SBX_D_NONE);
    mode_t saved = umask(0);
    sbx_open_sources(c);
    sbx_make_newroot(c);
    sbx_apply_ops(c);
    sbx_stamp(c, SBX_T_MOUNTS);
    sbx_pivot(c);
    umask(saved);
    sbx_stamp(c, SBX_T_PIVOT);
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
    c->init_argv[4] = sep;
    sbx_stamp(c, SBX_T_READY);
    c->reached_exec = 1;
    execveat(c->init_fd, "", c->init_argv, c->envp, AT_EMPTY_PATH);
    sbx_fail(c, SBX_STEP_EXEC_INIT, -1, errno, SBX_D_NONE);
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
    if (c->join_userns_fd >= 0 && setns(c->join_userns_fd, CLONE_NEWUSER) < 0)
        sbx_fail(c, SBX_STEP_JOIN_NETNS, -1, errno, SBX_D_NONE);
    if (setns(c->join_netns_fd, CLONE_NEWNET) < 0)
        sbx_fail(c, SBX_STEP_JOIN_NETNS, -1, errno, SBX_D_NONE);
    pid_t pid = sbx_clone_vm(sbx_child_main, c, CLONE_PARENT | c->inner_flags, SBX_CHILD_STACK);
    if (pid < 0)
        sbx_fail(c, SBX_STEP_CLONE, -1, errno, SBX_D_NONE);
    c->inner_pid = pid;
    _exit(0);
}

int sbx_child_main(void *arg)
{
    struct sbx_ctx *c = arg;
    const struct sbx_header *h = c->h;
    int reaper = (h->opts & SBX_OPT_REAPER) != 0;

    sbx_stamp(c, SBX_T_CHILD);
    reset_signals((h->opts & SBX_OPT_RESET_SIGNALS) != 0);
    /* The signal comes when the spawning *thread* exits. During setup every
     * signal is blocked (and the thread waits for us): only SIGKILL can end
     * a setup stuck in a blocking call when the caller dies. */
    int die_with_parent = (h->opts & SBX_OPT_DIE_WITH_PARENT) != 0;
    if (die_with_parent)
        sbx_die_with_spawner(c, SIGKILL);
    sbx_setup_userns(c);
    sbx_stamp(c, SBX_T_IDMAP);
    setup_filesystem(c);
    if (h->ns & SBX_NS_NET)
        sbx_loopback_up(c);
    if (c->h->n_listen)
        sbx_make_listeners(c);
    if (h->hostname && sethostname(sbx_str(c, h->hostname), sbx_strlen(sbx_str(c, h->hostname))) < 0)
        sbx_fail(c, SBX_STEP_HOSTNAME, -1, errno, SBX_D_NONE);
    sbx_nested_userns(c);
    sbx_enter_cwd(c);
    sbx_check_probe_paths(c);
    sbx_apply_rlimits(c);
    sbx_setup_stdio_fds(c, reaper ? c->err_fd : -1, reaper ? c->status_fd : -1);
    if ((h->opts & SBX_OPT_NEW_SESSION) && setsid() < 0)
        sbx_fail(c, SBX_STEP_SESSION, -1, errno, SBX_D_NONE);
    sbx_drop_caps(c);
    /* The reaper gets a catchable one (pending across its exec) and checks
     * whether the caller process is really gone. Set before seccomp; what is
     * left until exec (no-new-privs, Landlock, seccomp) cannot block. */
    if (die_with_parent && reaper && prctl(PR_SET_PDEATHSIG, SBX_PDEATH_SIGNAL, 0, 0, 0) < 0)
        sbx_fail(c, SBX_STEP_PDEATHSIG, -1, errno, SBX_D_NONE);
    sbx_no_new_privs(c);
    sbx_apply_landlock(c);
    sbx_install_seccomp(c);
    if (reaper)
        exec_reaper(c);

    sigset_t none;
    sigprocmask(SIG_SETMASK, command_mask(c, &none), NULL);
    sbx_stamp(c, SBX_T_READY);
    c->reached_exec = 1;
    sbx_exec_search(c->argv[0], c->argv, c->envp, sbx_str(c, h->path), c->sh_argv);
    sbx_fail(c, SBX_STEP_EXEC, -1, errno, SBX_D_NONE);
}
