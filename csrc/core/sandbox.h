/* sandbox.h: the one interface between Python (cffi) and the C core.
 *
 * build_ffi.py feeds the region between the CDEF markers to cffi as its cdef,
 * so nothing here is retyped in Python. Keep that region to what pycparser
 * understands: fixed-width types, plain structs, enums, prototypes and
 * integer #defines.
 *
 * Ownership and order: the caller serializes a Plan into one flat blob (a
 * struct sbx_header followed by arrays and NUL-terminated strings, all located
 * by byte offsets from the start of the blob), then calls sbx_spawn(). The blob,
 * argv, envp and the fd arrays are only read, and only until sbx_spawn()
 * returns. sbx_spawn() clones the child with CLONE_VM|CLONE_VFORK, so the
 * caller's thread is suspended until the child has exec'd (or failed); the
 * child runs only async-signal-safe code over the blob.
 */
#ifndef SANDBOX_H
#define SANDBOX_H

#include <stddef.h>
#include <stdint.h>

/* CDEF BEGIN */
#define SBX_ABI_VERSION 17
#define SBX_MAGIC 0x58425353
#define SBX_MAX_LOCK_FILES 64 /* sandbox-init keeps their fds in an array of its own */

/* namespaces (struct sbx_header.ns) */
#define SBX_NS_USER 1
#define SBX_NS_MOUNT 2
#define SBX_NS_PID 4
#define SBX_NS_NET 8
#define SBX_NS_IPC 16
#define SBX_NS_UTS 32
#define SBX_NS_CGROUP 64

/* options (struct sbx_header.opts) */
#define SBX_OPT_REAPER 1          /* a C pid 1 runs the command and reaps */
#define SBX_OPT_DIE_WITH_PARENT 2 /* PR_SET_PDEATHSIG(SIGKILL) */
#define SBX_OPT_NEW_SESSION 4     /* setsid(): no controlling tty */
#define SBX_OPT_MAP_ROOT_FIRST 8  /* map 0 (not the final ids) during setup */
#define SBX_OPT_CWD_STRICT 16     /* the first cwd candidate must work */
#define SBX_OPT_NESTED_USERNS 32  /* after setup, a nested userns with only the final ids */
#define SBX_OPT_DISABLE_USERNS 64 /* ... in which no further userns can be created */
#define SBX_OPT_LANDLOCK 128      /* restrict file access with Landlock */
#define SBX_OPT_LANDLOCK_BEST_EFFORT 256 /* ... but run without it where the kernel lacks it */
#define SBX_OPT_RESET_SIGNALS 512 /* the command starts with no signal ignored or blocked */
#define SBX_OPT_EXEC_FD 1024      /* exec argv itself from init_fd (a Template's server), not through sandbox-init */
#define SBX_OPT_HOST_TREE 2048    /* with EXEC_FD: keep a clone of the host's mount tree open across the exec,
                                     its fd number appended to argv (a Template's server clones per-call
                                     binds from it) */
#define SBX_OPT_CAPS_AS_CALLER 4096 /* keep_caps is the root caller's own set: change no cap set but the bounding */
#define SBX_OPT_SYNC 8192         /* the header's sync fds are set (sandbox.sync; else they are ignored) */
#define SBX_OPT_SECCOMP_EARLY 16384 /* a Template's pid 1 installs the filter on itself, before its request */
#define SBX_OPT_KEYS_REFUSED 32768 /* the filter refuses keyctl, add_key and request_key whatever their
                                      arguments: a recycled Template sandbox keeps its commands' user
                                      namespace (the user keyrings live there) */

/* Landlock rule flags (struct sbx_landlock.flags) */
#define SBX_LL_WRITE 1              /* full rights beneath the path (else read + execute) */

/* operation kinds and flags (plan.OpKind / plan.OpFlag) */
enum sbx_op_kind {
    SBX_OP_BIND = 1,
    SBX_OP_TMPFS = 2,
    SBX_OP_PROC = 3,
    SBX_OP_DEV = 4,
    SBX_OP_DIR = 5,
    SBX_OP_SYMLINK = 6,
    SBX_OP_FILE = 7,
    SBX_OP_REMOUNT_RO = 8,
    SBX_OP_CHMOD = 9,
    SBX_OP_DEVPTS = 10,  /* a private devpts instance (a Template's sandbox, on its shared /dev) */
    SBX_OP_MQUEUE = 11,  /* a fresh mqueue filesystem (the queues of the sandbox's IPC namespace) */
    SBX_OP_OVERLAY = 12  /* an overlayfs: data holds its lower host directories, top first, each
                            NUL-terminated; src a host directory whose upper/ and work/ it keeps (0:
                            a fresh tmpfs of `size` bytes); SBX_F_RDONLY: no upper at all */
};
#define SBX_F_RDONLY 1
#define SBX_F_NODEV 2
#define SBX_F_OPTIONAL 4
#define SBX_F_FRESH 8     /* PROC: a new procfs (pid namespace); FILE: a private copy bound on dest */
#define SBX_F_NOSUID 16
#define SBX_F_NO_DEVPTS 32 /* DEV: without devpts (a Template's own /dev: each sandbox mounts its own) */
#define SBX_F_FROM_FD 64  /* BIND: the source tree was cloned by the caller and comes as an fd */
#define SBX_F_FD_SOURCE 128 /* BIND: src is /proc/self/fd/N: bind the path fd N was opened at, if the same file */

