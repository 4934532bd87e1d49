/* handoff.c: sandbox-launch's side of the handoff (see handoff.h). */
#define _GNU_SOURCE
#include "handoff.h"
#include "clirequest.h"
#include "exitlike.h"
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

static volatile int handoff_fd = -1;

/* This launch's ticket, from HANDOFF_ENV (take_ticket); wiped once used. */
static struct {
    int ok;
    uint32_t id;
    uint8_t secret[SBX_CLI_SECRET_SIZE];
    char path[sizeof ((struct sockaddr_un *)0)->sun_path];
} ticket;

static int hex_value(int ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

/* "ID:SECRET:PATH" into `ticket`; 1 if it is well-formed. */
static int parse_ticket(const char *s)
{
    uint64_t id = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9' && p - s < 10; p++)
        id = id * 10 + (uint64_t)(*p - '0');
    if (p == s || *p++ != ':' || id > UINT32_MAX)
        return 0;
    ticket.id = (uint32_t)id;
    for (size_t i = 0; i < SBX_CLI_SECRET_SIZE; i++, p += 2) {
        int hi = hex_value((unsigned char)p[0]), lo = hi < 0 ? -1 : hex_value((unsigned char)p[1]);
        if (lo < 0)
            return 0;
        ticket.secret[i] = (uint8_t)(hi << 4 | lo);
    }
    if (*p++ != ':' || *p != '/' || strlen(p) >= sizeof ticket.path)
        return 0;
    strcpy(ticket.path, p);
    return 1;
}

int take_ticket(int keep)
{
    size_t n = strlen(HANDOFF_ENV);
    int found = 0, ok = 0;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, HANDOFF_ENV, n) || (*e)[n] != '=')
            continue;
        char *value = *e + n + 1;
        if (!found && keep)
            ok = parse_ticket(value);
        found = 1;
        explicit_bzero(value, strlen(value)); /* what /proc/PID/environ shows, too */
    }
    if (found)
        unsetenv(HANDOFF_ENV);
    if (!ok)
        explicit_bzero(&ticket, sizeof ticket);
    ticket.ok = ok;
    return ok;
}

static const int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGCONT, SIGWINCH};

/* A signal for the command: one SIGNAL frame (send is async-signal-safe). */
static void relay(int sig)
{
    int saved = errno;
    struct sbx_cli_frame f = {SBX_CLI_SIGNAL, sig};
    if (handoff_fd >= 0)
        send(handoff_fd, &f, sizeof f, MSG_NOSIGNAL | MSG_DONTWAIT);
    errno = saved;
}

static void set_handlers(void (*handler)(int))
{
    struct sigaction sa = {0};
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++)
        sigaction(forwarded[i], &sa, NULL);
}

/* Whether the server is our parent. The peer is the process that listened:
 * a socket left behind by another process, or a caller that has died since
 * (we would have been reparented), is not used. */
static int is_parent(pid_t pid, int pidfd, void *arg)
{
    (void)pidfd, (void)arg;
    return pid == getppid();
}

static const int stdio_fds[3] = {0, 1, 2};

/* The request (cliwire.h): the command, our stdio, the ticket; no limit but the socket's. */
static char *build_request(const char *cwd, char **argv, size_t *size)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    return cli_request(argc, argv, cwd, NULL, stdio_fds, 3, ticket.id, ticket.secret, SIZE_MAX, size);
}

/* Wait for the server's answer; act on it, or return to fall back. */
static void await_answer(int fd)
{
    char buf[sizeof(struct sbx_cli_frame) + 4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < (ssize_t)sizeof(struct sbx_cli_frame))
            die("the process holding the sandbox's template closed the handoff before the command ended");
        struct sbx_cli_frame f;
        memcpy(&f, buf, sizeof f);
        buf[n] = 0;
        const char *text = buf + sizeof f;
        if (f.kind == SBX_CLI_STATUS)
            exit_like_returncode(f.value);
        if (f.kind == SBX_CLI_ERROR) {
            fprintf(stderr, "sandbox: %s\n", text);
            exit(f.value);
        }
        if (f.kind == SBX_CLI_FALLBACK)
            return;
    }
}

static void handoff(char **argv)
{
    /* stdio that is closed becomes /dev/null here, as the fallback's would
     * (and so the socket can't take fd 0, 1 or 2) */
    for (int i = 0; i < 3; i++)
        if (fcntl(i, F_GETFD) < 0 && open("/dev/null", O_RDWR) != i)
            return;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return;
    int fd = cli_connect(ticket.path, is_parent, NULL);
    if (fd < 0)
        return;
    size_t size;
    char *msg = build_request(cwd, argv, &size);
    int sent = msg ? sbx_send_fds(fd, msg, size, stdio_fds, 3) : -1;
    if (msg)
        explicit_bzero(msg, sizeof(struct sbx_cli_request));
    free(msg);
    if (sent < 0) {
        close(fd);
        return;
    }
    /* From here a signal for us is one for the command. One that comes
     * before this point kills the launcher, and the server kills the
     * sandbox when it sees the connection close. */
    handoff_fd = fd;
    set_handlers(relay);
    await_answer(fd);
    handoff_fd = -1;
    set_handlers(SIG_DFL);
    close(fd);
}

void try_handoff(char **argv)
{
    if (ticket.ok)
        handoff(argv);
    explicit_bzero(&ticket, sizeof ticket); /* the plan runs without it */
}
