/* runplan.c: see runplan.h. */
#define _GNU_SOURCE
#include "runplan.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

/* The sandbox's first process, once it exists; the signals that came before. */
static volatile sig_atomic_t run_pid;
static volatile sig_atomic_t held[NSIG];

static void forward(int sig)
{
    int saved = errno;
    if (run_pid > 0)
        kill(run_pid, sig);
    else if (sig > 0 && sig < NSIG)
        held[sig] = 1;
    errno = saved;
}

void sbx_forward_signals(const int *sigs, size_t n)
{
    struct sigaction sa = {0};
    sa.sa_handler = forward;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < n; i++)
        sigaction(sigs[i], &sa, NULL);
}

int sbx_run_plan(const struct sbx_plan_run *run, struct sbx_result *res)
{
    const int stdio[3] = {-1, -1, -1};
    if (sbx_spawn(run->blob, run->len, run->argv, run->envp, stdio, run->pass_fds, run->n_pass, run->init_fd, NULL,
                  -1, res) < 0)
        return -1;
    /* From here a signal goes to the sandbox at once; those held are sent
     * after (one that comes in between is sent, not held). */
    run_pid = res->pid;
    for (int sig = 1; sig < NSIG; sig++)
        if (held[sig]) {
            held[sig] = 0;
            kill(res->pid, sig);
        }
    return 0;
}

int sbx_wait_plan(const struct sbx_result *res)
{
    int32_t inner;
    ssize_t n = -1;
    while (res->status_fd >= 0 && (n = read(res->status_fd, &inner, sizeof inner)) < 0 && errno == EINTR)
        ;
    if (n == (ssize_t)sizeof inner)
        return inner;
    int status; /* no reaper, or it died without a word */
    while (waitpid(res->pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return status;
}