/* setup steps, reported on failure (and used to name timing stamps) */
enum sbx_step {
    SBX_STEP_NONE = 0,
    SBX_STEP_CONFIG = 1,      /* the blob is malformed (caught before clone) */
    SBX_STEP_PIPE = 2,
    SBX_STEP_CLONE = 3,
    SBX_STEP_SIGNALS = 4,
    SBX_STEP_PDEATHSIG = 5,
    SBX_STEP_SETGROUPS = 6,
    SBX_STEP_UID_MAP = 7,
    SBX_STEP_GID_MAP = 8,
    SBX_STEP_MOUNT_PRIVATE = 9,
    SBX_STEP_SOURCE = 10,      /* opening a bind source; .op is the op index */
    SBX_STEP_NEWROOT = 11,
    SBX_STEP_OP = 12,          /* an operation; .op is its index, .detail says what */
    SBX_STEP_PIVOT = 13,
    SBX_STEP_LOOPBACK = 14,
    SBX_STEP_HOSTNAME = 15,
    SBX_STEP_NESTED_USERNS = 16,
    SBX_STEP_CWD = 17,
    SBX_STEP_RLIMIT = 18,
    SBX_STEP_STDIO = 19,
    SBX_STEP_FDS = 20,
    SBX_STEP_SESSION = 21,
    SBX_STEP_CAPS = 22,
    SBX_STEP_NO_NEW_PRIVS = 23,
    SBX_STEP_SECCOMP = 24,
    SBX_STEP_EXEC_INIT = 25,   /* exec of the pid-1 reaper */
    SBX_STEP_FORK = 26,        /* the reaper's fork of the command */
    SBX_STEP_EXEC = 27,        /* exec of the command itself */
    SBX_STEP_DISABLE_USERNS = 28,
    SBX_STEP_LANDLOCK = 29,
    SBX_STEP_CRASHED = 30,     /* the setup child died before exec (.err: its signal) */
    SBX_STEP_JOIN_NETNS = 31,  /* joining a leased network namespace */
    SBX_STEP_ISOLATION = 32,   /* a probe path is visible (.op: its index) */
    SBX_STEP_FORWARD = 33,     /* a forwarded port's listener (.op: its index) */
    SBX_STEP_STARTED = 34,     /* reporting the pid on the caller's started_fd */
    SBX_STEP_USERNS2 = 35,     /* joining the caller's userns2_fd */
    SBX_STEP_CGROUP = 36,      /* entering the sandbox's cgroup (.op: which of cgroup_fds) */
    SBX_STEP_LOCK_FILE = 37    /* pid 1's read lock on a lock file (.op: its index), before the command */
};

/* what an operation was doing when it failed (struct sbx_result.detail) */
enum sbx_detail {
    SBX_D_NONE = 0,
    SBX_D_SOURCE = 1,   /* find/clone the source tree */
    SBX_D_ATTR = 2,     /* set mount attributes */
    SBX_D_PARENTS = 3,  /* create missing parent directories */
    SBX_D_CREATE = 4,   /* create the mount point / dir / file / link */
    SBX_D_RESOLVE = 5,  /* open the destination inside the new root */
    SBX_D_MOUNT = 6,    /* attach the mount */
    SBX_D_WRITE = 7,    /* write file contents */
    SBX_D_CHMOD = 8,
    SBX_D_EXISTS = 9    /* destination exists with other contents */
};

/* timing stamps (CLOCK_MONOTONIC ns) in struct sbx_result.t_ns */
enum sbx_stamp {
    SBX_T_START = 0,     /* parent, before clone */
    SBX_T_CHILD = 1,     /* child running */
    SBX_T_IDMAP = 2,     /* uid/gid maps written */
    SBX_T_MOUNTS = 3,    /* all operations applied */
    SBX_T_PIVOT = 4,     /* pivoted into the new root */
    SBX_T_READY = 5,     /* just before exec */
    SBX_T_RETURN = 6,    /* parent resumed (child exec'd or died) */
    SBX_T_DONE = 7       /* parent saw the command exec'd (or fail) */
};
#define SBX_N_STAMPS 8

