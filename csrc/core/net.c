/* net.c: bring up lo in a fresh network namespace, and listen on it.
 *
 * A new network namespace holds only a loopback device, down. Setting
 * IFF_UP makes the kernel assign 127.0.0.1/8 and ::1 itself (the inet and
 * inet6 NETDEV_UP handlers), so one ioctl replaces the rtnetlink exchange
 * bwrap does.
 */
#include "internal.h"

#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

void sbx_loopback_up(struct sbx_ctx *c)
{
    struct ifreq ifr = {0};
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        sbx_fail(c, SBX_STEP_LOOPBACK, -1, errno, SBX_D_NONE);
    sbx_stpcpy(ifr.ifr_name, "lo");
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
        sbx_fail(c, SBX_STEP_LOOPBACK, -1, errno, SBX_D_NONE);
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(fd, SIOCSIFFLAGS, &ifr) < 0)
        sbx_fail(c, SBX_STEP_LOOPBACK, -1, errno, SBX_D_NONE);
    close(fd);
}

/* Port forwarding: listening sockets on 127.0.0.1 inside the sandbox's
 * network namespace, handed to the caller (SCM_RIGHTS), which relays each
 * connection to its target on the host side. The sandbox never shares the
 * host's namespace, and no relay runs inside it. */
static void send_fd(struct sbx_ctx *c, int index, int fd)
{
    char byte = 0;
    if (sbx_send_fds(c->in.listen_to, &byte, 1, &fd, 1) < 0)
        sbx_fail(c, SBX_STEP_FORWARD, index, errno, SBX_D_NONE);
}

int sbx_listen_loopback(uint16_t port)
{
    int one = 1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port),
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

void sbx_make_listeners(struct sbx_ctx *c)
{
    const uint32_t *ports = (const void *)(c->in.blob + c->h->listen_off);
    for (uint32_t i = 0; i < c->h->n_listen; i++) {
        int fd = sbx_listen_loopback((uint16_t)ports[i]);
        if (fd < 0)
            sbx_fail(c, SBX_STEP_FORWARD, (int)i, errno, SBX_D_NONE);
        send_fd(c, (int)i, fd);
        close(fd);
    }
}
