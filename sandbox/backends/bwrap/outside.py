"""Work done on a bwrap sandbox from outside while bwrap waits after setup:
probe paths proven absent (looked up from inside its namespaces), the network namespace inspected, forwarded ports'
listeners made inside it."""

from __future__ import annotations

import contextlib
import errno as E
import fcntl
import os
import signal
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

from ...errors import IsolationError, SetupError
from ...netpool.rtnetlink import NS_GET_USERNS
from ...plan import Plan
from .procfs import _close


@dataclass
class _Isolated:
    """What was checked in a bwrap sandbox, and its port relay (closed at exit)."""

    findings: dict[str, Any]
    relay: Any = None

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()


def _isolate(plan: Plan, popen: subprocess.Popen[bytes], child: int) -> _Isolated:
    """While bwrap waits after setup: prove the probe paths absent inside,
    inspect the network namespace, make the forwarded ports' listeners in it.
    Any finding kills bwrap (the command never runs) and raises."""
    # lazy: a check, ports or probe paths only (1.7 ms); and this executor runs without the C core
    from ... import forward, isolation
    from ..._native import ffi, lib

    try:
        if plan.probe_paths:
            _probe_absent(ffi, lib, child, plan.probe_paths)
        if not (plan.forward or plan.check_network):
            return _Isolated(isolation.findings(plan, None))
        sockets = _netns_sockets(ffi, lib, child, [port for port, _ in plan.forward])
        netlink = sockets.pop()
        try:
            from pyroute2 import IPRoute

            ipr = IPRoute(fileno=netlink)
        except BaseException:
            _close(netlink)
            raise
        # IPRoute owns the fd now and closes it: closing it again here would close
        # whatever another thread opened under that number meanwhile
        with ipr:
            network = isolation.check_netns(ipr)
        relay = forward.Forwarder([socket.socket(fileno=fd) for fd in sockets], [t for _, t in plan.forward],
                                  plan.forward_writable)
        return _Isolated(isolation.findings(plan, network), relay)
    except BaseException:
        # the sandbox child first: it must not go on to read a closed seccomp pipe (and complain)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        popen.kill()
        popen.wait()
        raise


def _probe_absent(ffi: Any, lib: Any, child: int, paths: tuple[str, ...]) -> None:
    """Prove each probe path absent inside, looked up by a process in the
    sandbox's mount and pid namespaces (so /proc/self, /proc/1/root and every
    link resolve as for the sandbox's processes, as in the native backend's
    check); any answer but "no such file" raises."""
    fds: list[int] = []
    try:
        mntns = os.open(f"/proc/{child}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        fds.append(mntns)
        pidns = -1  # without a pid namespace of its own, the sandbox's is ours: nothing to enter
        if not _same_file(f"/proc/{child}/ns/pid", "/proc/self/ns/pid"):
            pidns = os.open(f"/proc/{child}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            fds.append(pidns)
        # entering a mount namespace needs CAP_SYS_ADMIN over it: through its owner unless we are root
        owner = fcntl.ioctl(mntns, NS_GET_USERNS) if os.geteuid() != 0 else -1
        if owner >= 0:
            fds.append(owner)
        encoded = [ffi.new("char[]", os.fsencode(p)) for p in paths]
        results = ffi.new("int[]", len(paths))
        rc = lib.sbx_probe_inside(owner, mntns, pidns, ffi.new("char *[]", encoded), len(paths), results)
    finally:
        for fd in fds:
            _close(fd)
    for i, path in enumerate(paths):
        err = -rc if rc < 0 else -results[i]
        if err == 0:
            raise IsolationError(f"isolation check failed: probe path {path} is visible inside the sandbox",
                                 path=path, errno=E.EEXIST)
        if err not in (E.ENOENT, E.ENOTDIR):
            raise IsolationError(f"isolation check failed: probe path {path} cannot be proven absent "
                                 f"({os.strerror(err)})", path=path, errno=err)


def _same_file(a: str, b: str) -> bool:
    sa, sb = os.stat(a), os.stat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _netns_sockets(ffi: Any, lib: Any, child: int, ports: list[int]) -> list[int]:
    """Listening sockets for `ports` and a netlink socket, made inside the
    sandbox's network namespace (entered through its owning user namespace
    when we are not root)."""
    netns = os.open(f"/proc/{child}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    owner = -1
    try:
        if os.geteuid() != 0:
            owner = fcntl.ioctl(netns, NS_GET_USERNS)
        out = ffi.new("int[]", len(ports) + 1)
        rc = lib.sbx_netns_sockets(owner, netns, ffi.new("uint32_t[]", ports or [0]), len(ports), out)
    finally:
        os.close(netns)
        if owner >= 0:
            os.close(owner)
    if rc < 0:
        raise SetupError(f"Can't listen on a forwarded port in the sandbox: {os.strerror(-rc)}", step="forward",
                         errno=-rc, backend="bwrap")
    return list(out)