struct sbx_header {
    uint32_t magic;         /* SBX_MAGIC */
    uint32_t abi;           /* SBX_ABI_VERSION */
    uint32_t size;          /* total blob size in bytes */
    uint32_t ns;            /* SBX_NS_* */
    uint32_t opts;          /* SBX_OPT_* */
    uint32_t host_uid;
    uint32_t host_gid;
    uint32_t uid;           /* ids seen inside */
    uint32_t gid;
    uint32_t n_ops;
    uint32_t ops_off;       /* struct sbx_op[n_ops] */
    uint32_t n_cwd;
    uint32_t cwd_off;       /* uint32_t[n_cwd]: string offsets, tried in order */
    uint32_t n_rlimits;
    uint32_t rlimits_off;   /* struct sbx_rlimit[n_rlimits] */
    uint32_t hostname;      /* string offset, 0 = keep */
    uint32_t path;          /* string offset: PATH to find the command */
    uint32_t newroot;       /* string offset: host dir where the new root is built */
    uint32_t seccomp_off;   /* struct sock_filter[], 8-byte aligned; 0 = none */
    uint32_t seccomp_len;   /* in bytes, a multiple of 8 */
    uint32_t n_landlock;
    uint32_t landlock_off;  /* struct sbx_landlock[n_landlock] */
    uint32_t n_probe;
    uint32_t probe_off;     /* uint32_t[n_probe]: paths that must not exist inside */
    uint32_t n_listen;
    uint32_t listen_off;    /* uint32_t[n_listen]: ports to listen on at 127.0.0.1 inside */
    uint32_t n_lock;        /* at most SBX_MAX_LOCK_FILES; only with SBX_OPT_REAPER */
    uint32_t lock_off;      /* uint32_t[n_lock]: paths inside that pid 1 read-locks (bwrap's --lock-file) */
    /* With SBX_OPT_SYNC, fds of the caller (-1: none) where the setup reports
     * or waits, as bwrap's options (sandbox/sync.py): */
    int32_t started_fd;      /* the first process writes its pid (decimal, caller's pid namespace) at once */
    int32_t userns_block_fd; /* one byte or EOF is read before the id maps, which the caller writes */
    int32_t userns2_fd;      /* setns(CLONE_NEWUSER) into it after setup */
    int32_t block_fd;        /* one byte or EOF is read just before the last steps and the exec */
    int32_t info_fd;         /* the caller's status fds (bwrap's --info-fd, --json-status-fd): */
    int32_t json_status_fd;  /* closed right after started_fd, so only the caller holds them */
    uint64_t keep_caps;     /* capabilities kept (bit = capability number) */
};

struct sbx_landlock {
    uint32_t path;          /* string offset: a path inside the sandbox */
    uint32_t flags;         /* SBX_LL_* */
};

struct sbx_op {
    uint32_t kind;          /* enum sbx_op_kind */
    uint32_t flags;         /* SBX_F_* */
    uint32_t mode;          /* mode of what is created (DEV: its tmpfs) */
    uint32_t parent_mode;   /* mode of missing parents */
    uint64_t size;          /* tmpfs size in bytes, 0 = default */
    uint32_t src;           /* string offset: host path (BIND, OVERLAY's kept upper) or link target */
    uint32_t dest;          /* string offset: absolute path inside */
    uint32_t data;          /* byte offset of FILE contents */
    uint32_t data_len;
    uint32_t shm_mode;      /* DEV: mode of its shm directory */
    uint32_t pad;
};

struct sbx_rlimit {
    uint32_t resource;
    uint32_t pad;
    uint64_t value;         /* soft = hard = value */
};

struct sbx_result {
    int32_t pid;            /* the sandbox's first process (host pid), or -1 */
    int32_t status_fd;      /* read end: the reaper writes the command's wait status */
    int32_t step;           /* enum sbx_step of a failure, 0 if none */
    int32_t op;             /* failing op index, or -1 */
    int32_t err;            /* errno of the failure */
    int32_t detail;         /* enum sbx_detail */
    int32_t wait_status;    /* after a failure: how the child ended */
    int32_t landlock_abi;   /* the Landlock ABI applied, 0 if none */
    uint64_t t_ns[8];       /* enum sbx_stamp */
};

/* Validate `blob` (bounds, offsets, NUL-terminated strings). 0 or -EINVAL. */
int sbx_check_blob(const void *blob, size_t len);

/* Start a sandbox. stdio[i] is the fd to become fd i (-1: inherit fd i).
 * pass_fds (sorted ascending) stay open at the same numbers; every other fd
 * is closed at exec. init_fd is an O_PATH fd of the sandbox-init executable
 * (needed when SBX_OPT_REAPER is set). join_ns = {userns fd, netns fd}: a
 * leased network namespace to run in instead of a new one (-1: none; the
 * userns fd is the one owning that netns, -1 when the caller may join it
 * directly). listen_to: a Unix socket to which the child sends, with
 * SCM_RIGHTS and in order, one listening socket per port of the plan's
 * listen list, bound inside the sandbox's network namespace (-1: none).
 * Returns 0 with res->pid set once the command has been exec'd;
 * -1 after a failure, with res->step/op/err/detail set and no process left
 * behind. */
int sbx_spawn(const void *blob, size_t len, char *const argv[], char *const envp[],
              const int stdio[3], const int *pass_fds, int n_pass, int init_fd,
              const int join_ns[2], int listen_to, struct sbx_result *res);

/* sbx_spawn() into cgroups of the sandbox's own (sandbox/cgroups.py):
 * cgroup_fds[0..n_cgroup) are the cgroup.procs files of those cgroups,
 * opened by the caller (O_WRONLY|O_CLOEXEC; the kernel checks the
 * permission against the opener's credentials, so the child may write them
 * from inside its new user namespace). The sandbox's first process writes
 * "0" (itself) to each as its first step, before anything it runs could be
 * untrusted; everything it later starts is born inside. A failure is
 * SBX_STEP_CGROUP with .op the index in cgroup_fds. The fds stay the
 * caller's. */
