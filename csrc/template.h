/* template.h: what the files of sandbox-template share (template.c: the
 * server and requests it serves itself; standby.c: standby sandboxes). */
#ifndef SANDBOX_TEMPLATE_H
#define SANDBOX_TEMPLATE_H

#include "internal.h"

#define MAX_MSG (256 * 1024)
#define MAX_FDS 253 /* SCM_MAX_FD */

/* The server's own fds; a sandbox closes them first thing. */
extern int sock_fd;   /* requests the server serves (per-call binds, stores) */
extern int fast_fd;   /* requests standby sandboxes take */
extern int notify_rd; /* standby -> server messages (the server's end) */
extern int notify_wr; /* ... (the standbys' end) */
extern int proc_dir, host_tree, sig_fd, own_netns;
extern int null_master; /* a detached read-only /dev/null to clone (-2: not made yet, -1: none) */

extern char msg[MAX_MSG]; /* the request being parsed (each process's own copy) */
extern char *stored_blob; /* SBX_REQ_STORE_BLOB */
extern volatile int *standby_taken; /* [N_STANDBY], MAP_SHARED: set by a standby that took a request */

/* One request, parsed: pointers into msg (or the stored blob) and the received fds. */
struct request {
    const struct sbx_request *r;
    const char *blob;
    const uint32_t *targets;
    char **argv, **envp;
    int *fds;
    int nfds, report, status, netns, stdio[3];
    int *pass;
};

/* Receive one request and its fds from `fd` into msg; its length, 0 when
 * the caller has gone, -2 when it did not fit (fds are received still). */
ssize_t receive_request(int fd, int *fds, int *nfds);
int parse_request(struct request *q, size_t len);

/* As many detached clones of the host's /dev/null (from the host tree) as
 * the blob's procs have masks of entries this kernel has (and one more per
 * sys/net mask when the sandbox may join a leased network namespace), into
 * out[] (at most MAX_NULL_TREES): a sandbox's proc masks attach them, its
 * root need not have a /dev/null. How many (0 if the host has none: the
 * sandbox then clones its own). */
#define MAX_NULL_TREES 64
int make_null_trees(const char *blob, int *out);
void close_all(int *fds, int n);
/* The command's side of a sandbox's input: the request's blob, command,
 * fds (`pass`: its pass fds, in memory the child may rewrite) and report
 * socket. */
void request_input(struct sbx_input *in, const struct request *q, const int *pass);
extern const struct sbx_mode SBX_MODE_TEMPLATE, SBX_MODE_STANDBY;

/* standby.c */
#define N_STANDBY SBX_N_STANDBY
/* A message on the notify socket: a 16-byte struct sbx_report instead says
 * why a standby failed before any request. */
struct standby_note {
    int32_t kind; /* NOTE_READY, NOTE_TAKEN (with SCM_RIGHTS: an as_pid_1 sandbox's status fd), NOTE_RUNNING */
    int32_t slot;
};
#define NOTE_READY 1
#define NOTE_TAKEN 2
#define NOTE_RUNNING 3
#define NOTE_LEASE 4 /* with SCM_RIGHTS: a request's lease, for the standby that replaces the sender */
/* Clone a standby sandbox of the stored blob into `slot`, in the network
 * namespace `lease` (-1: none; the standby owns its copy): its pid, or -1. */
pid_t make_standby(int slot, int lease);

#endif
