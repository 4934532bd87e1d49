/* template.h: what the files of sandbox-template share.
 *
 *   template.c          the server: main, its poll loop, requests it serves
 *                       itself (SBX_MODE_TEMPLATE) and the stored blob
 *   template_request.c  a request message: receive, parse, the sandbox's input;
 *                       the server's fds a sandbox closes first
 *   template_trees.c    trees the server clones from the host's for a sandbox
 *   template_schedule.c the standby schedule: notes, reaping, replacements
 *   standby.c           a standby sandbox itself (SBX_MODE_STANDBY)
 *   template_recycle.c  a recycled standby, serving request after request (SBX_MODE_RECYCLE)
 *   resident.c          a sandbox's resident pid 1 (both modes)
 *
 * The server's state is one struct tpl_server, passed by pointer; a
 * sandbox (a fork-style copy of the server) reaches it through its context
 * (struct tpl_sandbox). */
#ifndef SANDBOX_TEMPLATE_H
#define SANDBOX_TEMPLATE_H

#include "internal.h"

#include <stddef.h>

#define MAX_MSG (256 * 1024)
#define MAX_FDS SBX_REQ_MAX_FDS /* SCM_MAX_FD */
#define N_STANDBY SBX_N_STANDBY /* a Template's standbys (the leases and cgroup sets of the wire count them) */
/* A recycled Template's: with two, a caller whose next request comes while
 * its last sandbox resets (its status goes out first) waits for that reset
 * when the other one serves a second caller; a third is ready instead. */
#define N_RECYCLED 3
#define N_SLOTS N_RECYCLED /* the most of either */
#define MAX_NULL_TREES 64
#define TAKEN_RESETTING 2

/* A sandbox without a reaper (as_pid_1): the server, its parent, writes its
 * wait status to the caller's status pipe. */
struct waiter {
    pid_t pid;
    int status_fd;
};

/* A standby's slot: pid 0, to be made; taken: its request is being set up,
 * and its replacement waits until its command runs (or it ends), so that
 * the replacement's setup does not compete with it for the CPU. Once it
 * runs, the replacement waits longer (replace_at) while another standby is
 * ready: until the sandbox ends or REPLACE_DELAY_NS have passed. A short
 * command's sandbox is then torn down before the next one is built, and
 * building it does not compete with the command, its caller and the
 * teardown for the CPU. */
struct standby_slot {
    pid_t pid;
    int taken;
    int64_t replace_at; /* the sandbox it became runs: replace it from then on (0: not yet) */
};

