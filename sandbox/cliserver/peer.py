"""What the server checks of a client before it runs anything for it.

A command handed to the server runs as the server's child: with the
server's ids, capabilities, namespaces, seccomp filters, no_new_privs,
LSM label, cgroup and root. So the server takes a request only from a
client whose /proc entry shows all of those equal to its own (`Peer.check`);
anything it cannot read, or any difference, and the client runs the
command line itself. A client inside a sandbox differs at least in its
mount namespace; one under a seccomp filter, no_new_privs (as Landlock
requires) or another LSM label differs there; a traced one (strace, gdb)
has a tracer, which would not see the sandbox start from the server. The pid read from the socket
(SO_PEERCRED) is confirmed through the peer's pidfd (SO_PEERPIDFD) after
the reads: a live process keeps its pid, so the entry read was the peer's.

A worker acts for the client with the server's confinement, and equal
fields are not equal confinement: /proc shows how many seccomp filters a
process has, not what they refuse, and no Landlock domain at all. So the
worker path asks more (`Peer.check_for_worker`): no seccomp filter and no
no_new_privs (which an unprivileged process needs before it can apply
either); and the client proves that no Landlock domain confines it
(spare.py's challenge: a domain is refused ptrace access to a process
outside it, which reading the worker's /proc/PID/fd needs). SECURITY.md
has the whole argument.

What a child can be given of the client's own (its rlimits, umask, nice
value, scheduling policy, I/O priority, CPU affinity, OOM score, signal
mask and ignored signals) is not compared here: the worker takes it on
(sandbox/cliserver/worker.py), or hands the command line back when it
cannot.
"""

from __future__ import annotations

import os
import time

from .._core.peer import Peer as _Peer
from .._core.peer import Unverified, read_proc, status_fields

__all__ = ["Peer", "Unverified", "controlling_tty", "fingerprint", "own", "remember_own", "status_fields"]

STATUS_KEYS = ("Uid:", "Gid:", "Groups:", "CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:", "NoNewPrivs:",
               "TracerPid:", "Seccomp:", "Seccomp_filters:")
NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "pid_for_children", "time", "time_for_children", "user", "uts")


def fingerprint(proc: str) -> tuple[str, ...]:
    """What must be equal between client and server, read from `proc` (/proc/self or /proc/PID)
    through one fd of that directory (a pid reused meanwhile is another directory: its reads fail)."""
    d = os.open(proc, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        status = tuple(line for line in read_proc(d, "status").splitlines() if line.startswith(STATUS_KEYS))
        ns = tuple(os.readlink(f"ns/{name}", dir_fd=d) for name in NAMESPACES)
        try:
            label = read_proc(d, "attr/current")
        except OSError as exc:  # no LSM: the same error for both sides
            label = f"-{exc.errno}"
        cgroup = read_proc(d, "cgroup")
        root = os.stat("root", dir_fd=d)
    finally:
        os.close(d)
    return (*status, *ns, label, cgroup, f"root {root.st_dev}:{root.st_ino}")


_own: tuple[str, ...] | None = None
OWN_FOR = 1.0  # seconds a long-lived process's own fingerprint is trusted before it is read again
_own_read: tuple[float, tuple[str, ...]] | None = None


def remember_own() -> None:
    """Read this process's fingerprint now (a spare, before its client comes: nothing of it changes)."""
    global _own
    _own = fingerprint("/proc/self")


def own() -> tuple[str, ...]:
    """This process's fingerprint: as remembered, else read at most OWN_FOR seconds ago (the
    server: something may move it to another cgroup, say, while it serves)."""
    global _own_read
    if _own is not None:
        return _own
    now = time.monotonic()
    if _own_read is None or now - _own_read[0] > OWN_FOR:
        _own_read = (now, fingerprint("/proc/self"))
    return _own_read[1]


def controlling_tty(pid: int) -> int:
    """The tty_nr of `pid` (0: no controlling terminal)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2:].split()[4])


class Peer(_Peer):
    """The client at the other end of a connection, with what the CLI server asks of it beyond
    _core.peer's owner check."""

    def check(self, allow_tty: bool = False) -> None:
        """Unverified unless the peer is our uid and confined exactly as this process is, and
        (unless `allow_tty`) has no controlling terminal."""
        self.check_owner()
        try:
            theirs = fingerprint(f"/proc/{self.pid}")
            ours = own()
            tty = controlling_tty(self.pid)
            self.confirm()
        except OSError as exc:
            raise Unverified(f"the client's /proc entry cannot be read ({exc})") from None
        if theirs != ours:
            diff = next(f"{a!r} (server: {b!r})" for a, b in zip(theirs, ours, strict=True) if a != b)
            raise Unverified(f"the client is confined otherwise: {diff}")
        if tty and not allow_tty:  # the command would be in the client's session, with its terminal: only a
            raise Unverified("the client has a controlling terminal")  # run of the client's own can be

    def check_for_worker(self) -> None:
        """Unverified unless a worker may act for the peer as far as /proc can tell: no seccomp
        filter (the filters cannot be compared, only counted) and no no_new_privs (which a Landlock
        domain or a filter of an unprivileged process needs; the worker's exec would drop it too).
        A Landlock domain /proc does not show: the spare asks the client for its proof."""
        try:
            d = self.open_proc()
            try:
                fields = status_fields(d)
            finally:
                os.close(d)
        except OSError as exc:
            raise Unverified(f"the client's /proc entry cannot be read ({exc})") from None
        if fields.get("Seccomp", "").strip() != "0" or fields.get("Seccomp_filters", "0").strip() != "0":
            raise Unverified("the client runs under a seccomp filter, which a worker cannot prove it has")
        if fields.get("NoNewPrivs", "").strip() != "0":
            raise Unverified("the client has no_new_privs (it may be under a Landlock domain a worker would not have)")
