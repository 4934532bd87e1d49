/* cliplan.c: the CLI client runs a command line's sandbox itself, from the
 * plan its server compiled (SBX_CLI_PLAN, csrc/client/cliwire.h), as the Python
 * CLI run directly would (sandbox/cli.py's run and _execute): the CLI's
 * warnings first, --die-with-parent on this process too, SIGINT, SIGTERM
 * and SIGHUP passed to the sandbox and every other signal left as a fresh
 * interpreter has it, the sandbox started with this process's own stdio,
 * ids, namespaces, limits and cgroup (it is our child), and the exit status
 * and failure messages the Python CLI gives: the command's own status, 128+N
 * for signal N, 127/126/125 and a "sandbox: ..." line (under the name bwrap:
 * 1 and "bwrap: ...").
 *
 * The answer comes from a server the client has checked (clipeer.c), and is
 * checked whole before anything of it runs: its sizes, its strings, the blob
 * (sbx_check_blob), that it passes only fds the request listed, and that it
 * asks for nothing this process does not hold (sync fds, listeners, an
 * executable fd). Anything off, and the client fails without running it.
 */
#define _GNU_SOURCE
#include "cliclient.h"
#include "errtext.h"
#include "runplan.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

struct answer {
    uint32_t flags;
    int npass;
    int pass[SBX_CLI_MAX_FDS];
    void *blob; /* an 8-aligned copy */
    size_t blob_size;
    char **argv, **envp;
    const char *before, *after;
    size_t before_size, after_size;
};

static int as_bwrap_conventions;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One "sandbox: ..." (or "bwrap: ...") line on stderr, as the Python CLI's _say. */
static void say(const char *fmt, ...)
{
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    for (char *p = line; *p; p++) /* the CLI joins a message's lines */
        if (*p == '\n')
            *p = ' ';
    dprintf(2, "%s: %s\n", as_bwrap_conventions ? "bwrap" : "sandbox", line);
}

/* The Python CLI's status for one of its own failures (125, 126, 127; as bwrap: 1). */
static _Noreturn void fail_with(int status)
{
    exit(as_bwrap_conventions ? 1 : status);
}

/* ------------------------------------------------------------------ the answer */

static int listed(int fd, const int *fds, int nfds)
{
    for (int i = 0; i < nfds; i++)
        if (fds[i] == fd)
            return 1;
    return 0;
}

/* The `argc` + `envc` NUL-terminated strings packed in `data` (exactly
 * `size` bytes) as two NULL-terminated arrays. */
static int split_strings(char *data, size_t size, struct answer *a, uint32_t argc, uint32_t envc)
{
    size_t at = 0;
    for (uint32_t i = 0; i < argc + envc; i++) {
        char *end = at < size ? memchr(data + at, 0, size - at) : NULL;
        if (!end)
            return -1;
        if (i < argc)
            a->argv[i] = data + at;
        else
            a->envp[i - argc] = data + at;
        at = (size_t)(end - data) + 1;
    }
    a->argv[argc] = NULL;
    a->envp[envc] = NULL;
    return at == size ? 0 : -1;
}

/* What a plan for this client may ask of the core: the sandbox is started
 * with no sync fds, listeners, executable fd or cgroups of ours. */
static const char *runnable(const struct sbx_header *h, int init_fd)
{
    if (h->opts & (SBX_OPT_SYNC | SBX_OPT_EXEC_FD | SBX_OPT_HOST_TREE))
        return "it asks for sync fds or an executable fd";
    if (h->n_listen)
        return "it asks for listening sockets";
    if ((h->opts & SBX_OPT_REAPER) && init_fd < 0)
        return "its reaper came without sandbox-init";
    if (!(h->opts & SBX_OPT_REAPER) && init_fd >= 0)
        return "an fd came with it that it does not use";
    return NULL;
}

/* Check the PLAN message `msg` (`len` bytes, with `init_fd` from its
 * SCM_RIGHTS, or -1) against the request (`fds`: the numbers it listed) and
 * fill `a`; NULL, or what is wrong with it. `msg` must stay alive. */
static const char *check_answer(char *msg, size_t len, int init_fd, const int *fds, int nfds, struct answer *a)
{
    struct sbx_cli_plan h;
    if (len < sizeof h)
        return "shorter than its header";
    memcpy(&h, msg, sizeof h);
    if (h.kind != SBX_CLI_PLAN || h.npass > SBX_CLI_MAX_FDS || h.argc < 1 || h.argc > SBX_CLI_MAX_ANSWER / 2 ||
        h.envc > SBX_CLI_MAX_ANSWER / 2)
        return "a header out of bounds";
    size_t want = sizeof h + (size_t)h.npass * sizeof(int32_t) + h.blob_size + h.strings_size + h.before_size +
                  h.after_size;
    if (want != len)
        return "sizes that do not add up to its length";
    char *at = msg + sizeof h;
    a->flags = h.flags;
    a->npass = (int)h.npass;
    for (int i = 0; i < a->npass; i++, at += sizeof(int32_t)) {
        int32_t fd;
        memcpy(&fd, at, sizeof fd);
        if (fd < 3 || !listed(fd, fds, nfds)) /* only what we hold, and not stdio */
            return "an fd to pass that the request did not list";
        a->pass[i] = fd;
    }
    a->blob_size = h.blob_size;
    a->blob = aligned_alloc(8, (h.blob_size + 7) / 8 * 8 + 8);
    a->argv = calloc((size_t)h.argc + 1, sizeof *a->argv);
    a->envp = calloc((size_t)h.envc + 1, sizeof *a->envp);
    if (!a->blob || !a->argv || !a->envp)
        return "no memory for it";
    memcpy(a->blob, at, h.blob_size);
    at += h.blob_size;
    if (sbx_check_blob(a->blob, a->blob_size) < 0)
        return "a plan that sbx_check_blob refuses";
    const char *why = runnable(a->blob, init_fd);
    if (why)
        return why;
    if (split_strings(at, h.strings_size, a, h.argc, h.envc) < 0)
        return "strings that are not the ones it counts";
    at += h.strings_size;
    a->before = at;
    a->before_size = h.before_size;
    a->after = at + h.before_size;
    a->after_size = h.after_size;
    return NULL;
}

