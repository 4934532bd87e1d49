"""The namespace factory: the program a pool runs to make network namespaces.

Run as `python -I -S _factory_main.py FACTORY_MARKER <fd> <mode> <nice> <tcp hash>`
(see sandbox.netpool.factory), single threaded, stdlib only: it never
imports the sandbox package, so it can start without site-packages. It
speaks over the SOCK_SEQPACKET socket `fd`: it sends b"ready" (with the user
namespace fd in "userns" mode), then answers each b"new" with b"ok" and
[netns, rtnl, diag] fds, or b"error: ..." (and exits when its own state is
broken). EOF (the pool closed, or its process died) makes it exit. It never
runs anything else.

Per request it does unshare(CLONE_NEWNET), opens the new namespace's nsfs
file and a NETLINK_ROUTE and a NETLINK_SOCK_DIAG socket in it, and returns
to a private "home" namespace of its own, so no process stays inside pooled
namespaces. In "userns" mode it first unshare(CLONE_NEWUSER)s and maps the
caller's uid and gid to themselves, so every namespace it makes is owned by
that one user namespace.

The helpers (`call`, `write`, `unshare_userns`) are also what the tests use
to join a leased namespace the way a sandbox does.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
NETLINK_ROUTE, NETLINK_SOCK_DIAG = 0, 4
# Per-namespace counters a tenant can read and move: the IPv4 and IPv6 MIBs
# and every device's packet and byte counts (lo's, in a pooled namespace);
# and IPv6 flow labels, which linger (6 s and more) after their socket closed.
COUNTER_FILES = ("snmp", "netstat", "snmp6", "dev", "ip6_flowlabel")
# The namespace's socket counts (and some host-wide figures, ignored):
# what an unprivileged tenant's leftover sockets show without a sock_diag dump.
SOCKSTAT_FILES = ("sockstat", "sockstat6")

libc = ctypes.CDLL(None, use_errno=True)


def call(rc: int, what: str) -> None:
    """Raise OSError (with errno and `what`) unless a libc call returned 0."""
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, what + ": " + os.strerror(err))


def write(path: str, text: str) -> None:
    """Write `text` to a /proc file in one write(2), as the kernel wants for id maps."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def nsfd(kind: str) -> int:
    """An fd of this process's namespace of `kind` ("net", "user")."""
    return os.open("/proc/self/ns/" + kind, os.O_RDONLY | os.O_CLOEXEC)


def unshare_userns() -> None:
    """Enter a new user namespace that maps the caller's uid and gid to themselves.

    A process may write its own maps if they name only its own ids, and
    setgroups must be denied first for the gid map. After unshare the
    process holds every capability in the new namespace (none outside it),
    whatever its uid there; the identity map keeps a sandbox's own maps
    reading as they would without the pool ("1000 1000 1", not "1000 0 1").
    """
    uid, gid = os.geteuid(), os.getegid()
    call(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    write("/proc/self/setgroups", "deny")
    write("/proc/self/uid_map", f"{uid} {uid} 1")
    write("/proc/self/gid_map", f"{gid} {gid} 1")


def counter_fds() -> dict[str, int]:
    """Open this namespace's counter and sockstat files that exist (snmp6 and sockstat6 need IPv6)."""
    fds = {}
    for name in COUNTER_FILES + SOCKSTAT_FILES:
        try:
            fds[name] = os.open("/proc/self/net/" + name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            pass
    return fds


def make(chan: socket.socket, home: int) -> None:
    """Make one namespace, send its fds over `chan`, and go back `home`."""
    call(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    counters: dict[str, int] = {}
    try:
        net = nsfd("net")
        rtnl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
        diag = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
        counters = counter_fds()
    finally:
        call(libc.setns(home, CLONE_NEWNET), "setns(home network namespace)")
    try:
        msg = " ".join(["ok", *counters]).encode()
        socket.send_fds(chan, [msg], [net, rtnl.fileno(), diag.fileno(), *counters.values()])
    finally:
        os.close(net)
        rtnl.close()
        diag.close()
        for fd in counters.values():
            os.close(fd)


def main(argv: list[str]) -> int:
    """Serve namespace requests until EOF; argv as in the module docstring."""
    chan = socket.socket(fileno=int(argv[2]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is for the caller; EOF ends us
    try:
        os.nice(int(argv[4]))
        fds = []
        if argv[3] == "userns":
            unshare_userns()
            fds.append(nsfd("user"))
        call(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET) for the home namespace")
        home = nsfd("net")
    except OSError as e:
        chan.send(f"error: {e}".encode())
        return 1
    try:
        # Namespaces made from here get a TCP hash table of their own (Linux
        # 6.1+) instead of sharing the host's: sock_diag walks every bucket.
        write("/proc/sys/net/ipv4/tcp_child_ehash_entries", argv[5])
    except OSError:
        pass
    socket.send_fds(chan, [b"ready"], fds)
    for fd in fds:
        os.close(fd)
    while chan.recv(16):
        try:
            make(chan, home)
        except OSError as e:
            chan.send(f"error: {e}".encode())
            if "setns" in str(e):
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