int sbx_spawn_cg(const void *blob, size_t len, char *const argv[], char *const envp[],
                 const int stdio[3], const int *pass_fds, int n_pass, int init_fd,
                 const int join_ns[2], int listen_to, const int *cgroup_fds, int n_cgroup,
                 struct sbx_result *res);

/* Fork a sandbox from the calling process, as fork() does: the child gets a
 * copy of the caller's memory (no CLONE_VM), so the caller must be
 * single-threaded, and it gets the caller's copy of a template's mount tree
 * (the caller sits in a prepared root: WorkerPool's zygote). The child enters
 * the plan's new namespaces (with a pid namespace it is their pid 1), applies
 * the plan's operations to its copy of the tree in place (the blob's newroot
 * is "/"), and sets up as sbx_spawn's child does: id maps, lo, cwd, rlimits,
 * session, capabilities, NO_NEW_PRIVS, Landlock, seccomp. stdio[i] becomes
 * fd i (-1: keep fd i); the pass_fds stay open with their flags; every other
 * fd is closed. trees: one detached tree (sbx_detach_tree) per SBX_F_FROM_FD
 * bind, in op order; they are consumed.
 * Returns 0 in the child once it is set up, ready to run the caller's code.
 * In the parent it returns at once, while the child sets up: the child's pid
 * (res->pid), with res->status_fd the read end of its report pipe, to pass
 * to sbx_fork_ready(); or -1 if the clone failed (res->step/err). */
int sbx_fork_sandbox(const void *blob, size_t len, const int stdio[3], const int *pass_fds, int n_pass,
                     const int *trees, int n_trees, struct sbx_result *res);

/* sbx_fork_sandbox() into cgroups of the task's own: the child writes "0"
 * to each of cgroup_fds[0..n_cgroup) (cgroup.procs files, opened by whoever
 * made the cgroups) as its first step, as sbx_spawn_cg's does, before any
 * other setup and long before the caller's code runs in it; task_fds closes
 * them in the child. A failure is SBX_STEP_CGROUP with .op the index. The
 * fds stay the caller's. */
int sbx_fork_sandbox_cg(const void *blob, size_t len, const int stdio[3], const int *pass_fds, int n_pass,
                        const int *trees, int n_trees, const int *cgroup_fds, int n_cgroup,
                        struct sbx_result *res);

/* sbx_fork_sandbox_cg() in a leased network namespace: join_ns = {userns
 * fd, netns fd}, the namespace and the user namespace that owns it, which
 * must be a child of the caller's own made by its euid (a WorkerPool's
 * supply: the caller holds every capability there without holding any
 * itself). The task's user namespace is made inside that owner, so it holds
 * no capability over the namespace: lo is not brought up (it must be up).
 * join_ns NULL or {-1, -1}: a fresh one, as sbx_fork_sandbox_cg. A failure
 * to join is SBX_STEP_JOIN_NETNS. The fds stay the caller's (the task does
 * not keep them). */
int sbx_fork_sandbox_ns(const void *blob, size_t len, const int stdio[3], const int *pass_fds, int n_pass,
                        const int *trees, int n_trees, const int *cgroup_fds, int n_cgroup, const int join_ns[2],
                        struct sbx_result *res);

/* For a process that forks from CPython holding the GIL (a WorkerPool's
 * zygote, through ctypes.PyDLL): every later sbx_fork_sandbox*() call of
 * the process calls `before` (PyOS_BeforeFork) just before its clone,
 * `after_parent` (PyOS_AfterFork_Parent) in the caller once it has cloned
 * or failed to, and `after_child` (PyOS_AfterFork_Child) in the child once
 * it is set up, as os.fork() does: the caller must not call them itself,
 * and must hold the GIL in every such call (never through cffi, which
 * releases it). All three or none (NULL: no calls, the default). Returns
 * 0, or -1 if only some are given (nothing changes). */
int sbx_fork_python_hooks(void (*before)(void), void (*after_parent)(void), void (*after_child)(void));

/* The end of a forked child's setup: reads its report from report_fd (from
 * sbx_fork_sandbox's res->status_fd; blocks until the child is ready or dead)
 * and closes it. 0 if the child is ready (res->landlock_abi and its timing
 * stamps set), -1 if its setup failed (res->step/op/err/detail), the child
 * then reaped: no process is left behind. */
int sbx_fork_ready(int report_fd, int pid, struct sbx_result *res);

/* In a forked task (pid 1 of its pid namespace, which the kernel never lets
 * die of a signal it sends itself with the default action: abort() and
 * raise() do nothing, then abort() faults): for every signal whose action is
 * still the default and would end the process, a handler that writes the
 * 8-byte word `died_base + signal` to `note_fd` and ends the task: a fault
 * (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP from the CPU) happens again with
 * the default action, which the kernel does apply to pid 1; any other signal
 * exits with status 128 + signal. The reader of note_fd thus learns which
 * signal the task died of. The handlers are installed by the first call in a
 * process and inherited by its forks (a zygote calls it once with note_fd
 * -1); later calls only set note_fd and died_base. Returns 0, or -1 with
 * errno. */
int sbx_task_death_notes(int note_fd, uint64_t died_base);

