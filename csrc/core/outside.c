/* outside.c: work on a running sandbox from the outside: the bwrap
 * backend's helpers (bwrap, not our own child, set that sandbox up).
 *
 * Entering a user namespace is refused to a multithreaded process, and an
 * unprivileged caller can only enter a network namespace through the user
 * namespace that owns it. So a short-lived child does it: cloned with
 * CLONE_VM|CLONE_VFORK (it runs on our memory while we wait) and CLONE_FILES
 * (the sockets it creates land in our fd table), it enters the namespaces,
 * makes the sockets and exits. Probe paths are looked up the same way, by a
 * process that enters the sandbox's mount and pid namespaces.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
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

static int ns_child(void *arg)
{
    struct ns_job *job = arg;
    if ((job->userns_fd >= 0 && setns(job->userns_fd, CLONE_NEWUSER) < 0) || setns(job->netns_fd, CLONE_NEWNET) < 0) {
        job->err = errno;
        _exit(1);
    }
    for (int i = 0; i < job->n; i++) {
        job->out[i] = sbx_listen_loopback((uint16_t)job->ports[i]);
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

struct probe_job {
    int userns_fd, mntns_fd, pidns_fd;
    const char *const *paths;
    int n;
    int *results;
    int err;
};

/* In the sandbox's pid namespace: resolve each path from the mount
 * namespace's root, as the native backend's setup child does inside. */
static int probe_grandchild(void *arg)
{
    struct probe_job *job = arg;
    for (int i = 0; i < job->n; i++)
        job->results[i] = sbx_path_exists(AT_FDCWD, job->paths[i], 0);
    _exit(0);
}

/* setns() into a pid namespace moves only the children made afterwards, so
 * the lookups run in a grandchild: /proc/self is then a process of the
 * sandbox's procfs, and /proc/self/root the sandbox's root (setns() into a
 * mount namespace sets root and cwd to its root). */
static int probe_child(void *arg)
{
    struct probe_job *job = arg;
    if ((job->userns_fd >= 0 && setns(job->userns_fd, CLONE_NEWUSER) < 0) || setns(job->mntns_fd, CLONE_NEWNS) < 0 ||
        (job->pidns_fd >= 0 && setns(job->pidns_fd, CLONE_NEWPID) < 0)) {
        job->err = errno;
        _exit(1);
    }
    pid_t pid = sbx_clone_vm(probe_grandchild, job, 0, 64 * 1024);
    if (pid < 0) {
        job->err = errno;
        _exit(1);
    }
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    _exit(0);
}

int sbx_probe_inside(int userns_fd, int mntns_fd, int pidns_fd, const char *const *paths, int n, int *results)
{
    struct probe_job job = {userns_fd, mntns_fd, pidns_fd, paths, n, results, 0};
    for (int i = 0; i < n; i++)
        results[i] = -ECHILD; /* not looked up: never taken for "absent" */
    pid_t pid = sbx_clone_vm(probe_child, &job, 0, 64 * 1024);
    if (pid < 0)
        return -errno;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return job.err ? -job.err : 0;
}
