"""Attack: a command of a recycled Template sandbox reaches for the processes that outlive it.

A recycled sandbox's pid 1 (csrc/template/template_recycle.c) keeps the server's
capabilities over the sandbox, and its command maker (csrc/template/template_maker.c)
outlives every command it makes. The command must hold no pidfd (nor any fd
of theirs) and be unable to take one: it lists its own fds (a pidfd's fdinfo
names a "Pid:"), reads and opens each of every other process's
/proc/<pid>/fd/<n> (a command whose uid is their owner's may list the
numbers, nothing more), and calls pidfd_getfd on each fd number of every
other process it sees (pid 1, the maker). Every standby in turn, recycled,
with the default seccomp policy and none (which lets the calls reach the
kernel). As root and unprivileged.
"""

from __future__ import annotations

import json
import textwrap

import pytest

import sandbox
from sandbox import Tmpfs

from .attack import make_base_spec, require_template_python
from .recycled import WHERE, Tenants

pytestmark = pytest.mark.integration

REACH = textwrap.dedent(f"""
    import ctypes, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            info, link = open(f"/proc/self/fdinfo/{{fd}}").read(), os.readlink(f"/proc/self/fd/{{fd}}")
        except OSError:
            continue  # the listing's own
        if "\\nPid:" in info or "pidfd" in link:
            found.append(f"fd {{fd}}: {{link}}")
    others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    for p in others:
        try:
            numbers = os.listdir(f"/proc/{{p}}/fd")  # the names alone: its owner's uid may list them
        except OSError:
            numbers = [str(n) for n in range(64)]
        for n in numbers:
            path = f"/proc/{{p}}/fd/{{n}}"
            for reach in (lambda: os.readlink(path), lambda: os.open(path, os.O_RDONLY)):
                try:
                    found.append(f"{{path}}: {{reach()}}")
                except OSError:
                    pass
        pidfd = libc.syscall(434, p, 0)  # pidfd_open
        for n in range(64 if pidfd >= 0 else 0):
            got = libc.syscall(438, pidfd, n, 0)  # pidfd_getfd
            if got >= 0:
                found.append(f"pidfd_getfd {{p}} {{n}}: {{os.readlink(f'/proc/self/fd/{{got}}')}}")
    print({WHERE}, json.dumps({{"found": found, "others": others}}))
""")


@pytest.mark.parametrize("seccomp", ["default", "none"])
def test_a_recycled_command_holds_and_takes_no_fd_of_what_outlives_it(seccomp: str) -> None:
    require_template_python()
    fields = {"seccomp": None} if seccomp == "none" else {}
    with sandbox.Template(make_base_spec(Tmpfs("/var/scratch"), **fields), recycle=True) as t:  # type: ignore[arg-type]
        tenants = Tenants(t)
        for _ in range(2):  # each standby, then each again, recycled
            for out in tenants.in_each(REACH):
                seen = json.loads(out)
                assert seen["found"] == [], seen
                assert 1 in seen["others"]  # pid 1 was there to reach for
