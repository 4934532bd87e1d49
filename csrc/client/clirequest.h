/* clirequest.h: what both clients of cliwire.h share: the connection with
 * its check of the server, and the one builder of a request. The clients:
 * the CLI client (clipeer.c, with every fd of its own) and sandbox-launch's
 * handoff (handoff.c, with its stdio and its ticket). */
#ifndef SANDBOX_CLIREQUEST_H
#define SANDBOX_CLIREQUEST_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "cliwire.h"

/* A SOCK_SEQPACKET connection to the server listening at `path`, checked:
 * our uid and a pidfd (sbx_peer_of), and `serves(pid, pidfd, arg)` true of
 * the server; -2 if nobody listens there (no socket, or none accepting), -1
 * otherwise. */
int cli_connect(const char *path, int (*serves)(pid_t pid, int pidfd, void *arg), void *arg);

/* The request for argv (`argc` of them, argv[0] as invoked) in `cwd`, with
 * this process's environment, the fd numbers `fds` (`nfds`; the fds go in
 * SCM_RIGHTS beside it), the client's executable `exe` (NULL: zeros), its
 * hard limits, and the ticket `ticket`/`secret` (0/NULL: none); malloc'd,
 * its length in *size. NULL if it would be longer than `max` bytes or
 * memory runs out. The caller wipes the secret from it once it is sent. */
char *cli_request(int argc, char **argv, const char *cwd, const struct stat *exe, const int *fds, int nfds,
                  uint32_t ticket, const uint8_t *secret, size_t max, size_t *size);

#endif
