/* handoff.h: sandbox-launch's handoff to a warm sandbox.Template held by
 * its caller (sandbox/compat/handoff.py speaks the other side).
 *
 * The caller's process serves only the launches it prepared: each
 * `sandbox-launch --handoff ...` command line comes with its own ticket in
 * the environment, HANDOFF_ENV="ID:SECRET:PATH" (ID decimal, SECRET
 * HANDOFF_SECRET_SIZE random bytes as lowercase hex, PATH the socket, in a
 * directory its owner cannot list, under a name only the ticket tells). The
 * launcher takes the variable out of its environment first thing (its
 * bytes zeroed, so /proc/PID/environ does not show it either), whether it
 * hands off or not: the command never sees it. A ticket is good for one
 * command; the server answers FALLBACK to one it does not hold.
 *
 * The wire is the CLI's (cliwire.h): one SOCK_SEQPACKET connection per
 * command, one request (struct sbx_cli_request with the ticket, the fd
 * numbers 0, 1 and 2 with those fds in SCM_RIGHTS, then argv[0], the cwd,
 * argv[1..] and the environment), then frames (struct sbx_cli_frame, and
 * text after ERROR and FALLBACK) both ways: SIGNAL from the launcher (a
 * signal it received, for the command); one of STATUS, ERROR or FALLBACK
 * from the server. The server kills the sandbox when the connection closes
 * before the command has ended.
 */
#ifndef SANDBOX_HANDOFF_H
#define SANDBOX_HANDOFF_H

#include "cliwire.h"

#define HANDOFF_ENV "SANDBOX_HANDOFF"

_Static_assert(sizeof(((struct sbx_cli_request *)0)->secret) == SBX_CLI_SECRET_SIZE, "the secret's size");

/* Take HANDOFF_ENV out of the environment (every copy; the bytes of its
 * value zeroed) and, if `keep`, keep its ticket for try_handoff; returns 1
 * if it kept a well-formed one, else 0. Call before anything reads the
 * environment. */
int take_ticket(int keep);

/* Hand argv over with the ticket take_ticket() kept; returns only if the
 * launcher should run the plan itself (no ticket, nobody answers, or the
 * server says so), with the ticket wiped. */
void try_handoff(char **argv);

#endif
