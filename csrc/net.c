/* net.c: bring up lo in a fresh network namespace.
 *
 * A new network namespace holds only a loopback device, down. Setting
 * IFF_UP makes the kernel assign 127.0.0.1/8 and ::1 itself (the inet and
 * inet6 NETDEV_UP handlers), so one ioctl replaces the rtnetlink exchange
 * bwrap does.
 */
#include "internal.h"

#include <errno.h>
#include <net/if.h>
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
