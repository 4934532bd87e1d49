/* template_recycle.c: a recycled standby (sandbox.Template(spec, recycle=True)).
 *
 * A standby (csrc/template/standby.c) builds its world before any request; a
 * recycled one then serves request after request in the same pid, mount,
 * user-owned and network namespaces, instead of exiting after one. For that
 * its pid 1 never takes the command's identity: it stays in the server's
 * user namespace with the server's capabilities over the sandbox's
 * namespaces, non-dumpable. Its command children are made ahead of each
 * request by its maker where the commands' identity is the same for all
 * (csrc/template/template_maker.c: it takes that identity once); else each is pid
 * 1's own clone (sharing its memory until exec, CLONE_VM, while pid 1
 * waits on a socket pair), which takes what belongs to the command as a
 * standby does, before the request (sbx_command_identity: a session keyring
 * of its own, the command's user namespace, made ahead, a child of the
 * server's; session, no capability, no new privileges, Landlock, the filter
 * where it allows what follows), then the request itself and what it
 * decides (cwd, rlimits, fds; pid 1 checks the probe paths for it), and
 * execs. The command
 * therefore holds no capability over pid 1 or any of its namespaces, cannot
 * ptrace it (non-dumpable, another user namespace's), nor signal it (the
 * kernel drops a pid namespace's init's default-handled signals sent from
 * inside), and gets none of its fds.
 *
 * When the command ends, pid 1 kills and reaps whatever is left (a process
 * left beside a maker ends pid 1 too, once the status is out), writes the
 * status, and resets what a task could have changed before it takes the
 * next request:
 * - every mount the sandbox made (each Tmpfs, /dev/shm, devpts, an mqueue,
 *   a writable File's private copy, and whatever lies beneath them) is
 *   detached and made again, from the reset blob the caller stored, but an
 *   empty Tmpfs or a devpts the command left as it was (template_kept.c);
 *   only mounts on the
 *   template's read-only root are detached by path, so no path a task
 *   planted is followed; its proc (nothing of it is the command's to write)
 *   only with a new network namespace, once that is entered (/proc/sys/net
 *   shows the reader's: covers made on the last one's entries would not
 *   apply to the next);
 * - a fresh IPC namespace, then the mqueue, unless the namespace holds no
 *   SysV object and its POSIX queues' root is unchanged (template_kept.c);
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
 * - its own cwd and umask were never the command's (CLONE_VM without
 *   CLONE_FS: the command's chdir and umask are its own); what a command
 *   could change of it from outside and the next would inherit (rlimits,
 *   scheduling, OOM score...) is compared with what it was before any
 *   request (template_inherited.c), and signals left pending are dropped.
 * Any failure ends pid 1, and the server makes a fresh standby instead.
 * What it shares with its predecessor: the pid namespace (pid numbers keep
 * counting), the mount namespace's read-only template root, what the reset
 * kept because it was left as it was, the maker (its session keyring, which
 * no command can reach), and whatever the Spec lets a task write outside
 * the sandbox (a writable Bind of a host directory).
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
        char b;
        int got, n_fds;
        ssize_t n = sbx_recv_fds(sock, &b, 1, &got, 1, &n_fds, NULL);
        if (n <= 0)
            return fd;
        if (n_fds && fd < 0)
            fd = got;
        else if (n_fds)
            close(got);
        else if (b == 'p' && fd < 0) {
            check_probes(c);
            if (write(sock, &b, 1) != 1)
                return -1;
        }
    }
}

/* Whether every mount of the reset blob is kept as it is (those detach_fresh
 * leaves alone lie on the template's read-only root, or in a mount made
 * again: none is then kept). */
static int all_kept(const struct sbx_ctx *c, const unsigned char *skip)
{
    for (uint32_t k = 0; k < c->h->n_ops; k++) {
        uint32_t kind = c->ops[k].kind;
        if (!skip[k] && kind != SBX_OP_DIR && kind != SBX_OP_SYMLINK && kind != SBX_OP_REMOUNT_RO &&
            kind != SBX_OP_CHMOD)
            return 0;
    }
    return 1;
}

