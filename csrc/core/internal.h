/* internal.h: what the C files of the core share. Not part of the cdef.
 *
 * The rule for everything that runs in the child between clone and execve
 * (most of what is declared here): the child shares the caller's memory and
 * runs while one of its threads is frozen mid-flight (sbx_clone_vm), so it
 * may only make system calls and touch its own stack and the prepared
 * context. As in CPython's _posixsubprocess after vfork:
 * - no malloc, no stdio, no locks: another thread may hold them, and the
 *   child would corrupt or deadlock the caller's heap; strings are built in
 *   caller-provided stack buffers (sbx_fmt_uint, sbx_stpcpy);
 * - no libc call that acts on every thread of the process: the set*id
 *   family (glibc signals each thread, SIGSETXID), and setrlimit on musl
 *   (which signals each thread too). Those signals go to the caller's
 *   threads, not to the child: they would change their own ids or limits,
 *   and the thread frozen in clone (every signal blocked) never answers, so
 *   the child would wait forever. Use the raw system call instead
 *   (sbx_set_rlimit: prlimit64 on pid 0);
 * - no fork(), system() or popen(): they run the caller's atfork handlers,
 *   which take locks.
 * messages.c and the parent side of spawn.c, probe.c and outside.c run in
 * the caller and are not bound by this.
 */
#ifndef SANDBOX_INTERNAL_H
#define SANDBOX_INTERNAL_H

#define _GNU_SOURCE
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sandbox.h"
#include "fdpass.h"

/* The stack of a child cloned into our memory: the setup child's deepest
 * frames hold a path buffer (4 KiB) and a few names. */
#define SBX_CHILD_STACK (256 * 1024)

struct sbx_ctx;

/* What an executor hands its sandbox's first process: the plan (blob), the
 * command, its fds, where to report, and the memory the child may not
 * allocate. The child works on its own copy in the context: its steps move
 * fds (sbx_place_fds) and use up the null trees. Every fd is -1 in
 * SBX_INPUT_NONE, where an executor starts from; a new field gets its
 * default there. */
struct sbx_input {
    const char *blob;           /* the checked blob (wire.c) */
    char *const *argv;
    char *const *envp;
    int stdio[3];               /* the command's 0-2 (-1: inherited) */
    const int *pass_fds;
    int n_pass;
    const uint32_t *fd_targets; /* numbers the pass_fds must have (they arrive elsewhere), or NULL */
    const int *bind_fds;        /* sources of the SBX_F_FROM_FD binds, in op order */
    const int *cgroup_fds;      /* cgroup.procs files the first process writes itself into (sbx_spawn_cg) */
    int n_cgroup;
    int *null_trees;            /* detached clones of the host's /dev/null for a proc's masks, used from */
    int n_null_trees;           /* the end (a Template's root need not have one); 0: clone /dev/null */
    int init_fd;                /* O_PATH fd of sandbox-init (or of SBX_OPT_EXEC_FD's executable), or -1 */
    int err_fd;                 /* where failures (and, per mode, the start) are reported */
    int status_fd;              /* write end of the status pipe (reaper), or -1 */
    int listen_to;              /* where listening sockets for forwarded ports go, or -1 */
    int join_userns_fd, join_netns_fd; /* a leased netns (and its owner) to join before the clone, or -1 */
    int spawner_fd;             /* pidfd of the spawning thread (sbx_open_spawner), or -1 */
    int proc_dir;               /* the procfs root for the id maps (a Template's server's), -1: /proc */
    /* A Template's sandbox in a leased network namespace: every message on
     * the report socket carries an fd of it (SCM_RIGHTS), so the caller
     * knows which of the leases it sent is this sandbox's. -1: none. */
    int lease_fd;
    char *scrub;                /* memory the resident reaper clears once the command runs */
    size_t scrub_len;
    /* scratch, sized by the executor: per op, the cloned source trees; a
     * /bin/sh retry's argv (argc + 2); sandbox-init's argv (argc + 6) */
    int *src_fds;
    char **sh_argv;
    char **init_argv;
};

