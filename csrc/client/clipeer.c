/* clipeer.c: the CLI client's socket, its check of the server at the other
 * end, and its request (see cliclient.c, cliwire.h).
 *
 * A process that can bind the socket's name gets every fd, argument and
 * variable of the commands handed to it. The directory is ours and 0700,
 * but a sandbox of ours may see it (a `--bind / /`), and a process confined
 * in other ways (seccomp, Landlock under no_new_privs, another LSM label or
 * cgroup) may run as our uid in our namespaces: so the server must be
 * exactly as confined as we are, read from its /proc entry, named by the
 * pidfd the kernel gives for the connection's peer (SO_PEERPIDFD) so that a
 * recycled pid cannot stand in for it.
 */
#include "cliclient.h"
#include "clirequest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>



/* ------------------------------------------------------------------ the socket */

static int own_dir(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid() && (st.st_mode & 0777) == 0700;
}

int socket_path(const char *exe_dir, char *out, size_t size)
{
    char dir[128], base[64];
    snprintf(base, sizeof base, "/run/user/%u", (unsigned)getuid());
    if (own_dir(base))
        snprintf(dir, sizeof dir, "%s/sandbox-cli", base);
    else if (getuid() == 0) /* never in the shared /tmp: a sandbox given a bind of it would reach root's files */
        snprintf(dir, sizeof dir, "/run/sandbox-cli-0");
    else
        snprintf(dir, sizeof dir, "/tmp/sandbox-cli-%u", (unsigned)getuid());
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -1;
    if (!own_dir(dir)) /* someone else's, or a link: never used */
        return -1;
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a of the installation's directory */
    for (const char *p = exe_dir; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ULL;
    int n = snprintf(out, size, "%s/cli-%016llx.sock", dir, (unsigned long long)h);
    return n > 0 && (size_t)n < size && (size_t)n < sizeof ((struct sockaddr_un *)0)->sun_path ? 0 : -1;
}

/* ------------------------------------------------------------------ the peer */

static size_t append_file(char *out, size_t at, size_t size, const char *path, int status_only)
{
    static const char *const keys[] = {"Uid:", "Gid:", "Groups:", "CapInh:", "CapPrm:", "CapEff:", "CapBnd:",
                                       "CapAmb:", "NoNewPrivs:", "TracerPid:", "Seccomp:", "Seccomp_filters:",
                                       NULL};
    char buf[8192];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    if (fd >= 0)
        close(fd);
    if (n < 0) { /* an LSM-less kernel has no attr/current: the same for both sides */
        at += (size_t)snprintf(out + at, size - at, "%s:-%d\n", path + 6 + strcspn(path + 6, "/"), errno);
        return at < size ? at : size;
    }
    buf[n] = 0;
    for (char *line = buf, *next; line && *line && at < size; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = 0;
        int keep = !status_only;
        for (const char *const *k = keys; status_only && *k; k++)
            keep |= !strncmp(line, *k, strlen(*k));
        if (keep)
            at += (size_t)snprintf(out + at, size - at, "%s\n", line);
    }
    return at < size ? at : size;
}

/* What must be equal between us and the server: ids, capabilities,
 * no_new_privs, tracer (a traced client's tracer would not see the
 * sandbox's start), seccomp, namespaces, LSM label, cgroup, root. */
static int fingerprint(const char *proc, char *out, size_t size)
{
    static const char *const ns[] = {"cgroup", "ipc", "mnt", "net", "pid", "pid_for_children", "time",
                                     "time_for_children", "user", "uts", NULL};
    char path[128];
    size_t at = 0;
    snprintf(path, sizeof path, "%s/status", proc);
    at = append_file(out, at, size, path, 1);
    for (const char *const *name = ns; *name && at < size; name++) {
        char link[128];
        snprintf(path, sizeof path, "%s/ns/%s", proc, *name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n < 0)
            return -1;
        link[n] = 0;
        at += (size_t)snprintf(out + at, size - at, "%s\n", link);
    }
    snprintf(path, sizeof path, "%s/attr/current", proc);
    at = append_file(out, at, size, path, 0);
    snprintf(path, sizeof path, "%s/cgroup", proc);
    at = append_file(out, at, size, path, 0);
    struct stat st;
    snprintf(path, sizeof path, "%s/root", proc);
    if (stat(path, &st) < 0 || at >= size)
        return -1;
    at += (size_t)snprintf(out + at, size - at, "root %llu:%llu\n", (unsigned long long)st.st_dev,
                           (unsigned long long)st.st_ino);
    return at < size - 1 ? 0 : -1;
}

static int same_confinement(pid_t pid, int pidfd)
{
    static char ours[16384], theirs[16384];
    char proc[32];
    snprintf(proc, sizeof proc, "/proc/%d", (int)pid);
    if (fingerprint("/proc/self", ours, sizeof ours) < 0 || fingerprint(proc, theirs, sizeof theirs) < 0)
        return 0;
    /* alive after the reads: the pid named the pidfd's process all along */
    if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) < 0)
        return 0;
    return !strcmp(ours, theirs);
}

static int serves_as_we_are(pid_t pid, int pidfd, void *arg)
{
    (void)arg;
    return same_confinement(pid, pidfd);
}

int connect_server(const char *path)
{
    return cli_connect(path, serves_as_we_are, NULL);
}

/* A worker's CHALLENGE: the link of its fd named SBX_CLI_PROOF_PREFIX...,
 * read from /proc/PID/fd (which needs ptrace access to it: Landlock refuses
 * that to a process whose domain does not confine the worker too), sent
 * back as PROOF. What cannot be read is answered with an empty proof. */
void prove(int sock, pid_t pid)
{
    struct {
        struct sbx_cli_frame f;
        char text[SBX_CLI_MAX_PROOF];
    } msg = {{SBX_CLI_PROOF, 0}, {0}};
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));) {
        ssize_t n = readlinkat(dirfd(d), e->d_name, msg.text, sizeof msg.text);
        if (n > 0 && n < (ssize_t)sizeof msg.text && !strncmp(msg.text, SBX_CLI_PROOF_PREFIX,
                                                             strlen(SBX_CLI_PROOF_PREFIX))) {
            msg.f.value = (int32_t)n;
            break;
        }
    }
    if (d)
        closedir(d);
    send(sock, &msg, sizeof msg.f + (size_t)msg.f.value, MSG_NOSIGNAL);
}

/* ------------------------------------------------------------------ the request */

static int open_fds(int conn, int *fds)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        int fd = atoi(e->d_name);
        if (fd == conn || fd == dirfd(d))
            continue;
        if (n == SBX_CLI_MAX_FDS) {
            n = -1;
            break;
        }
        fds[n++] = fd;
    }
    closedir(d);
    return n;
}

char *build_request(int argc, char **argv, const char *cwd, const struct stat *exe, int conn, int *fds, int *nfds,
                    size_t *size)
{
    *nfds = open_fds(conn, fds);
    if (*nfds < 0)
        return NULL;
    return cli_request(argc, argv, cwd, exe, fds, *nfds, 0, NULL, SBX_CLI_MAX_REQUEST, size);
}
