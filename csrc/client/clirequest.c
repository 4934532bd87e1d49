/* clirequest.c: the connection and the request both clients of cliwire.h
 * share (see clirequest.h). */
#define _GNU_SOURCE
#include "clirequest.h"

#include "internal.h" /* sbx_peer_of */

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

int cli_connect(const char *path, int (*serves)(pid_t pid, int pidfd, void *arg), void *arg)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path)
        return -1;
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        int err = errno;
        close(fd);
        return err == ENOENT || err == ECONNREFUSED ? -2 : -1;
    }
    pid_t pid;
    int pidfd;
    int ok = sbx_peer_of(fd, &pid, &pidfd) == 0 && serves(pid, pidfd, arg);
    if (pidfd >= 0)
        close(pidfd);
    if (!ok) {
        close(fd);
        return -1;
    }
    return fd;
}

/* `s` with its NUL at `at` of `out` (NULL: only counted); the offset after it. */
static size_t add(char *out, size_t at, const char *s)
{
    size_t n = strlen(s) + 1;
    if (out)
        memcpy(out + at, s, n);
    return at + n;
}

/* The strings, "ARGV0\0" "CWD\0" argv[1..]\0 environ[i]\0, into `out` (NULL: only counted); their length. */
static size_t strings(char *out, int argc, char **argv, const char *cwd, uint32_t envc)
{
    size_t at = add(out, add(out, 0, argv[0]), cwd);
    for (int i = 1; i < argc; i++)
        at = add(out, at, argv[i]);
    for (uint32_t i = 0; i < envc; i++)
        at = add(out, at, environ[i]);
    return at;
}

char *cli_request(int argc, char **argv, const char *cwd, const struct stat *exe, const int *fds, int nfds,
                  uint32_t ticket, const uint8_t *secret, size_t max, size_t *size)
{
    struct sbx_cli_request h = {.magic = SBX_CLI_MAGIC, .version = SBX_CLI_VERSION, .argc = (uint32_t)argc,
                                .nfds = (uint32_t)nfds, .ticket = ticket};
    if (exe) {
        h.exe_dev = exe->st_dev;
        h.exe_ino = exe->st_ino;
        h.exe_mtime = (int64_t)exe->st_mtim.tv_sec * 1000000000LL + exe->st_mtim.tv_nsec;
    }
    for (int r = 0; r < SBX_CLI_N_RLIMITS; r++) { /* the plan's limits are clamped to them */
        struct rlimit lim;
        h.rlim_max[r] = getrlimit(r, &lim) == 0 ? (uint64_t)lim.rlim_max : (uint64_t)RLIM_INFINITY;
    }
    while (environ[h.envc])
        h.envc++;
    size_t at = strings(NULL, argc, argv, cwd, h.envc);
    size_t head = sizeof h + (size_t)nfds * sizeof(int32_t);
    if (at > UINT32_MAX || head + at > max)
        return NULL;
    h.size = (uint32_t)at;
    char *out = malloc(head + at);
    if (!out)
        return NULL;
    if (secret)
        memcpy(h.secret, secret, sizeof h.secret);
    memcpy(out, &h, sizeof h);
    explicit_bzero(h.secret, sizeof h.secret);
    for (int i = 0; i < nfds; i++) {
        int32_t v = fds[i];
        memcpy(out + sizeof h + (size_t)i * sizeof v, &v, sizeof v);
    }
    *size = head + strings(out + head, argc, argv, cwd, h.envc);
    return out;
}
