/* exitlike.h: a client program ending as the command it stood for ended
 * (sandbox-launch, the `sandbox` CLI client). */
#ifndef SBX_EXITLIKE_H
#define SBX_EXITLIKE_H

#include <stdint.h>

/* Exit as the wait status `status` says: its exit code, or the same signal
 * (raised with its default action; 128+N if it does not kill). */
_Noreturn void exit_like(int status);

/* The same for a Popen-style returncode: N >= 0 an exit code, -N signal N. */
_Noreturn void exit_like_returncode(int32_t returncode);

/* One "sandbox: ..." line on stderr, then exit 125 (a setup failure): sandbox-launch's. */
void __attribute__((format(printf, 1, 2), noreturn)) die(const char *fmt, ...);

#endif
