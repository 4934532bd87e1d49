/* cliclient.c: the installed `sandbox` command (and `bwrap`, when installed
 * under that name): a small static client that hands `run` command lines
 * to the per-user CLI server (sandbox/cliserver/), which keeps the Python
 * side warm, and otherwise runs the Python CLI directly (it execs the
 * `sandbox-py` script installed beside it). docs/cli.md describes it.
 *
 * For most command lines the server answers with the compiled plan, and
 * this process starts the sandbox itself, as its own child (cliplan.c);
 * for the others (status and sync fds, ...) a worker of the server runs
 * the Python CLI for it, and this process relays signals and the status.
 *
 * It hands off only what the server can run exactly as the Python CLI
 * would here: the server checks this process (ids, capabilities,
 * namespaces, seccomp, no_new_privs, LSM label, cgroup, root) against its
 * own and answers FALLBACK when they differ; this client checks the server
 * the same way before it sends it anything (a process that took the
 * socket's place would otherwise get our fds). A worker also asks us to
 * prove that no Landlock domain confines us (CHALLENGE: we read its
 * /proc/PID/fd, which a domain may not). The wire is csrc/client/cliwire.h; the
 * checks are clipeer.c.
 */
#include "cliclient.h"
#include "internal.h" /* sbx_send_fds, sbx_recv_fds */

_Static_assert(SBX_CLI_MAX_FDS <= SBX_MAX_FDS_PER_MESSAGE, "every fd of a request fits one message");
#include "errtext.h"
#include "exitlike.h"

#include <dirent.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SBX_VERSION /* setup.py defines both from sandbox/__init__.py and sandbox/bwrap/__init__.py */
#define SBX_VERSION "unknown"
#endif
#ifndef SBX_BWRAP_RELEASE
#define SBX_BWRAP_RELEASE "unknown"
#endif

extern char **environ;

static volatile int conn_fd = -1;
static volatile sig_atomic_t came[NSIG]; /* signals relayed to the server (a plan's run acts on them itself) */
static int as_bwrap;     /* invoked under the name bwrap */
static char exe_dir[PATH_MAX];

/* --------------------------------------------------------------- direct */

/* Run the command line with the Python CLI, `sandbox-py` beside this
 * executable (its shebang names the interpreter it was installed for). */
static _Noreturn void direct(int argc, char **argv)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/sandbox-py", exe_dir);
    char **args = calloc((size_t)argc + 4, sizeof *args);
    if (!args)
        exit(as_bwrap ? 1 : 125);
    int n = 0;
    args[n++] = path;
    if (as_bwrap) { /* the Python CLI speaks as bwrap, naming argv[0] in its help */
        args[n++] = "--as-bwrap";
        args[n++] = argv[0];
    }
    for (int i = 1; i < argc; i++)
        args[n++] = argv[i];
    execv(path, args);
    fprintf(stderr, "%s: can't run %s: %s\n", as_bwrap ? "bwrap" : "sandbox", path, sbx_strerror(errno));
    exit(as_bwrap ? 1 : 125);
}

/* --------------------------------------------------------------- the server */

/* Start the server for `sock` in the background, in a session of its own,
 * reparented away from us (a double fork), and do not wait for it. Its
 * warming up (importing and preparing everything) would compete for the
 * CPUs with this command line, which we run directly: it is given our
 * pidfd (`--after 3`), and warms up once we are gone (or after a while). */
static void start_server(const char *sock, const struct stat *exe)
{
    int self = (int)syscall(SYS_pidfd_open, getpid(), 0); /* close-on-exec: the direct run drops it */
    if (self >= 0 && self < 3) { /* 0-2 become /dev/null below */
        int high = fcntl(self, F_DUPFD_CLOEXEC, 3);
        close(self);
        self = high;
    }
    pid_t pid = fork();
    if (pid != 0) {
        if (self >= 0)
            close(self);
        while (pid > 0 && waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        return;
    }
    if (setsid() < 0 || fork() != 0)
        _exit(0);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int i = 0; i < 3 && null >= 0; i++)
        dup2(null, i);
    /* at 3, open across the exec (a dup2 onto another number clears close-on-exec) */
    if (self >= 0 && (self == 3 ? fcntl(3, F_SETFD, 0) : dup2(self, 3)) < 0)
        self = -1;
    syscall(SYS_close_range, self < 0 ? 3 : 4, ~0U, 0);
    char path[PATH_MAX + 16], id[96], log[PATH_MAX];
    snprintf(path, sizeof path, "%s/sandbox-py", exe_dir);
    snprintf(log, sizeof log, "%.*s.log", (int)(strlen(sock) - 5), sock); /* beside the socket: why a client ran directly */
    snprintf(id, sizeof id, "%llu:%llu:%lld", (unsigned long long)exe->st_dev, (unsigned long long)exe->st_ino,
             (long long)exe->st_mtim.tv_sec * 1000000000LL + exe->st_mtim.tv_nsec);
    unsetenv(CLI_SERVER_ENV);
    char *args[] = {path, "serve", "--socket", (char *)sock, "--client", id, "--log", log, "--after", "3", NULL};
    if (self < 0)
        args[8] = NULL;
    execv(path, args);
    _exit(127);
}