/* ------------------------------------------------------------------ running it */

static void put_text(const char *text, size_t size)
{
    while (size > 0) {
        ssize_t n = write(2, text, size);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        text += n;
        size -= (size_t)n;
    }
}

/* sandbox.errors.signal_name: "SIGKILL", or "signal N" for a number Python names not. */
static void signal_name(int sig, char *out, size_t size)
{
    const char *name = sig > 0 && sig < sbx_n_signal_names ? sbx_signal_names[sig] : NULL;
    if (name)
        snprintf(out, size, "%s", name);
    else
        snprintf(out, size, "signal %d", sig);
}

/* The failure in the Python CLI's words and status (sandbox/cli.py's _execute,
 * sandbox/_core/report.py's setup_error). */
static _Noreturn void spawn_failed(const struct sbx_result *res, const struct answer *a)
{
    if (res->step == SBX_STEP_EXEC) {
        int err = res->err ? res->err : ENOENT;
        say("execvp %s: %s", a->argv[0], sbx_strerror(err));
        fail_with(err == ENOENT ? 127 : 126);
    }
    if (res->step == SBX_STEP_CRASHED) {
        char name[32];
        signal_name(res->err, name, sizeof name);
        say("the sandbox's setup process was killed by %s before the command ran", name);
        fail_with(125);
    }
    size_t size = 2 * a->blob_size + strlen(a->argv[0]) + 256;
    char *text = malloc(size);
    if (!text) {
        say("setup failed at step %d: %s", res->step, sbx_strerror(res->err));
        fail_with(125);
    }
    say("%s", sbx_format_error(res, a->blob, a->blob_size, a->argv[0], text, size));
    fail_with(125);
}

/* The signals as the Python CLI has them while it waits for its sandbox:
 * SIGINT, SIGTERM and SIGHUP passed on (cli.SignalForwarder), SIGPIPE and
 * SIGXFSZ ignored (as the interpreter starts), every other one at its
 * default but those the caller left ignored. `came`: the signals relayed
 * while the server answered (lost there): passed on, or acted on now. */
static void take_signals(const volatile sig_atomic_t *came)
{
    static const int forwarded[] = {SIGINT, SIGTERM, SIGHUP};
    sbx_forward_signals(forwarded, sizeof forwarded / sizeof *forwarded);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    signal(SIGCHLD, SIG_DFL); /* the command starts with every signal reset anyway; we wait for ours */
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction old;
        if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGPIPE || sig == SIGXFSZ || sig == SIGCHLD ||
            sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &old) < 0)
            continue;
        if (old.sa_handler != SIG_IGN && old.sa_handler != SIG_DFL) /* our relay's */
            signal(sig, SIG_DFL);
    }
    for (int sig = 1; sig < NSIG; sig++)
        if (came[sig])
            raise(sig);
}

void run_answer(char *msg, size_t len, int init_fd, const int *fds, int nfds, pid_t parent, int as_bwrap,
                const volatile sig_atomic_t *came)
{
    as_bwrap_conventions = as_bwrap;
    static struct answer a;
    const char *bad = check_answer(msg, len, init_fd, fds, nfds, &a);
    if (bad) { /* nothing of it runs; the request may have been used: no direct run either */
        say("the sandbox CLI server sent a plan this client does not run: %s", bad);
        fail_with(125);
    }
    put_text(a.before, a.before_size);
    if (a.flags & SBX_CLI_PLAN_DIE_WITH_PARENT) {
        /* as bwrap's own prctl: the signal comes only for a parent that dies
         * after it; a parent gone already means we were reparented */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != parent) {
            say("the caller is gone (--die-with-parent)");
            fail_with(125);
        }
    }
    take_signals(came);
    struct sbx_plan_run run = {.blob = a.blob, .len = a.blob_size, .argv = a.argv, .envp = a.envp,
                               .pass_fds = a.pass, .n_pass = a.npass, .init_fd = init_fd};
    struct sbx_result res;
    if (sbx_run_plan(&run, &res) < 0)
        spawn_failed(&res, &a);
    put_text(a.after, a.after_size);
    int status = sbx_wait_plan(&res);
    if (status == -1) {
        say("waitpid: %s", sbx_strerror(errno));
        fail_with(125);
    }
    /* the CLI's status: the command's own, 128+N if signal N ended it */
    exit(WIFEXITED(status) ? WEXITSTATUS(status) : (128 + WTERMSIG(status)) & 0xff);
}
