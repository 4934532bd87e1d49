"""Whether a Template's resident pid 1 may run under its sandbox's own filter.

A Template's standby sandbox takes the command's identity before any
request comes (csrc/template/standby.c). If the seccomp filter allows everything
that pid 1 still does after it (take the request, apply its cwd, limits and
fds, vfork the command, report, reap), the standby installs the filter on
itself then, and the command inherits it: the same filter, off the
request's path (loading one costs ~50-90 µs here, mostly its JIT). Else the
command installs it alone, just before its exec, as on every other path.
A recycled sandbox's command maker (csrc/template/template_maker.c) takes it once
for all its commands: the filter must then also allow what the maker does
(compare what its commands would inherit, clone each as its parent's
child) and what each command child does before its exec (its session).

The check runs the compiled program (`debug.evaluate`) on each of those
syscalls: with the exact arguments where pid 1's are fixed (clone's flags,
prctl's option), and with several argument patterns elsewhere. Anything
but SECCOMP_RET_ALLOW keeps the filter on the command alone.
"""

from __future__ import annotations

import functools
import signal

from .. import syscalls
from .bpf import SECCOMP_RET_ACTION_FULL, SECCOMP_RET_ALLOW, _insns
from .debug import _run, evaluate, seccomp_data

CLONE_VM, CLONE_VFORK, CLONE_PARENT = 0x100, 0x4000, 0x8000
PR_SET_DUMPABLE = 4

# (syscall, its arguments) where pid 1 always passes the same ones.
FIXED: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("clone", (CLONE_VM | CLONE_VFORK | signal.SIGCHLD,)),  # the command, sharing memory until its exec
    ("clone", (CLONE_VM | CLONE_PARENT | signal.SIGCHLD,)),  # a recycled sandbox's, by its maker
    ("prctl", (PR_SET_DUMPABLE, 0)),
)
# Those whose arguments vary (fds, paths, limits, pids).
VARYING: tuple[str, ...] = (
    "recvmsg", "sendmsg", "close", "close_range", "read", "write", "brk", "mmap", "munmap", "mprotect",
    "chdir", "newfstatat", "fstat", "statx", "openat", "openat2", "faccessat", "faccessat2",
    "prlimit64", "setrlimit", "getrlimit",
    "fcntl", "dup2", "dup3", "rt_sigprocmask", "rt_sigtimedwait", "execve", "wait4", "getpid", "gettid",
    "pidfd_open", "kill", "exit", "exit_group", "clock_gettime",
    # a recycled sandbox's maker and its command children (template_maker.c, template_inherited.c)
    "setsid", "pread64", "sched_getattr", "sched_getaffinity", "ioprio_get",
)
ARG_PATTERNS: tuple[tuple[int, ...], ...] = (
    (0,) * 6, (1,) * 6, (2, 3, 4, 5, 6, 7), (0xFFFFFFFF,) * 6, (0xFFFFFFFFFFFFFFFF,) * 6, (0x7FFFF000, 8, 1, 0, 0, 0),
)


@functools.lru_cache(maxsize=64)
def allows_resident(prog: bytes) -> bool:
    """Whether `prog` (a compiled filter) allows everything a Template's pid 1 does after installing it."""
    if not prog:
        return False
    numbers = syscalls.table()
    calls = [(name, args) for name, args in FIXED] + [(name, pattern) for name in VARYING for pattern in ARG_PATTERNS]
    for name, args in calls:
        nr = numbers.get(name)
        if nr is None:
            continue  # not on this architecture (e.g. dup2 elsewhere): pid 1 does not call it here
        if evaluate(prog, nr, args) & SECCOMP_RET_ACTION_FULL != SECCOMP_RET_ALLOW:
            return False
    return True


# The keyring syscalls, as every ABI of an x86_64 kernel numbers them: native, x32 (the same numbers with
# bit 30, the native arch) and i386 (int 0x80, its own arch and numbers).
_X32 = 0x40000000
KEYRING_CALLS: tuple[tuple[int, int], ...] = (
    *((syscalls.AUDIT_ARCH_X86_64, nr) for nr in (248, 249, 250)),
    *((syscalls.AUDIT_ARCH_X86_64, _X32 | nr) for nr in (248, 249, 250)),
    *((syscalls.AUDIT_ARCH_I386, nr) for nr in (286, 287, 288)),
)


class _Watched(bytes):
    """A seccomp_data that remembers the lowest offset read beyond nr and arch (64: none)."""

    lowest = 64

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        if isinstance(key, slice) and (key.start or 0) >= 8:
            self.lowest = min(self.lowest, key.start)
        return super().__getitem__(key)


def refuses_keyrings(prog: bytes) -> bool:
    """Whether `prog` (a compiled filter) refuses add_key, request_key and keyctl whatever their
    arguments, on every ABI: its verdict for each is not SECCOMP_RET_ALLOW, and reaching it read
    nothing of seccomp_data but the syscall number and arch (not the instruction pointer or an
    argument), so no argument can change it. Then no command can reach a user keyring, and a
    recycled Template sandbox may keep its commands' user namespace (csrc/template/template_recycle.c)."""
    if not prog or syscalls.arch() != syscalls.AUDIT_ARCH_X86_64:
        return False
    insns = _insns(prog)
    for arch, nr in KEYRING_CALLS:
        data = _Watched(seccomp_data(nr, (0,) * 6, arch))
        action = _run(insns, data)[0]
        if action & SECCOMP_RET_ACTION_FULL == SECCOMP_RET_ALLOW or data.lowest < 64:
            return False
    return True
