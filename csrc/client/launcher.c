/* launcher.c: sandbox-launch, a native launcher for harnesses that run
 * `subprocess.run(argv, env=..., preexec_fn=None)`:
 *     sandbox-launch --plan BASE64 -- COMMAND [ARGS...]
 * BASE64 is a serialized plan (csrc/core/sandbox.h, from sandbox.launcher);
 * COMMAND gets the launcher's own environment. Exit status contract: the
 * command's own exit code; killed by signal N -> the launcher kills itself
 * with N (the caller sees returncode -N); 127 command not found inside,
 * 126 not executable; 125 and one "sandbox: ..." line for a setup failure.
 * Signals the launcher receives are forwarded to the sandbox; if the
 * launcher is killed, PR_SET_PDEATHSIG (die_with_parent) takes the sandbox
 * down with it. With die_with_parent (and always when handing off) the
 * launcher itself also dies with its caller, so no process stands between a
 * dead caller and a live sandbox.
 *
 * With `--report-fd N` before `--plan` (sandbox.backends.blob), fd N is
 * the write end of a pipe the caller reads: the launcher makes it
 * close-on-exec at once and writes one struct sbx_result to it, the
 * sandbox's start (step 0: its pid, its timing stamps) or the failure record
 * of its setup, which the caller turns into the typed error the native
 * backend raises; that failure is then not printed on stderr. A failure of
 * the launcher itself (a malformed plan) stays a "sandbox: ..." line and 125,
 * and the pipe's end of file without a record tells the caller so. Each
 * `--pass-fd N` (there too) is an fd the command keeps at its number; the
 * command gets no other fd but its stdio.
 *
 * With `--handoff` first (sandbox.compat.handoff), the launcher asks the
 * caller's process, which holds a warm sandbox.Template, to start the
 * command instead, with the ticket in its SANDBOX_HANDOFF variable
 * (csrc/client/handoff.h); if nobody there answers, it runs the plan itself. The
 * variable never reaches the command, with or without `--handoff`.
 */
#include "internal.h"
#include "errtext.h"
#include "exitlike.h"
#include "handoff.h"
#include "runplan.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int b64_value(int ch)
{
    if (ch >= 'A' && ch <= 'Z') return ch - 'A';
    if (ch >= 'a' && ch <= 'z') return ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') return ch - '0' + 52;
    if (ch == '+' || ch == '-') return 62;
    if (ch == '/' || ch == '_') return 63;
    return -1;
}

/* Decode base64 (standard or URL-safe, padding optional) into 8-aligned memory. */
static void *b64_decode(const char *s, size_t *len)
{
    size_t n = strlen(s);
    unsigned char *out = aligned_alloc(8, (n / 4 + 2) * 3 + 8);
    size_t o = 0;
    unsigned acc = 0;
    int bits = 0;
    if (!out)
        return NULL;
    for (; *s && *s != '='; s++) {
        int v = b64_value((unsigned char)*s);
        if (v < 0) {
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (unsigned)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
        }
    }
    *len = o;
    return out;
}

/* O_PATH fd of sandbox-init, which is installed next to this executable. */
static int open_init(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 32);
    if (n < 0)
        return -1;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    strcpy(slash ? slash + 1 : self, "sandbox-init");
    return open(self, O_PATH | O_CLOEXEC);
}

/* --report-fd: where the record goes (-1: none, the launcher's stderr). */
static int report_fd = -1;

/* N of `OPTION N`: an open fd above stdio. */
static int take_fd(const char *option, const char *arg)
{
    char *end;
    errno = 0;
    long fd = strtol(arg, &end, 10);
    if (errno || *end || end == arg || fd < 3 || fd > INT_MAX || fcntl((int)fd, F_GETFD) < 0)
        die("%s %s: not an open fd above 2", option, arg);
    return (int)fd;
}

/* The options before --plan (none with --handoff, whose command another
 * process starts): --report-fd N, made close-on-exec before anything else
 * runs, so only this process ever holds it; --pass-fd N, each an fd the
 * command keeps at its number, into `pass` (ascending, as sbx_spawn takes
 * them), never the report's. Returns how many were taken off argv. */
static int take_options(int argc, char **argv, int *pass, int *n_pass)
{
    int i = 1;
    for (; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--report-fd")) {
            report_fd = take_fd(argv[i], argv[i + 1]);
            if (fcntl(report_fd, F_SETFD, FD_CLOEXEC) < 0)
                die("--report-fd %s: %s", argv[i + 1], sbx_strerror(errno));
        } else if (!strcmp(argv[i], "--pass-fd")) {
            int fd = take_fd(argv[i], argv[i + 1]), k = *n_pass;
            for (; k > 0 && pass[k - 1] > fd; k--)
                pass[k] = pass[k - 1];
            if (k > 0 && pass[k - 1] == fd)
                die("--pass-fd %d: given twice", fd);
            pass[k] = fd;
            (*n_pass)++;
        } else {
            break;
        }
    }
    for (int k = 0; k < *n_pass; k++)
        if (pass[k] == report_fd)
            die("--pass-fd %d: the report's fd is the launcher's alone", report_fd);
    return i - 1;
}

/* The record, whole (one write below PIPE_BUF is atomic), then the pipe's
 * end: a caller that has gone just misses it. */
static void report(const struct sbx_result *res)
{
    ssize_t n;
    while ((n = write(report_fd, res, sizeof *res)) < 0 && errno == EINTR)
        ;
    close(report_fd);
    report_fd = -1;
}