/* A WorkerPool zygote's serve loop (csrc/core/zygote.c): once its Python side
 * has started (INIT, its imports, READY), the zygote forks, reports and
 * reaps in C, never returning to Python between two forks (every page its
 * interpreter writes while a child shares it is a copy-on-write fault).
 * Control messages, both ways on the SOCK_SEQPACKET control socket, are
 * one struct sbx_zmsg each, with fds (SCM_RIGHTS):
 *   caller -> zygote  SPAWN  id, flags (PLAN), n_trees, slot, n_ns
 *                            fds: result, stdout, stderr, [plan memfd], trees,
 *                            [per_slot cgroup.procs + n_ns namespace fds]
 *                     KILL   id
 *                     TAKEN  pid, id (the caller gave spare pid task id)
 *                     SLOT   slot, n_ns  fds: per_slot cgroup.procs + n_ns
 *   zygote -> caller  SPARE  pid, slot   fds: socket to the spare, pidfd
 *                     STARTED id, pid, slot, flags (SPARE: a claimed spare), t_ns
 *                     FAILED id, slot, step, op, err, detail, status (wait status)
 *                     EXITED id (-1: an unused spare), pid, slot, status, and in t_ns
 *                            [SBX_Z_RU_*] wait4's rusage of a task's pid 1 (all 0: none)
 *   caller -> spare   SPAWN  fds: result, stdout, stderr
 * (slot -1: none; n_ns 0 or 2: a leased network namespace's owner and itself) */
#define SBX_Z_SPAWN 1
#define SBX_Z_KILL 2
#define SBX_Z_TAKEN 3
#define SBX_Z_SLOT 4
#define SBX_Z_SPARE 16
#define SBX_Z_STARTED 17
#define SBX_Z_FAILED 18
#define SBX_Z_EXITED 19
#define SBX_Z_RU_UTIME_US 0
#define SBX_Z_RU_STIME_US 1
#define SBX_Z_RU_MAXRSS_KB 2
#define SBX_ZF_PLAN 1      /* SPAWN: a per-task plan (memfd) follows stderr */
#define SBX_ZF_SPARE 2     /* STARTED: a spare the task claimed while it was set up */
#define SBX_Z_MAX_FDS 64   /* fds in one message */

struct sbx_zmsg {
    uint32_t kind;
    uint32_t flags;
    int64_t id;             /* a task's id, -1: none */
    int32_t pid;            /* the sandbox's pid in the zygote's pid namespace */
    int32_t slot;           /* the caller's slot, -1: none */
    uint32_t n_trees;
    uint32_t n_ns;
    int32_t status;         /* EXITED: wait status; FAILED: how its setup child ended */
    int32_t step;           /* FAILED: struct sbx_result's */
    int32_t op;
    int32_t err;
    int32_t detail;
    int32_t pad;
    uint64_t t_ns[8];       /* STARTED: enum sbx_stamp */
};

struct sbx_zygote {
    int32_t ctl;            /* the control socket */
    int32_t spares;         /* sandboxes to keep forked ahead of their tasks */
    int32_t per_slot;       /* cgroup.procs fds per slot (0: no cgroups) */
    int32_t slotted;        /* every fork takes a slot (cgroups, or leased network namespaces) */
    int32_t factory_pidfd;  /* the network namespace factory, reaped when it ends (-1: none) */
    int32_t quiet_ms;       /* idle this long, the zygote tops up its spares */
    int32_t task_fd;        /* set in a task's sandbox: its channel */
    int32_t pad;
    uint64_t died_base;     /* sbx_task_death_notes' */
    /* In a task's sandbox, the loop calls task_main(task_fd) (a Python
     * callable, through CPython's PyObject_CallOneArg and PyLong_FromLong,
     * the GIL held) instead of returning into the zygote's Python frames;
     * it does not return (if it does, the task exits 70). NULL: return. */
    void *task_main;
    void *call_one;
    void *long_from;
    const void *blob;       /* the pool's task plan */
    size_t blob_len;
    struct sbx_result res;  /* sbx_zygote_check's failure */
    void *state;            /* the loop's own (children, slots), zygote.c's */
};

/* A slot the caller sent with INIT: fds[0..n_cg) cgroup.procs, then n_ns
 * namespace fds (taken over). 0, or -1 (ENOMEM). */
int sbx_zygote_add_slot(struct sbx_zygote *z, int slot, const int *fds, int n_cg, int n_ns);
/* Fork one sandbox of the pool's plan and wait for its setup, so that a
 * plan its tasks cannot be set up with fails the pool's start: 0 (it is
 * the first spare, offered by sbx_zygote_serve), -1 (z->res says why), or
 * 1 in that sandbox once it has its task (z->task_fd). Called, as
 * sbx_zygote_serve, through ctypes.PyDLL: the GIL held (CPython's fork
 * hooks, sbx_fork_python_hooks, are called around the forks, and a task's
 * sandbox runs z->task_main from there). */
int sbx_zygote_check(struct sbx_zygote *z);
/* Serve the caller until it closes the control socket (0), or -1 with
 * errno; returns 1 in a task's sandbox (forked for a SPAWN, or a spare
 * that received its task), whose channel is z->task_fd, its stdout and
 * stderr on 1 and 2, its death notes on the channel. */
int sbx_zygote_serve(struct sbx_zygote *z);