struct tpl_server {
    /* The server's own fds; a sandbox closes them first thing. */
    int sock_fd;   /* requests the server serves (per-call binds, stores) */
    int fast_fd;   /* requests standby sandboxes take */
    int notify_rd; /* standby -> server messages (the server's end) */
    int notify_wr; /* ... (the standbys' end) */
    int proc_dir;  /* the caller's procfs root: the sandboxes' id maps go through it */
    int host_tree; /* a detached clone of the host's mount tree */
    int sig_fd;    /* SIGCHLD */
    int own_netns; /* to come back to after a clone into a lease */
    int null_master; /* a detached read-only /dev/null to clone (-2: not made yet, -1: none) */
    char *stored_blob; /* SBX_REQ_STORE_BLOB */
    char *reset_blob;  /* SBX_REQ_STORE_BLOB|SBX_REQ_RECYCLE: the standbys are recycled (template_recycle.c) */
    char *reset_kept_blob; /* ... |SBX_REQ_RECYCLE_NET_KEPT: their reset when the netns is kept */
    /* the standby schedule (template_schedule.c) */
    volatile int *standby_taken; /* [N_SLOTS], MAP_SHARED: set by a standby that took a request
                                    (TAKEN_RESETTING: a recycled one's command has ended) */
    volatile int *serving;       /* MAP_SHARED, after standby_taken: the server reads the standbys'
                                    socket itself (a recycled standby ready again then says so) */
    struct standby_slot standby[N_SLOTS];
    int n_standby;    /* how many it keeps: N_STANDBY, or N_RECYCLED once a reset blob is stored */
    int standby_on;   /* making standbys: asked for, and none has failed */
    /* Leases mode (the stored plan's sandboxes lease their network namespace):
     * each standby joins one ahead, handed in by the caller (N_STANDBY with the
     * store request, then one with every request), so no request waits for a
     * join; a request the server serves itself joins the one it brings. */
    int leases_mode;
    int leases[2 * N_STANDBY]; /* ... those not in a standby yet */
    int n_leases;
    /* Cgroup mode (the stored plan has cgroup limits): each standby enters a
     * cgroup of its own as its first step, made ahead by the caller (a set of
     * cgroup_k entry fds, one per hierarchy: SBX_N_STANDBY with the store
     * request, then one with every request, SBX_REQ_CGROUP_NEXT), so no
     * request waits for a cgroup to be made or entered. A standby is made
     * only with a set; a request the server serves itself enters the one
     * it brings. */
    int cgroup_k;
    int cgroups[2 * N_STANDBY][SBX_REQ_MAX_CGROUP]; /* ... those not in a standby yet */
    int n_cgroups;
    int store_report; /* the store request's report socket, until the first standby is ready */
    struct waiter *waiters;
    size_t n_waiters, cap_waiters;
    /* the request being parsed (each process's own copy): msg_buf, or big
     * for one that came in a memfd (SBX_REQ_IN_MEMFD), freed when the next
     * comes */
    char *msg;
    char *big;
    char msg_buf[MAX_MSG] __attribute__((aligned(8)));
};

/* A sandbox's context and the server it is a copy of (its mode's hooks
 * find one from the other). */
struct tpl_sandbox {
    struct sbx_ctx c;
    struct tpl_server *srv;
    int slot;           /* a standby's slot */
    struct sbx_result res;
    int fds[MAX_FDS];   /* a standby's request's fds */
    int nfds;
    int *src_fds;       /* a recycled standby's scratch for its reset blob's ops */
    int own_null;       /* a recycled standby's srv->null_master is its own (template_recycle.c) */
    int said_ready;     /* it has told the server it is ready once */
};
#define TPL_SANDBOX(ctx) ((struct tpl_sandbox *)((char *)(ctx) - offsetof(struct tpl_sandbox, c)))

/* template_request.c */
/* One request, parsed: pointers into msg (or the stored blob) and the received fds. */
struct request {
    const struct sbx_request *r;
    const char *blob;
    const uint32_t *targets;
    char **argv, **envp;
    int *fds;
    int nfds, report, status, netns, stdio[3];
    int *pass;
    const int *cgroup; /* the sandbox's cgroup entry fds, n_cgroup of them */
    int n_cgroup;
};
/* Receive one request and its fds from `fd` into s->msg (a request in a
 * memfd, SBX_REQ_IN_MEMFD: read from it, the memfd closed and dropped from
 * the fds); its length, 0 when the caller has gone, -2 when it did not fit,
 * -1 when it is not a request (fds are received still). */
ssize_t receive_request(struct tpl_server *s, int fd, int *fds, int *nfds);
int parse_request(struct tpl_server *s, struct request *q, size_t len);
/* Free what a request that came in a memfd took (after its sandbox has its own copy). */
void forget_big_request(struct tpl_server *s);
/* The command's side of a sandbox's input: the request's blob, command,
 * fds (`pass`: its pass fds, in memory the child may rewrite) and report
 * socket. */
void request_input(struct sbx_input *in, const struct request *q, const int *pass);
/* A Template's sandbox enters its cgroups (c->in.cgroup_fds, each an fd of
 * its own copy of the fd table) as its first step (a standby placed ahead:
 * again, into a request's own), notes their tag (and that of the cgroups it
 * leaves) for its report (sbx_send_started) and closes them: nothing inside
 * keeps an fd of a cgroup. */
