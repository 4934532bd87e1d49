/* nsops.c: work inside a running sandbox's namespaces from the outside
 * (used when bwrap, not our own child, set the sandbox up).
 *
 * Entering a user namespace is refused to a multithreaded process, and an
 * unprivileged caller can only enter a network namespace through the user
 * namespace that owns it. So a short-lived child does it: cloned with
 * CLONE_VM|CLONE_VFORK (it runs on our memory while we wait) and CLONE_FILES
 * (the sockets it creates land in our fd table), it enters the namespaces,
 * makes the sockets and exits.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/netlink.h>

struct ns_job {
    int userns_fd, netns_fd;
    const uint32_t *ports;
    int n;
    int *out;      /* n listening sockets, then a NETLINK_ROUTE socket */
    int err;
};

static int listen_on(uint32_t port)
{
    int one = 1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(fd, 128) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

static int ns_child(void *arg)
{
    struct ns_job *job = arg;
    if ((job->userns_fd >= 0 && setns(job->userns_fd, CLONE_NEWUSER) < 0) || setns(job->netns_fd, CLONE_NEWNET) < 0) {
        job->err = errno;
        _exit(1);
    }
    for (int i = 0; i < job->n; i++) {
        job->out[i] = listen_on(job->ports[i]);
        if (job->out[i] < 0) {
            job->err = errno;
            _exit(1);
        }
    }
    job->out[job->n] = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_ROUTE) /* pyroute2 wants DGRAM */;
    job->err = job->out[job->n] < 0 ? errno : 0;
    _exit(job->err != 0);
}

int sbx_netns_sockets(int userns_fd, int netns_fd, const uint32_t *ports, int n, int *out)
{
    struct ns_job job = {userns_fd, netns_fd, ports, n, out, 0};
    for (int i = 0; i <= n; i++)
        out[i] = -1;
    pid_t pid = sbx_clone_vm(ns_child, &job, CLONE_FILES, 64 * 1024);
    int err = pid < 0 ? errno : 0;
    if (pid > 0) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        err = job.err;
    }
    if (err) {
        for (int i = 0; i <= n; i++)
            if (out[i] >= 0)
                close(out[i]);
        return -err;
    }
    return 0;
}

int sbx_exists_in_root(int root_fd, const char *path)
{
    /* resolved as the sandbox would: '..' and absolute links stay inside */
    int fd = sbx_openat2(root_fd, path, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
    if (fd < 0)
        return -errno;
    close(fd);
    return 0;
}