/* --------------------------------------------------------------- handing off */

static void relay(int sig)
{
    int saved = errno;
    struct sbx_cli_frame f = {SBX_CLI_SIGNAL, sig};
    if (sig > 0 && sig < NSIG)
        came[sig] = 1;
    if (conn_fd >= 0)
        send(conn_fd, &f, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
    errno = saved;
}

/* The signals the Python CLI reacts to (forwards, or dies of): while the
 * server runs the command, they are passed on to its process there. */
static const int relayed[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGWINCH, SIGCONT};

static void set_relay(void (*handler)(int))
{
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof relayed / sizeof *relayed; i++) {
        struct sigaction old;
        /* a signal the caller left ignored stays ignored, as it would for the Python CLI */
        if (sigaction(relayed[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(relayed[i], &sa, NULL);
    }
}

/* An fd of ours at 3 or above (close-on-exec), so that it never stands in for
 * a closed stdio fd of the command's. */
static int above_stdio(int fd)
{
    if (fd < 0 || fd > 2)
        return fd;
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    return high;
}

/* One message from the server into `buf`, with the one fd it may carry in
 * `*fd` (else -1); its length, -2 if it was longer than `size` or carried
 * more than one fd (every fd it carried closed then). */
static ssize_t receive(int sock, char *buf, size_t size, int *fd)
{
    int fds[2], n_fds, truncated;
    ssize_t n = sbx_recv_fds(sock, buf, size, fds, 2, &n_fds, &truncated);
    if (n < 0 && errno == ECONNRESET) /* the server closed with something of ours unread; what it sent comes still */
        n = sbx_recv_fds(sock, buf, size, fds, 2, &n_fds, &truncated);
    if (n >= 0 && (truncated || n_fds > 1)) {
        for (int i = 0; i < n_fds; i++)
            close(fds[i]);
        *fd = -1;
        return -2;
    }
    *fd = above_stdio(n_fds ? fds[0] : -1);
    return n;
}

/* The server's answer: a plan to run here (which never returns), or a
 * worker's frames until its status, or FALLBACK (which returns: nothing of
 * the request was used). `fds`: the fd numbers the request listed. */
static void converse(int sock, pid_t parent, const int *fds, int nfds)
{
    static char msg[SBX_CLI_MAX_ANSWER + 1];
    const char *who = as_bwrap ? "bwrap" : "sandbox";
    for (int first = 1;; first = 0) {
        int fd;
        ssize_t n = receive(sock, msg, sizeof msg, &fd);
        if (n == -2) { /* never run: the request may have been used, so no direct run either */
            fprintf(stderr, "%s: the sandbox CLI server's answer is too large or carries too many fds\n", who);
            exit(as_bwrap ? 1 : 125);
        }
        struct sbx_cli_frame f = {0, 0};
        if (n >= (ssize_t)sizeof f)
            memcpy(&f, msg, sizeof f);
        if (first && f.kind == SBX_CLI_PLAN) {
            conn_fd = -1;
            close(sock);
            run_answer(msg, (size_t)n, fd, fds, nfds, parent, as_bwrap, came);
        }
        if (fd >= 0)
            close(fd);
        if (n != (ssize_t)sizeof f) {
            fprintf(stderr, "%s: the sandbox CLI server ended before the command did\n", who);
            exit(as_bwrap ? 1 : 125);
        }
        if (f.kind == SBX_CLI_CHALLENGE) {
            prove(sock, (pid_t)f.value);
            continue;
        }
        if (f.kind == SBX_CLI_STATUS)
            exit_like_returncode(f.value);
        if (f.kind == SBX_CLI_FALLBACK)
            return;
        if (f.kind == SBX_CLI_DIE_WITH_PARENT) {
            /* as bwrap's own prctl: the signal comes only for a parent that
             * dies after it; a parent gone already means we were reparented */
            int ok = prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) == 0 && getppid() == parent;
            struct sbx_cli_frame ack = {SBX_CLI_ACK, ok};
            send(sock, &ack, sizeof ack, MSG_NOSIGNAL);
        }
    }
}

/* Hand the command line over; returns only to run it directly. */
static void hand_off(int argc, char **argv, pid_t parent)
{
    const char *disabled = getenv(CLI_SERVER_ENV);
    if (disabled && !strcmp(disabled, "0"))
        return;
    for (char **e = environ; *e; e++) /* the package's own settings are read by the process they are set in */
        if (!strncmp(*e, "SANDBOX_", 8) && strncmp(*e, CLI_SERVER_ENV "=", sizeof CLI_SERVER_ENV))
            return;
    struct stat exe;
    char sock[PATH_MAX];
    if (stat("/proc/self/exe", &exe) < 0 || socket_path(exe_dir, sock, sizeof sock) < 0)
        return;
    int fd = connect_server(sock);
    if (fd == -2) { /* nobody serves it: one starts for the next command */
        start_server(sock, &exe);
        return;
    }
    if ((fd = above_stdio(fd)) < 0)
        return;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
        close(fd);
        return;
    }
    size_t size;
    int nfds;
    int fds[SBX_CLI_MAX_FDS];
    char *msg = build_request(argc, argv, cwd, &exe, fd, fds, &nfds, &size);
    if (!msg) {
        close(fd);
        return;
    }
    /* From the send on, a signal for us is one for the command: one that
     * came before is held until the relay is in place. */
    sigset_t all, old;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &old);
    /* the mask the command would inherit is the one from before (the worker may read
     * /proc/PID/status before the relay is in place and the mask restored) */
    uint64_t mask = 0;
    for (int sig = 1; sig <= 64; sig++)
        if (sigismember(&old, sig) == 1)
            mask |= 1ULL << (sig - 1);
    memcpy(msg + offsetof(struct sbx_cli_request, sigmask), &mask, sizeof mask);
    int sent = sbx_send_fds(fd, msg, size, fds, nfds);
    free(msg);
    if (sent < 0) {
        sigprocmask(SIG_SETMASK, &old, NULL);
        close(fd);
        return;
    }
    conn_fd = fd;
    set_relay(relay);
    sigprocmask(SIG_SETMASK, &old, NULL);
    converse(fd, parent, fds, nfds);
    conn_fd = -1; /* FALLBACK: nothing of ours was used */
    close(fd);
    set_relay(SIG_DFL);
}

