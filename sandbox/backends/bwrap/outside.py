"""Work done on a bwrap sandbox from outside while bwrap waits after setup:
probe paths proven absent, the network namespace inspected, forwarded ports'
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
    from ... import forward, isolation
    from ..._native import ffi, lib

    try:
        for path in plan.probe_paths:
            _probe_absent(ffi, lib, child, path)
        if not (plan.forward or plan.check_network):
            return _Isolated(isolation.findings(plan, None))
        sockets = _netns_sockets(ffi, lib, child, [port for port, _ in plan.forward])
        netlink = sockets.pop()
        try:
            from pyroute2 import IPRoute

            with IPRoute(fileno=netlink) as ipr:
                network = isolation.check_netns(ipr)
        finally:
            _close(netlink)
        relay = forward.Forwarder([socket.socket(fileno=fd) for fd in sockets], [t for _, t in plan.forward])
        return _Isolated(isolation.findings(plan, network), relay)
    except BaseException:
        # the sandbox child first: it must not go on to read a closed seccomp pipe (and complain)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        popen.kill()
        popen.wait()
        raise


def _probe_absent(ffi: Any, lib: Any, child: int, path: str) -> None:
    root = os.open(f"/proc/{child}/root", os.O_PATH | os.O_CLOEXEC)
    try:
        rc = lib.sbx_exists_in_root(root, path.encode())
    finally:
        os.close(root)
    if rc == 0:
        raise IsolationError(f"isolation check failed: probe path {path} is visible inside the sandbox",
                             path=path, errno=E.EEXIST)
    if rc not in (-E.ENOENT, -E.ENOTDIR):
        raise IsolationError(f"isolation check failed: probe path {path} cannot be proven absent "
                             f"({os.strerror(-rc)})", path=path, errno=-rc)


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
