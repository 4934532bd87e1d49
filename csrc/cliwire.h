/* cliwire.h: the wire between the command-line client (csrc/cliclient.c,
 * the installed `sandbox` and `bwrap` commands) and the per-user CLI server
 * (sandbox/cliserver/). This header is its one definition: the server
 * reads it through cffi's cdef (sandbox/cliserver/wire.py), and
 * tests/unit/test_cliwire.py compiles it to check that both sides agree.
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
 * Then frames go both ways (struct sbx_cli_frame): SIGNAL and ACK from the
 * client; STATUS, FALLBACK and DIE_WITH_PARENT from the server. FALLBACK
 * comes only before the server has read or used anything of the request's:
 * the client then runs the command line itself (the Python CLI, directly).
 */
#ifndef SANDBOX_CLIWIRE_H
#define SANDBOX_CLIWIRE_H

#include <stdint.h>

/* CDEF BEGIN */
#define SBX_CLI_MAGIC 0x4c434253 /* "SBCL" */
#define SBX_CLI_VERSION 2
#define SBX_CLI_MAX_FDS 253 /* the kernel's SCM_MAX_FD: more open fds, and the client runs directly */
#define SBX_CLI_MAX_REQUEST 196608 /* bytes; a larger request runs directly */

struct sbx_cli_request {
    uint32_t magic, version;
    uint32_t argc;  /* argv[0] included */
    uint32_t envc;
    uint32_t nfds;  /* fd numbers (int32) that follow this header */
    uint32_t size;  /* bytes of strings after the fd numbers */
    uint64_t exe_dev, exe_ino;
    int64_t exe_mtime; /* nanoseconds */
    uint64_t sigmask;  /* the client's signal mask (bit N-1: signal N), before it blocked all to send this */
};

enum sbx_cli_kind {
    SBX_CLI_STATUS = 1,          /* server: value is the returncode (-N: killed by signal N) */
    SBX_CLI_FALLBACK = 2,        /* server: nothing was used; run the command line directly */
    SBX_CLI_SIGNAL = 3,          /* client: value is a signal the client received, for the command */
    SBX_CLI_DIE_WITH_PARENT = 4, /* server: --die-with-parent: the client dies with its own parent */
    SBX_CLI_ACK = 5,             /* client: value 1 if DIE_WITH_PARENT holds, 0 if its parent is gone */
};

struct sbx_cli_frame {
    int32_t kind, value;
};
/* CDEF END */

#endif