#define SBX_INPUT_NONE                                                                                        \
    {                                                                                                         \
        .stdio = {-1, -1, -1}, .init_fd = -1, .err_fd = -1, .status_fd = -1, .listen_to = -1,                 \
        .join_userns_fd = -1, .join_netns_fd = -1, .spawner_fd = -1, .proc_dir = -1, .lease_fd = -1,          \
    }

/* What differs between the executors, as data: one static table each
 * (SBX_MODE_SPAWN in spawn.c, SBX_MODE_FORK in forksandbox.c,
 * SBX_MODE_TEMPLATE and SBX_MODE_STANDBY in sandbox-template's files). Every
 * sandbox's first process runs one sequence of steps (child.c,
 * sbx_child_steps); each step that differs is a call through its mode.
 * take_request, stay_resident and on_running may be NULL: no such step. */
struct sbx_mode {
    const char *name;
    /* The first moments, before the id maps: signals, the parent-death
     * signal, the sync fds, the creator's own fds. */
    void (*start)(struct sbx_ctx *c);
    /* Its user namespace was made ahead (sbx_prepare_userns: mapped and
     * nested) and is joined once the world is built, instead of being
     * mapped before it and nested after it. */
    int userns_ahead;
    /* The command's identity (session, capabilities, no-new-privs,
     * Landlock) is taken before the request rather than after the fds. */
    int identity_before_request;
    /* Stay resident (stay_resident) once the world is built, before the
     * user namespace and the command's identity: a command child made ahead
     * takes them, then the request (sbx_command_identity, _request), and
     * pid 1 keeps what it needs to reset the sandbox for another request (a
     * recycled Template sandbox, csrc/template/template_recycle.c). */
    int resident_before_identity;
    /* A network namespace it joins (in.join_netns_fd) comes with its
     * loopback up and is not the sandbox's to change: a forked task's lease,
     * joined at the clone (forksandbox.c). */
    int netns_ready;
    /* Fill in the command's side of the context: nothing when it came with
     * the clone (NULL); a standby waits for a request (sbx_ctx_take_input). */
    void (*take_request)(struct sbx_ctx *c);
    /* The fd table the command gets. */
    void (*fd_table)(struct sbx_ctx *c);
    /* With a reaper: stay resident as the sandbox's pid 1 (resident.c; only
     * for a child with memory of its own) instead of exec'ing sandbox-init.
     * NULL: exec it. Does not return. */
    void (*stay_resident)(struct sbx_ctx *c);
    /* The resident reaper's command runs (NULL: nothing to do then). */
    void (*on_running)(struct sbx_ctx *c);
    /* Just before the exec: tell the caller the sandbox runs (0), or -1
     * with errno. Natively the report pipe's close at exec says so. */
    int (*report_started)(struct sbx_ctx *c);
    /* The last step: exec the command (sbx_exec_command, does not return),
     * or return into the caller's code (a forked sandbox). */
    void (*run)(struct sbx_ctx *c);
};

/* Everything the child needs, prepared by the parent before clone: only
 * sbx_ctx_init fills it in (a new state field gets its value there). */
struct sbx_ctx {
    const struct sbx_mode *mode;
    struct sbx_input in;
    const struct sbx_header *h; /* views of in.blob */
    const struct sbx_op *ops;
    struct sbx_result *res;
    /* state: opened or set during setup */
    int root_fd;      /* the new root while it is being built */
    int proc_fd;      /* the child's /proc/<pid> on the host procfs, for id maps */
    int host_tree_fd; /* SBX_OPT_HOST_TREE: the clone of the host tree kept for the command */
    int userns_fd;    /* a user namespace made ahead (sbx_prepare_userns), joined at the request */
    int keep_fd;      /* an fd the resident reaper keeps open until on_running (-1: none) */
    volatile int reached_exec; /* set just before the final exec: a child that
                                  dies before it has crashed, not exec'd */
    unsigned long inner_flags; /* namespaces the setup child creates after joining */
    volatile pid_t inner_pid;  /* the setup child, cloned by the joiner */
    sigset_t caller_mask;      /* the spawning thread's signal mask before clone */
    uint32_t cgroup_tag;       /* a Template's sandbox: its cgroup's name to the caller (tpl_enter_cgroups) */
    uint32_t cgroup_left;      /* ... and that of the cgroup it left for the request's own (0: none) */
    const unsigned char *skip_ops; /* ops sbx_apply_ops leaves out (NULL: none; a recycled
                                      sandbox's Tmpfs still as its reset made it) */
};

