/* exitlike.c: see exitlike.h. Runs in a client process of its own, never
 * in a sandbox's setup child. */
#define _GNU_SOURCE
#include "exitlike.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

_Noreturn void exit_like(int status)
{
    if (WIFEXITED(status))
        exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    kill(getpid(), sig);
    exit(128 + sig); /* a signal that does not kill (e.g. SIGCHLD) */
}

_Noreturn void exit_like_returncode(int32_t returncode)
{
    exit_like(returncode >= 0 ? (returncode & 0xff) << 8 : (-returncode) & 0x7f);
}

void __attribute__((format(printf, 1, 2), noreturn)) die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("sandbox: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(125);
}