/* Clone the mount tree at host path `path`, recursively, as a detached mount
 * with the SBX_F_RDONLY/NODEV/NOSUID of `flags` set, for a per-sandbox
 * bind (SBX_F_FROM_FD) of a sandbox that cannot see the host. Needs no privilege (a
 * short-lived child does it in new user and mount namespaces). Returns the
 * tree's fd (close-on-exec), or -1 with res->step (SOURCE) and res->err. */
int sbx_detach_tree(const char *path, uint32_t flags, struct sbx_result *res);

/* What this host allows: clone a child into the namespaces `ns` (SBX_NS_*),
 * map ids, and try the mount API the native backend needs. 0 if everything
 * worked, else -1 with res->step/err saying what was refused. Threads may
 * probe at the same time: each probe's state lives in its own call. */
int sbx_probe(uint32_t ns, struct sbx_result *res);

/* From outside a running sandbox (one bwrap made): enter its network
 * namespace (through userns_fd, its owner, unless -1) and make a listening
 * socket on 127.0.0.1 for each of the n ports, then a NETLINK_ROUTE socket,
 * into out[0..n]. 0, or -errno with nothing left open. */
int sbx_netns_sockets(int userns_fd, int netns_fd, const uint32_t *ports, int n, int *out);

/* From outside a running sandbox (one bwrap made): whether each of the n
 * paths exists inside it, as one of its processes would see it: a process
 * enters its mount namespace (through userns_fd, its owner, unless -1) and its
 * pid namespace (unless -1: the caller's own), so /proc/self, '..' and every link resolve as for the
 * sandbox's own processes; a final symlink is not followed. results[i]: 0,
 * or -errno. Returns 0, or -errno if the namespaces could not be entered. */
int sbx_probe_inside(int userns_fd, int mntns_fd, int pidns_fd, const char *const *paths, int n, int *results);

/* A failure record (res->step/op/err/detail of a failed sbx_spawn or
 * sbx_probe) in words, worded like bwrap's messages: "Can't find source path
 * /x: No such file or directory". `blob`/`len` is the plan that failed (its
 * op, cwd and probe paths are named; NULL or a blob sbx_check_blob refuses:
 * none are), `command` the argv[0] that was run (or NULL). Writes one line,
 * without newline, truncated to fit `size` (2 * len + strlen(command) + 256
 * bytes always suffice), into buf; returns buf. */
const char *sbx_format_error(const struct sbx_result *res, const void *blob, size_t len, const char *command,
                             char *buf, size_t size);

/* The path that failure concerns (a string inside `blob`: a bind source, an
 * op's destination, the requested cwd, a probe path), or NULL. */
const char *sbx_error_path(const struct sbx_result *res, const void *blob, size_t len);

/* The names of enum sbx_step and enum sbx_op_kind ("uid_map", "bind"),
 * indexed by value (NULL where no value is), generated from this header at
 * build time by build_ffi.py. */
extern const char *const sbx_step_names[];
extern const int sbx_n_steps;
extern const char *const sbx_op_kind_names[];
extern const int sbx_n_op_kinds;

/* A Template (csrc/template/template.c, the sandbox-template server) takes one
 * request per sandbox on a SOCK_SEQPACKET socket: this header, then the
 * per-sandbox blob (blob_len bytes, padded to 8; blob_len 0: the blob the
 * server stored with SBX_REQ_STORE_BLOB), then uint32_t[n_pass] (the numbers
 * the passed fds must have inside), then argc + envc NUL-terminated strings
 * (argv, then the environment). The fds come with SCM_RIGHTS in this order:
 * the report socket (one end of a SOCK_SEQPACKET pair, the caller keeps the
 * other), the status pipe's write end (only for a blob without
 * SBX_OPT_REAPER), a network namespace to join (if SBX_REQ_JOIN_NETNS), the
 * n_cgroup entry files (cgroup.procs or v1 tasks) of the sandbox's own
 * cgroups, which its first process writes "0" to before anything else of
 * the request runs (the caller made them with the request's limits), the
 * stdio fds present in stdio_mask (bit i: fd i), then the pass_fds. Requests
 * on the server's second socket are taken by its standby sandboxes
 * (csrc/template/standby.c), in the same format; a request with per-call binds goes to
 * the server itself. A standby already in a leased network namespace of its
 * own passes the request's on to the server, for its replacement. No reply:
 * everything comes on the report socket. */
#define SBX_REQ_MAGIC 0x51525853
#define SBX_REQ_JOIN_NETNS 1
#define SBX_REQ_STORE_BLOB 2        /* keep this blob as the one blob_len 0 names; with argc 0, only that
                                       (the only fd is a report socket: one report, step 0 when done) */
#define SBX_REQ_STANDBY 4           /* with a store: keep standby sandboxes of that blob on the second
                                       socket, answering once the first is ready (or failed); with
                                       SBX_REQ_JOIN_NETNS, SBX_N_STANDBY leases follow the report socket */
#define SBX_REQ_RECYCLE 8           /* with a store (before SBX_REQ_STANDBY's): this blob is the reset blob,
                                       the fresh mounts a recycled standby makes again after each request */