/* --------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    pid_t parent = getppid(); /* first: the caller that exec'd us */
    const char *base = strrchr(argv[0], '/');
    as_bwrap = !strcmp(base ? base + 1 : argv[0], "bwrap");
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        fprintf(stderr, "%s: can't read /proc/self/exe: %s\n", as_bwrap ? "bwrap" : "sandbox", sbx_strerror(errno));
        return as_bwrap ? 1 : 125;
    }
    self[n] = 0;
    *strrchr(self, '/') = 0;
    strcpy(exe_dir, self);

    /* --version is answered here, as the Python CLI would (cli.version_text) */
    char **args = argv + 1;
    if (!as_bwrap && args[0] && !strcmp(args[0], "run"))
        args++;
    if (args[0] && (!strcmp(args[0], "--version") || (!as_bwrap && args == argv + 1 && !strcmp(args[0], "-V")))) {
        if (!as_bwrap)
            printf("sandbox %s\n", SBX_VERSION);
        else if (isatty(1))
            printf("bubblewrap %s\n(sandbox %s: bubblewrap %s's command line, run by the sandbox package, not by "
                   "bubblewrap)\n", SBX_BWRAP_RELEASE, SBX_VERSION, SBX_BWRAP_RELEASE);
        else
            printf("bubblewrap %s\n", SBX_BWRAP_RELEASE);
        return fflush(stdout) == 0 ? 0 : (as_bwrap ? 1 : 125);
    }
    if (as_bwrap || (argc > 1 && !strcmp(argv[1], "run")))
        hand_off(argc, argv, parent);
    direct(argc, argv);
}