/* The context of a sandbox about to be cloned, in mode `mode`: every state
 * fd -1, the input copied, its blob's views set. */
void sbx_ctx_init(struct sbx_ctx *c, const struct sbx_mode *mode, const struct sbx_input *in,
                  struct sbx_result *res);
/* From here on the child follows `in` (a standby's request): the same
 * state, another plan and command. */
void sbx_ctx_take_input(struct sbx_ctx *c, const struct sbx_input *in);

extern const struct sbx_mode SBX_MODE_SPAWN, SBX_MODE_FORK;

/* util.c */
const char *sbx_str(const struct sbx_ctx *c, uint32_t off);
int64_t sbx_now_ns(void); /* CLOCK_MONOTONIC */
void sbx_stamp(struct sbx_ctx *c, int which);
void sbx_report_fd(int fd, int step, int op, int err, int detail);
/* Close every fd from `from` up but those in `keep` (n of them, sorted here
 * in place; -1: none), one close_range() per gap: syscalls only. */
void sbx_close_all_but(int *keep, int n, unsigned from);
int sbx_read_report(int fd, struct sbx_report *r);
void sbx_reap_failed_setup(pid_t pid, const struct sbx_report *r, struct sbx_result *res);
_Noreturn void sbx_fail(struct sbx_ctx *c, int step, int op, int err, int detail);
int sbx_open_spawner(void);
void sbx_die_with_spawner(struct sbx_ctx *c, int sig);
size_t sbx_strlen(const char *s);
char *sbx_stpcpy(char *dst, const char *src);
char *sbx_fmt_uint(char *dst, unsigned long value, unsigned base);
int sbx_write_all(int fd, const void *buf, size_t len);
int sbx_write_file(int dirfd, const char *path, const char *text);
int sbx_exec_search(const char *file, char *const argv[], char *const envp[], const char *path, char **sh_argv);

/* syscalls glibc 2.36 does not wrap */
int sbx_open_tree(int dfd, const char *path, unsigned flags);
int sbx_move_mount(int from_dfd, const char *from, int to_dfd, const char *to, unsigned flags);
int sbx_mount_setattr(int dfd, const char *path, unsigned flags, uint64_t set, uint64_t clr);
int sbx_fsopen(const char *fstype, unsigned flags);
int sbx_fsconfig(int fd, unsigned cmd, const char *key, const void *value, int aux);
int sbx_fsmount(int fd, unsigned flags, unsigned attrs);
int sbx_openat2(int dfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve);
int sbx_pivot_root(const char *new_root, const char *put_old);
int sbx_set_rlimit(int resource, uint64_t soft, uint64_t hard); /* prlimit64(0, ...): no libc broadcast */

/* Whether `path` exists (a final symlink counts, unfollowed), resolved from
 * dirfd with openat2's `resolve` flags: 0, or -errno. The isolation check
 * of probe paths, inside the sandbox (child.c) and from outside (outside.c). */
int sbx_path_exists(int dirfd, const char *path, uint64_t resolve);
int sbx_proc_open(const struct sbx_ctx *c, const char *rel, int flags);
int sbx_proc_chmod(const struct sbx_ctx *c, const char *rel, unsigned mode);

/* idmap.c */
void sbx_setup_userns(struct sbx_ctx *c);
void sbx_nested_userns(struct sbx_ctx *c);
void sbx_block_on(int fd); /* util.c: read one byte or EOF, then close */

/* sources.c */
/* Destinations and per-call sources resolve as if the root they are
 * resolved from were "/", never through /proc's magic links. */
