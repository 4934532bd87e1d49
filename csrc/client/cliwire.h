/* cliwire.h: the wire between the command-line client (csrc/client/cliclient.c,
 * the installed `sandbox` and `bwrap` commands) and the per-user CLI server
 * (sandbox/cliserver/). This header is its one definition: the server
 * reads it through cffi's cdef (sandbox/_core/cliwire.py), and
 * tests/unit/test_cliwire.py compiles it to check that both sides agree.
 *
 * Two clients speak it: the installed command (with every fd of its own)
 * and sandbox-launch handing its command to a warm Template held by its
 * caller (csrc/client/handoff.c, sandbox/compat/handoff.py: its fds 0, 1 and 2,
 * and the launch's ticket, which only that server reads; the CLI sends
 * none: `ticket` 0 and `secret` zero). The handoff's server answers with
 * STATUS, ERROR or FALLBACK frames and takes SIGNAL frames.
 *
 * One SOCK_SEQPACKET connection per command. The client sends one request:
 * struct sbx_cli_request, then `nfds` int32 fd numbers, then the strings
 * "ARGV0\0" "CWD\0" argv[1..]\0 environ[i]\0 (`size` bytes of strings in
 * all), with the fds themselves in SCM_RIGHTS, in the order of the numbers.
 * `exe_dev`, `exe_ino` and `exe_mtime` identify the client's executable: a
 * server started by another installation (or before it was reinstalled)
 * answers FALLBACK and exits. `sigmask` is the client's signal mask as its
 * caller left it: /proc shows all blocked while the client sends.
 *
 * `rlim_max` are the client's hard limits, by RLIMIT_* number (the plan
 * clamps the limits it sets to them).
 *
 * The server's first answer is one of:
 * - PLAN (struct sbx_cli_plan, below): the client runs the sandbox itself,
 *   from the plan the server compiled (csrc/client/cliplan.c), and the
 *   conversation is over;
 * - FALLBACK, sent only before the server has read or used anything of the
 *   request's: the client runs the command line itself (the Python CLI,
 *   directly);
 * - or the frames of a worker that runs the command line as the Python CLI
 *   (struct sbx_cli_frame, both ways): SIGNAL and ACK from the client;
 *   STATUS and DIE_WITH_PARENT from the server.
 *
 * A worker first asks the client to prove that no Landlock domain confines
 * it (CHALLENGE, its value the worker's pid): the client reads the target
 * of the worker's fd named SBX_CLI_PROOF_PREFIX... in /proc/PID/fd, which
 * needs ptrace access to the worker (refused by Landlock to a process whose
 * domain is not the worker's or an ancestor of it), and answers PROOF: the
 * frame (its value the text's length), then that text, in one message. A
 * wrong or missing proof gets FALLBACK (nothing of the request used yet).
 */
#ifndef SANDBOX_CLIWIRE_H
#define SANDBOX_CLIWIRE_H

#include <stdint.h>

/* CDEF BEGIN */
#define SBX_CLI_MAGIC 0x4c434253 /* "SBCL" */
#define SBX_CLI_VERSION 5
#define SBX_CLI_MAX_FDS 253 /* the kernel's SCM_MAX_FD: more open fds, and the client runs directly */
#define SBX_CLI_MAX_REQUEST 196608 /* bytes; a larger request runs directly */
#define SBX_CLI_MAX_ANSWER 262144  /* bytes; a larger plan is run by a worker (a larger answer is refused) */
#define SBX_CLI_N_RLIMITS 16       /* RLIM_NLIMITS */
#define SBX_CLI_MAX_PROOF 200      /* bytes of a PROOF's text (a memfd's link: "/memfd:" NAME " (deleted)") */
#define SBX_CLI_SECRET_SIZE 32     /* bytes of a handoff ticket's secret */

struct sbx_cli_request {
    uint32_t magic, version;
    uint32_t argc;  /* argv[0] included */
    uint32_t envc;
    uint32_t nfds;  /* fd numbers (int32) that follow this header */
    uint32_t size;  /* bytes of strings after the fd numbers */
    uint32_t ticket; /* sandbox-launch's handoff: the ID of its ticket (the CLI: 0) */
    uint32_t reserved; /* 0 */
    uint8_t secret[32]; /* SBX_CLI_SECRET_SIZE: the ticket's SECRET (the CLI: zero) */
    uint64_t exe_dev, exe_ino;
    int64_t exe_mtime; /* nanoseconds */
    uint64_t sigmask;  /* the client's signal mask (bit N-1: signal N), before it blocked all to send this */
    uint64_t rlim_max[16]; /* SBX_CLI_N_RLIMITS: the client's hard limits (RLIM_INFINITY: none) */
};

enum sbx_cli_kind {
    SBX_CLI_STATUS = 1,          /* server: value is the returncode (-N: killed by signal N) */
    SBX_CLI_FALLBACK = 2,        /* server: nothing was used; run the command line directly */
    SBX_CLI_SIGNAL = 3,          /* client: value is a signal the client received, for the command */
    SBX_CLI_DIE_WITH_PARENT = 4, /* server: --die-with-parent: the client dies with its own parent */
    SBX_CLI_ACK = 5,             /* client: value 1 if DIE_WITH_PARENT holds, 0 if its parent is gone */
    SBX_CLI_PLAN = 6,            /* server: run this plan yourself (struct sbx_cli_plan) */
    SBX_CLI_CHALLENGE = 7,       /* server: value is the worker's pid: prove ptrace access to it */
    SBX_CLI_PROOF = 8,           /* client: value bytes of the proof's text follow the frame */
    SBX_CLI_ERROR = 9,           /* server: value is the exit code (125, 126, 127); the message follows */
};

struct sbx_cli_frame {
    int32_t kind, value;
};

/* PLAN: this header, then `npass` int32 fd numbers of the client's to pass
 * to the command (each one the request listed), then `blob_size` bytes of
 * the native plan (csrc/core/sandbox.h's blob, checked by sbx_check_blob), then
 * `argc` and `envc` NUL-terminated strings (the command and its whole
 * environment), then `before_size` bytes to write on stderr before the
 * sandbox starts (the CLI's warnings) and `after_size` bytes once it has
 * (--verbose's line). With sandbox-init's O_PATH fd in SCM_RIGHTS when the
 * plan has a reaper. `flags`: SBX_CLI_PLAN_*. */
struct sbx_cli_plan {
    int32_t kind; /* SBX_CLI_PLAN */
    uint32_t flags;
    uint32_t npass, blob_size, argc, envc, strings_size, before_size, after_size;
};

enum sbx_cli_plan_flags {
    SBX_CLI_PLAN_DIE_WITH_PARENT = 1, /* the client dies with its parent, or fails if it is gone already */
};
/* CDEF END */

/* The name of the worker's memfd whose link in /proc/PID/fd is the proof
 * (a random nonce follows it). */
#define SBX_CLI_PROOF_PREFIX "/memfd:sandbox-cli-proof-"

#endif