void tpl_enter_cgroups(struct sbx_ctx *c);
/* Close the cgroup sets kept for standbys to come (in a sandbox: none is its own). */
void tpl_close_cgroup_sets(struct tpl_server *s);
/* Close the server's own fds in a sandbox (the cgroup sets and leases too); a standby keeps the standbys'
 * request socket and the notify socket. */
void tpl_close_server_fds(struct tpl_server *s, int standby);
/* Of a request with SBX_REQ_CGROUP_NEXT in cgroup mode, the set for a
 * standby to come: its last cgroup_k entry fds, taken out of the request
 * (q->n_cgroup is then that of the request's own) into `out`; 0, or -1 if
 * it has none. */
int tpl_next_cgroup_set(const struct tpl_server *s, struct request *q, int *out);

/* template_trees.c */
/* As many detached clones of the host's /dev/null (from the host tree) as
 * the blob's procs have masks of entries this kernel has (and one more per
 * sys/net mask when the sandbox may join a leased network namespace), into
 * out[] (at most MAX_NULL_TREES): a sandbox's proc masks attach them, its
 * root need not have a /dev/null. How many (0 if the host has none: the
 * sandbox then clones its own). */
int make_null_trees(struct tpl_server *s, const char *blob, int *out);
/* Clone the sources of the blob's per-call binds (SBX_F_FROM_FD), in op
 * order, from the host tree into out[]; how many, or -1 with *op/errno. */
int clone_binds(struct tpl_server *s, const char *blob, int *out, int *op);
void close_all(int *fds, int n);

/* template_schedule.c */
int add_waiter(struct tpl_server *s, pid_t pid, int status_fd);
void add_lease(struct tpl_server *s, int fd);
/* Keep a set of cgroup_k entry fds for a standby to come (closed if there is no room). */
void add_cgroup_set(struct tpl_server *s, const int *fds, int n);
/* Start the standbys of the stored blob (SBX_REQ_STANDBY): the store
 * request's report socket is answered once one is ready; `leases` its
 * N_STANDBY leases in leases mode (n 0 otherwise). */
void start_standbys(struct tpl_server *s, int report, int leases_mode, const int *leases, int n, const int *cgroups,
                    int cgroup_k);
void read_notes(struct tpl_server *s);
void reap(struct tpl_server *s);
void make_standbys(struct tpl_server *s);
/* Milliseconds until the next deferred replacement is due (-1: none). */
int next_replacement(struct tpl_server *s);
/* Whether the server takes the standbys' requests itself; published in
 * s->serving for the recycled standbys (tpl_recycled_note). */
int serving_fast(struct tpl_server *s);

/* standby.c */
/* A message on the notify socket: a 16-byte struct sbx_report instead says
 * why a standby failed before any request. */
struct standby_note {
    int32_t kind; /* NOTE_READY, NOTE_TAKEN (with SCM_RIGHTS: an as_pid_1 sandbox's status fd), NOTE_RUNNING, NOTE_LEASE, NOTE_BUSY */
    int32_t slot;
};
#define NOTE_READY 1
#define NOTE_TAKEN 2
#define NOTE_RUNNING 3
#define NOTE_LEASE 4 /* with SCM_RIGHTS: a request's lease, for the standby that replaces the sender */
#define NOTE_CGROUP 5 /* with SCM_RIGHTS: a request's cgroup set (SBX_REQ_CGROUP_NEXT), for the same */
#define NOTE_BUSY 6  /* a recycled standby took a request: the server, woken, may have to serve the next */
/* Clone a standby sandbox of the stored blob into `slot`, in the network
 * namespace `lease` (-1: none; the standby owns its copy) and the cgroups
 * of `cgroup` (cgroup_k entry fds, NULL: none; the standby closes its
 * copies): its pid, or -1. */
pid_t make_standby(struct tpl_server *s, int slot, int lease, const int *cgroup);