#define SBX_RESOLVE_INSIDE (RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
#define SBX_SRC_DEFERRED (-2) /* in src_fds: cloned when its op runs */
/* The mount attributes an op's flags ask for, one for one. */
unsigned sbx_bind_attrs(uint32_t flags);
/* Clone op i's source tree with its flags set; -1 if it is optional and missing. */
int sbx_clone_source(struct sbx_ctx *c, uint32_t i);
void sbx_open_sources(struct sbx_ctx *c);
/* Clone the tree at `path`, resolved beneath `root` as if it were "/" (so
 * no symlink or ".." leads out), as a detached mount with the SBX_F_RDONLY
 * and SBX_F_NODEV attributes of `flags` and nosuid set: a Template's
 * per-call bind, cloned by its server from its copy of the host tree. An
 * fd, or -1 with errno. */
int sbx_clone_tree_at(int root, const char *path, uint32_t flags);

/* mounts.c */
int sbx_in_place(const struct sbx_ctx *c);
void sbx_make_newroot(struct sbx_ctx *c);
void sbx_apply_ops(struct sbx_ctx *c);
void sbx_pivot(struct sbx_ctx *c);

/* net.c */
void sbx_loopback_up(struct sbx_ctx *c);
void sbx_make_listeners(struct sbx_ctx *c);
/* A listening TCP socket on 127.0.0.1:port of the current network namespace
 * (close-on-exec, SO_REUSEADDR), or -1 with errno. Used inside the sandbox
 * (forwarded ports) and from outside (outside.c, for bwrap's sandboxes). */
int sbx_listen_loopback(uint16_t port);

/* limits.c */
void sbx_enter_cgroups(struct sbx_ctx *c);
void sbx_apply_rlimits(struct sbx_ctx *c);
void sbx_place_fds(struct sbx_ctx *c);
void sbx_setup_stdio_fds(struct sbx_ctx *c, const int *keep, int n);
void sbx_drop_caps(struct sbx_ctx *c);
void sbx_no_new_privs(struct sbx_ctx *c);
void sbx_install_seccomp(struct sbx_ctx *c);

/* landlock.c */
void sbx_apply_landlock(struct sbx_ctx *c);

/* spawn.c */
unsigned long sbx_clone_flags(uint32_t ns);
/* A close-on-exec pipe whose ends are >= 3 (clear of stdio's dup2s). */
int sbx_high_pipe(int fds[2]);

/* vmclone.c: run fn(arg) in a child that shares our memory, on a stack of
 * `stack` bytes, with every signal blocked; returns once it has exec'd or
 * exited (its pid), or -1 with errno. `flags` are added to
 * CLONE_VM|CLONE_VFORK|SIGCHLD (namespaces, CLONE_FILES, CLONE_PARENT). */
pid_t sbx_clone_vm(int (*fn)(void *), void *arg, unsigned long flags, size_t stack);

/* forksandbox.c: sbx_fork_sandbox_ns, whose CPython before- and
 * after-parent hooks (sbx_fork_python_hooks) are called around the clone
 * only with SBX_FORK_HOOKS: a caller forking several sandboxes in a row
 * calls them once around them all (sbx_python_before_fork, _after_parent);
 * the child always calls the after-child hook once it is set up. With
 * SBX_FORK_STAY, a lease (join_ns) is joined by the caller itself, which
 * stays in its owner (see forksandbox.c), instead of by a joiner. */
#define SBX_FORK_HOOKS 1u
#define SBX_FORK_STAY 2u
int sbx_fork_task(const void *blob, size_t len, const int stdio[3], const int *pass_fds, int n_pass,
                  const int *trees, int n_trees, const int *cgroup_fds, int n_cgroup, const int join_ns[2],
                  unsigned opts, struct sbx_result *res);
void sbx_python_before_fork(void);
void sbx_python_after_parent(void);

/* zygote_wire.c: a serving zygote's messages (csrc/core/zygote.c's loop). */
void sbx_close_fds(const int *fds, int n); /* those >= 0 */
void sbx_zmsg_init(struct sbx_zmsg *m, uint32_t kind, int64_t id, pid_t pid, int slot);
/* To the caller; a failure to send means it is gone, which EOF on the
 * control socket will say. */