#define SBX_REQ_RECYCLE_NET_KEPT 16 /* with SBX_REQ_RECYCLE: the reset blob for a reset that keeps the network
                                       namespace (no socket left in it): without the proc, which stays */
#define SBX_REQ_CGROUP_NEXT 32      /* a request's n_cgroup entry fds are a fresh cgroup for the standby that
                                       replaces the one taking it (which is in a cgroup of its own already);
                                       with a store and SBX_REQ_STANDBY, n_cgroup k: SBX_N_STANDBY sets of k
                                       entry fds follow the leases, one set per standby (cgroup mode). A
                                       request may carry more than k: the first n_cgroup - k are its own
                                       cgroups (other limits), which the sandbox enters, leaving its own */
#define SBX_REQ_IN_MEMFD 64         /* the message is this header alone (argc 0, blob_len 0), and the request
                                       (its header without this flag, and all) is the content of a memfd, the
                                       last of its fds: a request larger than one message can carry (the
                                       socket's send buffer, ~208 KiB by default) */
#define SBX_REQ_MAX_SIZE 67108864   /* the largest request a server takes in a memfd (64 MiB: argv and the
                                       environment are at most 6 MiB at exec; the rest is the blob) */
#define SBX_N_STANDBY 2             /* standby sandboxes a server keeps */
#define SBX_REQ_VERSION 2           /* struct sbx_request.version: what follows the header, and how */
#define SBX_REQ_MAX_CGROUP 8        /* cgroup entry files with one request (one per hierarchy) */
#define SBX_REQ_MAX_FDS 253         /* fds with one request (SCM_MAX_FD) */
struct sbx_request {
    uint32_t magic;         /* SBX_REQ_MAGIC */
    uint32_t blob_len;
    uint32_t argc;
    uint32_t envc;
    uint32_t n_pass;
    uint32_t flags;         /* SBX_REQ_* */
    uint32_t stdio_mask;
    uint32_t version;       /* SBX_REQ_VERSION */
    uint32_t n_cgroup;      /* cgroup entry fds after the netns (at most SBX_REQ_MAX_CGROUP) */
    uint32_t reserved;      /* 0 */
};

/* Where a checked request's parts are (sbx_parse_request): pointers into
 * the message (or the stored blob), and which of the fds that came with it
 * is which, as indexes (-1: none). The server and the unit tests read
 * requests through it alike. */
struct sbx_request_view {
    const char *blob;           /* the request's blob, or the stored one (blob_len 0) */
    const uint32_t *targets;    /* uint32_t[n_pass]: the numbers the pass fds get inside */
    const char *strings;        /* argc + envc NUL-terminated strings, ending where the message does */
    int32_t report, status, netns, stdio[3], pass_at; /* pass_at: the first of n_pass */
    int32_t cgroup_at;          /* the first of n_cgroup */
};

/* Check a request message (`len` bytes, 8-aligned) that came with `nfds`
 * fds, as a per-sandbox request: its header (magic, version, counts), its
 * blob (sbx_check_blob) or, blob_len 0, `stored` (NULL: none), its fd
 * targets and strings, which must end the message, and that its fds are
 * exactly those the header announces. 0 and *view filled in, or -1. */
int sbx_parse_request(const void *msg, size_t len, const void *stored, int nfds, struct sbx_request_view *view);
/* Check a store request (SBX_REQ_STORE_BLOB, argc 0): its header, its blob
 * (which ends the message), and its fds (the report socket, and
 * SBX_N_STANDBY leases with SBX_REQ_STANDBY|SBX_REQ_JOIN_NETNS, then, with
 * SBX_REQ_STANDBY and n_cgroup k, SBX_N_STANDBY sets of k cgroup entry
 * files). 0, or -1. */
int sbx_check_store(const void *msg, size_t len, int nfds);

/* The failure record a setup process writes to its close-on-exec error
 * pipe (or a Template's report socket) before it exits: the setup child
 * (child.c), the joiner, sandbox-init when the command cannot be forked or
 * exec'd (init.c), a Template's server. The parent reads it into struct
 * sbx_result. An EOF without a record means the pipe was closed by a
 * successful exec. */
struct sbx_report {
    int32_t step;   /* enum sbx_step */
    int32_t op;     /* index of the failing op (or probe path, rlimit ...), or -1 */
    int32_t err;    /* errno */
    int32_t detail; /* enum sbx_detail */
};

/* What sandbox-init (init.c) writes to its status pipe once every process
 * of the sandbox has been reaped: the command's raw wait status (a reader
 * that wants only that reads the first 4 bytes), then what the kernel
 * counted for all of them (getrusage(RUSAGE_CHILDREN) of pid 1: user and
 * system CPU time, the largest resident set of any), the usage a sandbox
 * without a cgroup reports. */
struct sbx_end_status {
    int32_t status;
    int32_t pad;
    int64_t utime_us;
    int64_t stime_us;
    int64_t maxrss_kb;
};

