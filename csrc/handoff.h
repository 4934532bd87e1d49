/* handoff.h: sandbox-launch's handoff to a warm sandbox.Template held by
 * its caller (sandbox/compat/handoff.py speaks the other side).
 *
 * One SOCK_SEQPACKET connection per command. The launcher sends one
 * request: a struct handoff_request, then the payload "CWD\0" argv[i]\0...
 * environ[i]\0..., with its fds 0, 1 and 2 in SCM_RIGHTS. Then frames
 * (struct handoff_frame, then text for ERROR and FALLBACK) go both ways:
 * SIGNAL from the launcher (a signal it received, for the command); one of
 * STATUS, ERROR or FALLBACK from the server. The server kills the sandbox
 * when the connection closes before the command has ended.
 */
#ifndef SANDBOX_HANDOFF_H
#define SANDBOX_HANDOFF_H

#include <stdint.h>

#define HANDOFF_MAGIC 0x48584253u /* "SBXH" */
#define HANDOFF_VERSION 1u

struct handoff_request {
    uint32_t magic, version, argc, envc, size; /* size: bytes of payload that follow */
};

enum handoff_kind {
    HANDOFF_STATUS = 1,   /* value: the returncode (-N: killed by signal N) */
    HANDOFF_ERROR = 2,    /* value: the exit code (125, 126, 127); text: the message */
    HANDOFF_FALLBACK = 3, /* the server cannot start it (stale template): run the plan */
    HANDOFF_SIGNAL = 4,   /* launcher -> server; value: the signal number */
};

struct handoff_frame {
    int32_t kind, value;
};

/* Hand argv over to the server on `path`; returns only if the launcher
 * should run the plan itself (nobody answers, or the server says so). */
void try_handoff(const char *path, char **argv);

/* From launcher.c: one "sandbox: ..." line and exit 125; exit as `status` says. */
void __attribute__((format(printf, 1, 2), noreturn)) die(const char *fmt, ...);
_Noreturn void exit_like(int status);

#endif
