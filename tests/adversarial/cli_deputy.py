"""What the attacks on the CLI server as a deputy share (test_cli_deputy_*.py, issue 36).

A private installation of the client with a server of its own comes from
tests/integration/cli_helpers.py (the fixtures `install` and `served`); here:
a server started under a confinement of the test's choosing, the
confinements themselves (seccomp filters, no_new_privs, a Landlock domain,
applied in a child before it execs), and requests built as a process that
speaks the wire itself would build them.
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from cli_helpers import (  # noqa: E402, F401  (cli_install, cli_served: the fixtures `install`, `served`)
    BIN,
    SYSTEM,
    TIMEOUT,
    Installation,
    clean_env,
    cli_install,
    cli_served,
)

from sandbox._core import cliwire as wire  # noqa: E402

IS_ROOT = os.geteuid() == 0
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
NR_SOCKET = 41  # x86_64
AF_INET = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO_EPERM = 0x00050000 | 1


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def no_new_privs() -> None:
    """preexec: no_new_privs."""
    if _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def _install_filter(*insns: tuple[int, int, int, int]) -> None:
    program = (_SockFilter * len(insns))(*(_SockFilter(*i) for i in insns))
    prog = _SockFprog(len(insns), program)
    if not IS_ROOT:  # an unprivileged process needs it first; root's stays as it was (the server's may differ)
        no_new_privs()
    if _libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def allow_all_filter() -> None:
    """preexec: one seccomp filter that allows everything."""
    _install_filter((0x06, 0, 0, SECCOMP_RET_ALLOW))  # BPF_RET|BPF_K


def deny_inet_filter() -> None:
    """preexec: one seccomp filter that fails socket(AF_INET, ...) with EPERM, and allows the rest."""
    _install_filter(
        (0x20, 0, 0, 4),  # ld arch
        (0x15, 0, 5, AUDIT_ARCH_X86_64),  # jeq: on, else allow
        (0x20, 0, 0, 0),  # ld nr
        (0x15, 0, 3, NR_SOCKET),  # jeq socket: on, else allow
        (0x20, 0, 0, 16),  # ld args[0] (low half)
        (0x15, 0, 1, AF_INET),  # jeq AF_INET: on, else allow
        (0x06, 0, 0, SECCOMP_RET_ERRNO_EPERM),
        (0x06, 0, 0, SECCOMP_RET_ALLOW),
    )


def start_server(inst: Installation, preexec: Callable[[], None] | None = None) -> None:
    """Start the installation's server (as inst.start_server does) in a child confined by `preexec`."""
    inst.server = subprocess.Popen(
        [str(inst.root / "sandbox-py"), "serve", "--socket", inst.socket, "--client", inst.identity(), "--log",
         str(inst.log), "--idle", "60"],
        env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        preexec_fn=preexec)
    wait_for_socket(inst)


def wait_for_socket(inst: Installation) -> None:
    """Until the installation's server listens (the test fails if it exits first)."""
    assert inst.server is not None
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(inst.socket):
        assert inst.server.poll() is None, inst.server.communicate()[1]
        assert time.monotonic() < deadline, "the server did not listen"
        time.sleep(0.02)


def request(inst: Installation, argv: list[str], fds: tuple[int, ...] = (0, 1, 2)) -> bytes:
    """A request for `argv` (argv[0] first) as the shipped client would send it from cwd /, with
    the environment the installation's clients get (the server compares its PYTHON* variables)."""
    environ = [f"{k}={v}".encode() for k, v in clean_env().items()]
    args = [a.encode() for a in argv]
    strings = b"".join(s + b"\0" for s in (args[0], b"/", *args[1:], *environ))
    dev, ino, mtime = (int(v) for v in inst.identity().split(":"))
    head = wire.ffi.new("struct sbx_cli_request *", {
        "magic": wire.MAGIC, "version": wire.VERSION, "argc": len(args), "envc": len(environ), "nfds": len(fds),
        "size": len(strings), "exe_dev": dev, "exe_ino": ino, "exe_mtime": mtime,
        "rlim_max": [wire.RLIM_INFINITY] * wire.N_RLIMITS})
    return bytes(wire.ffi.buffer(head)) + struct.pack(f"{len(fds)}i", *fds) + strings