/* On the report socket, one message each:
 * - struct sbx_stamps_report (step 0), with the sandbox's pidfd and, in a
 *   leased network namespace, an fd of it (SCM_RIGHTS: which of the leases
 *   sent is this sandbox's), and its sender's credentials (SCM_CREDENTIALS: its pid in
 *   the receiver's pid namespace, with SO_PASSCRED set): sent by the
 *   sandbox's pid 1 once its command has been exec'd (with a reaper), or
 *   just before its own exec (without one: EOF then says it exec'd);
 * - a 16-byte failure (step, op, err, detail) instead, from the server (the
 *   request, a per-call bind's source, clone), the setup or the command's
 *   exec, with the fd of a lease that is the caller's again, if any;
 *   EOF without any message: the sandbox died during its setup;
 * - later, with a reaper, the command's raw wait status (int32_t), written
 *   once every other process of the sandbox has gone. */
struct sbx_stamps_report {
    int32_t step, op, err, detail;  /* step 0: stamps, not a failure; op: the Landlock ABI applied; err: the
                                       low 32 bits of the inode of the first cgroup entry file the sandbox
                                       entered last (0: none), which names its cgroup to the caller; detail:
                                       the same of the cgroups it left for those (0: none) */
    uint64_t t_ns[8];               /* enum sbx_stamp, as the child saw them */
};

/* The caller's end of a request, in C so that a spawn costs the caller two
 * calls (csrc/core/wire.c). sbx_template_send: a fresh report socket (its end in
 * *report, close-on-exec, SO_PASSCRED set) goes first with `fds` beside `msg`
 * on `sock`; 0, or -errno (nothing left open). sbx_template_report: one
 * message of a report socket, checked whole (enum sbx_answer, or -errno). */
enum sbx_answer {
    SBX_ANSWER_EOF = 0,     /* no message: its writers have all gone */
    SBX_ANSWER_STARTED = 1, /* report: the stamps report; pidfd the sandbox's pid 1's */
    SBX_ANSWER_FAILED = 2,  /* report's first 16 bytes: the failure */
    SBX_ANSWER_BAD = 3,     /* not a message of the protocol (a bug, or a forgery): report says SBX_STEP_CONFIG */
};
struct sbx_template_answer {
    struct sbx_stamps_report report;
    int32_t pid;        /* the sender's, in the caller's pid namespace (SCM_CREDENTIALS), or -1 */
    int32_t pidfd;      /* with SBX_ANSWER_STARTED, else -1 */
    uint64_t netns_ino; /* the inode of the leased namespace that came with it (its fd closed), or 0 */
};
int sbx_template_send(int sock, const void *msg, size_t len, const int *fds, int nfds, int *report);
int sbx_template_report(int report, struct sbx_template_answer *out);

/* A Session's wire (sandbox/session, csrc/session/session.c). On the session's
 * control socket (SOCK_STREAM), the caller sends one request per command: a
 * struct sbx_session_request carrying SCM_RIGHTS [call socket, stdin,
 * stdout, stderr], then `size` bytes of NUL-terminated strings: the search
 * PATH, the cwd ("" : the session's), argc argv strings, envc env strings.
 * With SBX_SESSION_USER the call process takes the request's ids (ids of
 * the session's user namespace, which the caller checked are mapped)
 * before the command exists; it needs a pid 1 started with the commands'
 * capability mask (csrc/session/session_user.c).
 * On the call socket (SOCK_SEQPACKET, one per command) the session's call
 * process and the caller exchange struct sbx_session_frame: STARTED (unless
 * the request is SBX_SESSION_QUIET; pid:
 * the command's pid in the session; SCM_RIGHTS: its pidfd), FAILED (step:
 * enum sbx_step, value: errno; the command never ran), EXITED (value: the
 * command's raw wait status); from the caller SIGNAL (value: the signal)
 * and KILL (the command's whole process tree); EOF from the caller leaves
 * the command running. */
#define SBX_SESSION_MAGIC 0x53534253 /* "SBSS" */
#define SBX_SESSION_MAX_STRINGS 4194304
#define SBX_SESSION_MAX_GROUPS 64
struct sbx_session_request {
    uint32_t magic, size, argc, envc;
    uint32_t flags; /* SBX_SESSION_QUIET: no STARTED frame (the caller waits for the end only);
                     * SBX_SESSION_USER: run as uid, gid and the n_groups supplementary groups */
    uint32_t uid, gid, n_groups;
    uint32_t groups[SBX_SESSION_MAX_GROUPS];
};
#define SBX_SESSION_QUIET 1
#define SBX_SESSION_USER 2
enum sbx_session_kind {
    SBX_SESSION_STARTED = 1,
    SBX_SESSION_FAILED = 2,
    SBX_SESSION_EXITED = 3,
    SBX_SESSION_SIGNAL = 4,
    SBX_SESSION_KILL = 5,
};
struct sbx_session_frame {
    int32_t kind, value, pid, step;
};
/* openat2(2) (csrc/core/util.c): a Session's file API resolves in its root. */
int sbx_openat2(int dfd, const char *path, uint64_t flags, uint64_t mode, uint64_t resolve);

/* Syscall numbers of this architecture, from the kernel headers at build time. */
extern const char *const sbx_syscall_names[];
extern const int sbx_syscall_numbers[];
extern const int sbx_n_syscalls;
/* CDEF END */

/* The reaper's parent-death signal (SIGRTMAX): on it, sandbox-init checks
 * whether the caller process, not just the spawning thread, is gone. */
#define SBX_PDEATH_SIGNAL 64

#endif
