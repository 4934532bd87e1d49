"""System call names and numbers of the host architecture, read from the kernel headers.

The table is never written by hand: it comes from the extension module (which
the build generates from `<asm/unistd_64.h>`), else from running the C
preprocessor on the installed headers, else from reading `unistd_64.h`
directly. It is computed once per process.

The headers are those of the installed `linux-libc-dev`, which may be older
than the running kernel: syscalls added after it have no name here.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

from .errors import UnavailableError

# ABI constants (linux/audit.h, asm/unistd.h); they never change.
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
X32_SYSCALL_BIT = 0x40000000

_MACHINES = {"x86_64": AUDIT_ARCH_X86_64, "amd64": AUDIT_ARCH_X86_64}
_DEFINE = r"^#define\s+__NR_(\w+)\s+(\d+)\s*$"  # a line of asm/unistd_64.h
_HEADER_FILES = (
    "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
    "/usr/include/asm/unistd_64.h",
)


def arch() -> int:
    """The AUDIT_ARCH_* value `seccomp_data.arch` holds for native syscalls on this host.

    Raises UnavailableError on architectures this package does not build filters for.
    """
    machine = os.uname().machine.lower()  # platform.machine(), without importing platform
    if machine not in _MACHINES:
        raise UnavailableError(f"seccomp filters are only built for x86_64, not {machine!r}")
    return _MACHINES[machine]


def table() -> dict[str, int]:
    """Syscall name -> number for the host architecture (a fresh dict each call)."""
    return dict(_pairs())


def number(name: str) -> int | None:
    """The number of syscall `name`, or None if the headers do not know it."""
    return _by_name().get(name)


def name(nr: int) -> str | None:
    """The name of syscall number `nr`, or None if the headers do not know it."""
    return _by_number().get(nr)


@functools.cache
def _by_name() -> dict[str, int]:
    return dict(_pairs())


@functools.cache
def _by_number() -> dict[int, str]:
    return {nr: nm for nm, nr in _pairs()}


@functools.cache
def _pairs() -> tuple[tuple[str, int], ...]:
    for source in (_from_native, _from_preprocessor, _from_header_files):
        pairs = source()
        if pairs and "exit_group" in dict(pairs):
            return tuple(sorted(pairs, key=lambda p: p[1]))
    raise UnavailableError(
        "no syscall table: the sandbox extension module is not built and neither a C "
        "preprocessor nor <asm/unistd_64.h> (Debian: linux-libc-dev) is available"
    )


def _from_native() -> list[tuple[str, int]] | None:
    """Read `sbx_syscall_names/_numbers/_n_syscalls` from the extension module, if built."""
    try:
        from ._native import ffi, lib  # lazy: the C core may be missing: the headers give the table then
    except ImportError:
        return None
    try:
        count = int(lib.sbx_n_syscalls)
        names, numbers = lib.sbx_syscall_names, lib.sbx_syscall_numbers
        return [(_strip(ffi.string(names[i]).decode()), int(numbers[i])) for i in range(count)]
    except (AttributeError, TypeError):
        return None


def _from_preprocessor() -> list[tuple[str, int]] | None:
    """Run `cc -E -dM -include asm/unistd.h` and parse the `__NR_*` macros."""
    import shlex
    import subprocess  # only where the compiled core is missing

    cc = shlex.split(os.environ.get("CC") or "cc")
    cmd = [*cc, "-E", "-dM", "-include", "asm/unistd.h", "-x", "c", os.devnull]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return _parse(out)


def _from_header_files() -> list[tuple[str, int]] | None:
    """Parse the first readable `asm/unistd_64.h`."""
    for path in _HEADER_FILES:
        try:
            with open(path, encoding="ascii") as f:
                return _parse(f.read())
        except OSError:
            continue
    return None


def _parse(text: str) -> list[tuple[str, int]]:
    import re

    return [(m.group(1), int(m.group(2))) for m in re.finditer(_DEFINE, text, re.MULTILINE)]


def _strip(raw: str) -> str:
    return raw[len("__NR_"):] if raw.startswith("__NR_") else raw


def unknown_names(names: Iterable[str]) -> list[str]:
    """The names in `names` the host table does not know, in the order given."""
    known = _by_name()
    return [n for n in names if n not in known]