/* A standby's first moments (its lease, the server's fds dropped). */
void tpl_standby_start(struct sbx_ctx *c);
/* Wait for a request on the standbys' socket and take it into c; a
 * `recycled` standby keeps its sockets for the next one. */
void tpl_take_request(struct sbx_ctx *c, int recycled);

/* template_kept.c */
/* Whether op i's destination lies beneath an earlier op's (a mount made
 * on a fresh one, detached with it). */
int tpl_beneath_another(const struct sbx_ctx *c, uint32_t i);
/* Whether another op mounts at op i's destination, above or beneath it:
 * op i's mount then goes when one beneath is detached (by path, a detach
 * takes the topmost mount there), or hides what one made again on it is
 * cloned from (a bind's source in the template's copy): it must be made
 * again too. */
int tpl_shares_place(const struct sbx_ctx *c, uint32_t i);
/* Before a recycled sandbox's reset: skip[k] for each op of the (reset)
 * blob whose mount is kept as it is (an empty Tmpfs, a devpts the command
 * left unchanged); every other record goes. */
void tpl_choose_kept(const struct sbx_ctx *c, unsigned char *skip);
/* After it: a record of each keepable mount it made. */
void tpl_record_kept(const struct sbx_ctx *c, const unsigned char *skip);
/* Whether the network namespace holds no socket any more but the `own`
 * that pid 1 and its maker keep there, by its counters. */
int tpl_net_empty(const struct sbx_ctx *c, long own);
/* A new network namespace was entered: its counters are opened anew. */
void tpl_net_renewed(void);
/* Whether the IPC namespace holds no object (SysV or POSIX queue), and its
 * mqueue root is as when it was made. */
int tpl_ipc_empty(void);
/* A new IPC namespace was entered: its mqueue root is recorded. */
void tpl_ipc_renewed(void);

/* template_maker.c */
#define TPL_MAKER_SOCKETS 2 /* the socket pair of pid 1 and its maker, made in the sandbox's network namespace */
/* In a recycled standby's pid 1, before any request: start the maker of its
 * command children, if they can be made that way: 0, or -1 (each is then
 * pid 1's own clone, template_recycle.c). */
int tpl_maker_start(struct sbx_ctx *c);
/* Have the maker make the next command child, which takes a request and
 * execs: its report socket, with the started report sent, and its pid in
 * *pid; -1 when it ended before (it reported why on the request's socket,
 * or found the caller gone); -2 when its exec failed (reported, reaped). */
int tpl_maker_next(struct sbx_ctx *c, pid_t *pid);
/* Whether the maker is alive and pid 1's only child (no process of the last
 * request is left). */
int tpl_maker_alone(void);
/* A new maker in place of the old, which lives in the namespaces pid 1 has
 * just left (its IPC or network namespace, made again by a reset); pid 1
 * ends if it cannot make one. */
void tpl_maker_renew(struct sbx_ctx *c);

/* template_inherited.c */
/* What a recycled standby's commands inherit from their maker that another
 * process of their uid may change there: its resource limits, scheduling
 * attributes, CPU affinity, I/O priority, OOM score adjustment and core
 * dump filter (the last two read through fds of its /proc files). */
struct tpl_inherited {
    uint64_t rl[16][2];
    uint32_t sched[14]; /* struct sched_attr, version 1 */
    unsigned long affinity[16];
    int ioprio;
    char oom[16], dump[16];
    int oom_fd, dump_fd;
};
/* The reference, taken before any request: 0, or -1. */
int tpl_inherited_take(const struct sbx_ctx *c, struct tpl_inherited *ref);
/* Whether every attribute is still the reference's. */
int tpl_inherited_same(const struct tpl_inherited *ref);
/* Drop every signal pending for this process (all are blocked). */
void tpl_drop_pending_signals(void);

extern const struct sbx_mode SBX_MODE_TEMPLATE, SBX_MODE_STANDBY, SBX_MODE_RECYCLE;

#endif
