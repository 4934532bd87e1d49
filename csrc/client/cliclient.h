/* cliclient.h: what the CLI client's files share (cliclient.c, clipeer.c).
 * The wire itself is cliwire.h. */
#ifndef SANDBOX_CLICLIENT_H
#define SANDBOX_CLICLIENT_H

#define _GNU_SOURCE
#include <signal.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "cliwire.h"

#define CLI_SERVER_ENV "SANDBOX_CLI_SERVER" /* "0": never hand off, never start a server */

/* The server's socket for the installation in `exe_dir`, in a directory of
 * mode 0700 that belongs to us (made if missing); -1 if there is none. */
int socket_path(const char *exe_dir, char *out, size_t size);

/* A connection to the server at `path` whose peer is verified (our uid, and
 * confined exactly as we are); -2 if nobody listens there, -1 otherwise. */
int connect_server(const char *path);

/* Answer a worker's CHALLENGE (cliwire.h): the proof that we may ptrace
 * its process `pid`, so that no Landlock domain confines us and not it. */
void prove(int sock, pid_t pid);

/* The request (cliwire.h) for argv in `cwd`, with every open fd of ours
 * but `conn` listed in `fds` (their count in `nfds`); NULL if it cannot be
 * sent (too many fds, too large). */
char *build_request(int argc, char **argv, const char *cwd, const struct stat *exe, int conn, int *fds, int *nfds,
                    size_t *size);

/* Run the server's PLAN answer `msg` (`len` bytes; `init_fd` the fd that
 * came with it, or -1) for a request that listed `fds`, as the Python CLI
 * would run that command line; `parent` is our caller, `as_bwrap` whether
 * we speak as bwrap, `came` the signals (by number) that came while the
 * server answered. Never returns (cliplan.c). */
_Noreturn void run_answer(char *msg, size_t len, int init_fd, const int *fds, int nfds, pid_t parent, int as_bwrap,
                          const volatile sig_atomic_t *came);

#endif