/* Detach every fresh mount of the reset blob that lies on the template's
 * read-only root (those beneath go with it), last first. */
static int detach_fresh(const struct sbx_ctx *c, const unsigned char *skip)
{
    for (uint32_t k = c->h->n_ops; k-- > 0;) {
        uint32_t kind = c->ops[k].kind;
        if (kind == SBX_OP_DIR || kind == SBX_OP_SYMLINK || kind == SBX_OP_REMOUNT_RO || kind == SBX_OP_CHMOD ||
            tpl_beneath_another(c, k) || skip[k])
            continue;
        if (umount2(sbx_str(c, c->ops[k].dest), MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL)
            return -1;
    }
    return 0;
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

/* Everything of the last request gone, make the sandbox as its standby
 * was: 0, or -1 (pid 1 then ends, and the server replaces it); *renewed:
 * whether it entered a new IPC or network namespace. */
static int reset(struct sbx_ctx *c, int made, int *renewed)
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
    int keep_net = (h->ns & SBX_NS_NET) && s->reset_kept_blob && tpl_net_empty(c, made ? TPL_MAKER_SOCKETS : 0);
    /* An IPC namespace left without an object is kept, and its mqueue mount
     * with it (unless it shares its place with another mount, made again). */
    int keep_ipc = (h->ns & SBX_NS_IPC) && tpl_ipc_empty();
    *renewed = ((h->ns & SBX_NS_NET) && !keep_net) || ((h->ns & SBX_NS_IPC) && !keep_ipc);
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
    tpl_choose_kept(c, skip);
    for (uint32_t k = 0; keep_ipc && k < c->h->n_ops; k++)
        skip[k] |= c->ops[k].kind == SBX_OP_MQUEUE && !tpl_shares_place(c, k);
    if (!*renewed && all_kept(c, skip))
        goto mounts_done; /* nothing to detach or make again */
    if (detach_fresh(c, skip) < 0)
        return -1;
    if ((h->ns & SBX_NS_IPC) && !keep_ipc) {
        if (unshare(CLONE_NEWIPC) < 0)
            return -1;
        tpl_ipc_renewed();
    }
    if ((h->ns & SBX_NS_NET) && !keep_net) {
        if (unshare(CLONE_NEWNET) < 0)
            return -1;
        tpl_net_renewed();
    }
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
    tpl_record_kept(c, skip);
    close_all(c->in.null_trees, c->in.n_null_trees); /* those its proc did not use */
    if ((h->ns & SBX_NS_NET) && !keep_net)
        sbx_loopback_up(c);
mounts_done:
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

/* The command has ended: whatever is left of it goes (a process left
 * beside a maker ends pid 1 too, once the status is out), then its status. */
static void finish(int report, int status, int made)
{
    int other, left = made ? !tpl_maker_alone() : waitpid(-1, &other, WNOHANG) >= 0 || errno != ECHILD;
    if (left) {
        kill(-1, SIGKILL);
        while (waitpid(-1, &other, 0) > 0 || errno == EINTR)
            ;
    }
    sbx_write_all(report, &status, sizeof status);
    if (made && left)
        _exit(125); /* its maker went with them: the server makes a fresh standby */
}

/* The next command, a clone of pid 1's own (sharing its memory until its
 * exec) that takes the command's identity, then a request: its report
 * socket once it has exec'd (the started report sent) and its pid in *pid;
 * pid 1 ends if it did not get that far. */
static int own_command(struct sbx_ctx *c, pid_t *pid)
{
    static char stack[SBX_CHILD_STACK] __attribute__((aligned(16)));
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
        _exit(125);
    struct sbx_ctx saved = *c; /* the command child's steps move fds in this memory */
    c->keep_fd = sp[1];        /* kept off the request's fd numbers (sbx_place_fds) */
    command.execing = 0;
    command.step = 0;
    *pid = clone(command_main, stack + sizeof stack, CLONE_VM | SIGCHLD, c);
    close(sp[1]);
    int report = *pid < 0 ? -1 : await_command(c, sp[0]);
    close(sp[0]);
    struct sbx_input got = c->in; /* the request, as the child took it */
    *c = saved;
    sbx_stamp(c, SBX_T_RETURN);
    if (report < 0 || !command.execing || command.step) {
        /* it failed (and reported, to the request's caller or, before
         * any request, to the server) or found the caller gone */
        int status = 0;
        if (*pid > 0)
            waitpid(*pid, &status, 0);
        if (report >= 0 && command.step) { /* its exec failed: reported here */
            c->in.err_fd = report;
            sbx_fail(c, command.step, -1, command.err, SBX_D_NONE);
        }
        _exit(*pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && report < 0 ? 0 : 125);
    }
    c->in.err_fd = report;
    if (sbx_send_started(c) < 0) {
        kill(*pid, SIGKILL);
        _exit(125);
    }
    c->in.err_fd = -1;
    if (got.scrub)
        memset(got.scrub, 0, got.scrub_len);
    free(got.sh_argv);
    free((void *)got.argv);
    free((void *)got.envp);
    return report;
}

/* The next command, made by the maker (template_maker.c): as own_command;
 * -1 when none ran (its child failed and reported, or its exec did), and
 * pid 1 ends when the caller has gone or the maker has. */
static int made_command(struct sbx_ctx *c, pid_t *pid)
{
    int report = tpl_maker_next(c, pid), status;
    if (report != -1)
        return report < 0 ? -1 : report;
    pid_t gone = waitpid(-1, &status, 0); /* the command child, which said nothing */
    if (!tpl_maker_alone())
        _exit(125);
    if (gone > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        _exit(0); /* the caller has gone: so have the standbys' requests */
    return -1;
}

/* One request after another (SBX_MODE_RECYCLE's stay_resident): a command
 * child made ahead (by the maker, or as pid 1's own clone) takes it and
 * execs, pid 1 serves and reaps it, then resets the sandbox. */
static _Noreturn void recycle_reaper(struct sbx_ctx *c)
{
    struct tpl_sandbox *t = TPL_SANDBOX(c);
    static struct tpl_inherited inherited; /* what its own command children inherit, before any request */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0 || tpl_inherited_take(c, &inherited) < 0)
        sbx_fail(c, SBX_STEP_EXEC_INIT, -1, errno, SBX_D_NONE);
    if (c->h->ns & SBX_NS_IPC)
        tpl_ipc_renewed(); /* what its first reset may keep */
    int made = tpl_maker_start(c) == 0;
    for (;;) {
        pid_t pid = -1;
        int report = made ? made_command(c, &pid) : own_command(c, &pid);
        int status = report >= 0 ? sbx_serve_command(pid) : 0;
        /* The next request waits for us (serving_fast); marked before the
         * status goes out, which lets the caller send the next: the other
         * standby taking it must not find us still running (NOTE_BUSY). */
        __atomic_store_n(&t->srv->standby_taken[t->slot], TAKEN_RESETTING, __ATOMIC_SEQ_CST);
        if (report >= 0) {
            finish(report, status, made);
            close(report);
        }
        /* A command may have changed what the next would inherit from us
         * (a maker checks its own: the commands are its children; a new one
         * would be ours), and a maker stays in the namespaces we leave. */
        int renewed = 0;
        if (reset(c, made, &renewed) < 0 || ((!made || renewed) && !tpl_inherited_same(&inherited)))
            _exit(125);
        if (made && renewed)
            tpl_maker_renew(c);
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
    .resident_before_identity = 1, /* no take_request: its command child takes each (command_main) */
    .fd_table = sbx_command_fds,
    .stay_resident = recycle_reaper,
    .report_started = sbx_send_started,
    .run = sbx_exec_command,
};