void sbx_zreport(struct sbx_zygote *z, const struct sbx_zmsg *m, const int *fds, int n);
void sbx_zreport_failed(struct sbx_zygote *z, int64_t id, const struct sbx_result *res, int slot);
struct rusage;
/* EXITED; `ru` (NULL: none) goes in t_ns[SBX_Z_RU_*] */
void sbx_zreport_exited(struct sbx_zygote *z, int64_t id, pid_t pid, int status, int slot, const struct rusage *ru);
/* One message and its fds (at most `max`, close-on-exec): 1, 0 at EOF, -1
 * with errno. One of the wrong size, or whose fds did not all arrive, is
 * EPROTO (its fds closed). */
int sbx_zreceive(int sock, struct sbx_zmsg *m, int *fds, int max, int *n_fds);
/* In a spare, set up and waiting: its task's channels (result on
 * z->task_fd, stdout and stderr on 1 and 2); exits at EOF. */
void sbx_zspare_wait(struct sbx_zygote *z, int sock);
/* A task's sandbox leaving the loop: its channel, and its death notes there. */
void sbx_zygote_become_task(struct sbx_zygote *z, int channel);

/* resident.c (sandbox-template only): the stay_resident of a Template's modes */
_Noreturn void sbx_resident_reaper(struct sbx_ctx *c);
/* A resident pid 1's wait for its command `pid` (every signal blocked):
 * signals from outside forwarded to it, orphans reaped; its wait status. */
int sbx_serve_command(pid_t pid);

/* child.c */
/* The message that says a Template's sandbox is running (csrc/core/sandbox.h,
 * struct sbx_stamps_report): the stamps and the Landlock ABI, with a pidfd
 * of the calling process (the sandbox's pid 1) and, implicitly, its
 * credentials. 0, or -1 with errno. */
int sbx_send_started(struct sbx_ctx *c);
/* Every step from the clone to the exec (or, a forked sandbox, to the
 * return into the caller's code), in order, for every executor: the
 * differences are the mode's (c->mode). A failing step reports and exits. */
void sbx_child_steps(struct sbx_ctx *c);
/* The command child of a resident_before_identity mode's pid 1, made ahead
 * of its request: its user namespace and the command's identity (session,
 * capabilities, no-new-privs, Landlock, the filter where it allows what
 * follows), as a standby takes them before its request; then, once it has
 * taken the request, what the request decides (cwd, rlimits, fds; pid 1
 * checks the probe paths: it can see more than the command, never less). */
void sbx_command_identity(struct sbx_ctx *c);
void sbx_command_request(struct sbx_ctx *c);
/* The root in place as the blob says (a warm sandbox's): the ops on its copy. */
void sbx_setup_filesystem(struct sbx_ctx *c);
/* Steps of the native spawn's child, for modes that share them. */
void sbx_child_start(struct sbx_ctx *c); /* signals, parent death, sync fds */
void sbx_command_fds(struct sbx_ctx *c); /* sbx_place_fds, then stdio and the kept fds */
void sbx_exec_command(struct sbx_ctx *c); /* sandbox-init, the EXEC_FD executable, or the command */
int sbx_started_by_exec(struct sbx_ctx *c); /* report_started: nothing to send (0) */
/* Whether this sandbox's first process stays resident as its pid 1. */
int sbx_stays_resident(const struct sbx_ctx *c);
/* The user namespace a standby's command will live in, made ahead (by its
 * server: a helper of ours would take a pid in the sandbox's namespace), in
 * c->userns_fd: its owner and maps (nested as the plan says) are what the
 * sandbox's own unshare(CLONE_NEWUSER) would have made; joining it costs one
 * setns. 0, or -1 (a helper's failure is reported on c->in.err_fd). */
int sbx_prepare_userns(struct sbx_ctx *c);
int sbx_child_main(void *arg);
int sbx_joiner_main(void *arg);
void sbx_enter_cwd(struct sbx_ctx *c);
void sbx_check_probe_paths(struct sbx_ctx *c);

#endif