/* The kernel's disposition of `sig`, raw: libc's sigaction() refuses its own
 * signals (32-34). `set`: make it the default (all zero: SIG_DFL, no flags). */
static int ignored(int sig, int set)
{
    unsigned long cur[8] = {0}, dfl[8] = {0};
    if (syscall(SYS_rt_sigaction, sig, NULL, cur, (NSIG - 1) / 8) < 0 || cur[0] != (unsigned long)SIG_IGN)
        return 0;
    if (set)
        syscall(SYS_rt_sigaction, sig, dfl, NULL, (NSIG - 1) / 8);
    return 1;
}

/* Which of `sigs` to pass on to the sandbox, into `out`. A plan that gives the
 * command this process's dispositions (no SBX_OPT_RESET_SIGNALS) gives it the
 * caller's: a signal the caller ignored stays ignored here (not passed on:
 * the command ignores it too), and the libc's own signals, which glibc's and
 * musl's posix_spawn leave ignored in the program they start (no caller can
 * ignore them itself), are the default again, as across fork and exec. */
static size_t to_forward(const struct sbx_header *h, const int *sigs, size_t n, int *out)
{
    size_t kept = 0;
    int keep = !(h->opts & SBX_OPT_RESET_SIGNALS);
    for (int sig = 32; keep && sig < 35 && sig < NSIG; sig++)
        ignored(sig, 1);
    for (size_t i = 0; i < n; i++)
        if (!keep || !ignored(sigs[i], 0))
            out[kept++] = sigs[i];
    return kept;
}

/* The failure in the backend's own words (csrc/core/messages.c). A command that
 * could not be exec'd exits like a shell's: 127 not found, 126 otherwise. */
static _Noreturn void report_failure(const struct sbx_result *res, const void *blob, size_t len, const char *cmd)
{
    if (report_fd >= 0) {
        report(res);
        exit(res->step != SBX_STEP_EXEC ? 125 : res->err == ENOENT ? 127 : 126);
    }
    size_t size = 2 * len + strlen(cmd) + 256;
    char *text = malloc(size);
    if (!text)
        die("setup failed at step %d: %s", res->step, sbx_strerror(res->err));
    sbx_format_error(res, blob, len, cmd, text, size);
    if (res->step != SBX_STEP_EXEC)
        die("%s", text);
    fprintf(stderr, "sandbox: %s\n", text);
    exit(res->err == ENOENT ? 127 : 126);
}

/* PR_SET_PDEATHSIG on the launcher itself. The signal comes only for a
 * parent that dies after the prctl: if the parent that exec'd us is gone
 * already, we were re-parented (to init or a subreaper), and we exit. */
static void die_with(pid_t parent)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        die("prctl(PR_SET_PDEATHSIG): %s", sbx_strerror(errno));
    if (getppid() != parent)
        kill(getpid(), SIGKILL);
}

int main(int argc, char **argv)
{
    pid_t parent = getppid(); /* first: the caller that exec'd us */
    int handoff = argc >= 2 && !strcmp(argv[1], "--handoff");
    take_ticket(handoff); /* out of the environment, before anything reads it */
    if (handoff) {
        argc -= 1;
        argv += 1;
    }
    int *pass = malloc(sizeof *pass * (size_t)argc), n_pass = 0;
    if (!pass)
        die("out of memory");
    int taken = handoff ? 0 : take_options(argc, argv, pass, &n_pass);
    if (taken) {
        argv[taken] = argv[0];
        argc -= taken;
        argv += taken;
    }
    if (argc < 5 || strcmp(argv[1], "--plan") || strcmp(argv[3], "--"))
        die("usage: %s [--handoff | [--report-fd N] [--pass-fd N]...] --plan BASE64 -- COMMAND [ARGS...]", argv[0]);
    if (handoff) {
        /* the caller's thread that forked us ends: so do we (and the
         * sandbox its process started for us, when our connection closes) */
        die_with(parent);
        try_handoff(argv + 4); /* returns only to fall back, the ticket wiped */
    }
    size_t len;
    void *blob = b64_decode(argv[2], &len);
    if (!blob || sbx_check_blob(blob, len) < 0)
        die("the plan given to %s is malformed", argv[0]);
    const struct sbx_header *h = blob;
    if (h->opts & SBX_OPT_DIE_WITH_PARENT)
        die_with(parent);
    int init_fd = (h->opts & SBX_OPT_REAPER) ? open_init() : -1;
    if ((h->opts & SBX_OPT_REAPER) && init_fd < 0)
        die("can't open sandbox-init next to %s: %s", argv[0], sbx_strerror(errno));

    static const int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGCONT, SIGWINCH};
    int sigs[sizeof forwarded / sizeof *forwarded];
    sbx_forward_signals(sigs, to_forward(h, forwarded, sizeof forwarded / sizeof *forwarded, sigs));
    struct sbx_plan_run run = {
        .blob = blob, .len = len, .argv = argv + 4, .envp = environ, .pass_fds = pass, .n_pass = n_pass, .init_fd = init_fd};
    struct sbx_result res;
    if (sbx_run_plan(&run, &res) < 0)
        report_failure(&res, blob, len, argv[4]);
    if (report_fd >= 0)
        report(&res);
    int status = sbx_wait_plan(&res);
    if (status == -1)
        die("waitpid: %s", sbx_strerror(errno));
    exit_like(status);
}
