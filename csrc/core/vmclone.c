/* vmclone.c: the one place that clones a child into our own memory.
 *
 * clone(CLONE_VM|CLONE_VFORK) is what makes a sandbox start fast: no page
 * tables are copied, and the caller's thread sleeps until the child has
 * exec'd or exited. But the child then runs on our memory, so:
 * - it needs a stack of its own (the caller's frames must stay intact), mapped
 *   here and unmapped once the child no longer uses it (it has exec'd or
 *   exited when clone returns: CLONE_VFORK);
 * - no signal handler of the caller may run in the child (it would run
 *   Python's, for one, on the caller's heap): every signal is blocked across
 *   clone, so the child starts with all of them blocked, and the caller's
 *   mask is restored afterwards. glibc keeps its internal signals (thread
 *   cancellation, set*id broadcast) out of any mask; its handlers only serve
 *   signals sent from within the process, which is why the child may call no
 *   libc function that sends them (see internal.h).
 * CPython's _posixsubprocess does the same around vfork().
 */
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>

pid_t sbx_clone_vm(int (*fn)(void *), void *arg, unsigned long flags, size_t stack)
{
    char *base = mmap(NULL, stack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (base == MAP_FAILED)
        return -1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = clone(fn, base + stack, CLONE_VM | CLONE_VFORK | SIGCHLD | flags, arg);
    int saved = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    munmap(base, stack);
    errno = saved;
    return pid;
}
