"""Ready-made Specs for the usual worlds, so examples need not re-spell /usr and its links.

    spec = sandbox.presets.minimal_system(sandbox.Bind("/home/me/work", "/work"), cwd="/work")
    spec = sandbox.presets.python_interpreter()          # this Python, its venv and the system
    spec = sandbox.presets.host_view()                   # bwrap's `--ro-bind / /` view of the host

Each function takes extra mounts (applied after the preset's, so they can
cover its paths) and any other Spec field by keyword, and returns an ordinary
Spec (`.replace(...)` it further). The mount tuples (`system_mounts()`,
`python_mounts()`) are there to compose by hand. Everything else keeps the
Spec's safe defaults: every namespace, no network but loopback, no
capabilities, the default seccomp policy.

The presets read the host once, when called: /bin, /sbin, /lib, /lib32,
/lib64 and /libx32 become symlinks where the host has them as symlinks (a
merged /usr, as on Debian 12 or Fedora), read-only binds where they are
directories, and are left out where absent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

from .paths import is_under
from .spec import Bind, Dev, Mount, Proc, RoBind, Spec, Symlink, Tmpfs
from .validate import StrPath, as_text, check_items, check_text

__all__ = ["host_view", "minimal_system", "python_interpreter", "python_mounts", "system_mounts"]

TOP_LEVEL_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# What a program expects beside its files: a process list, devices, a private /tmp.
RUNTIME_MOUNTS: tuple[Mount, ...] = (Proc(), Dev(), Tmpfs("/tmp"))


def system_mounts() -> tuple[Mount, ...]:
    """The distribution's programs and libraries, read-only: /usr and the top-level
    links into it (or the directories themselves on a host without a merged /usr)."""
    mounts: list[Mount] = [RoBind("/usr")]
    for name in TOP_LEVEL_LINKS:
        path = "/" + name
        if os.path.islink(path):
            mounts.append(Symlink(os.readlink(path), path))
        elif os.path.isdir(path):
            mounts.append(RoBind(path))
    return tuple(mounts)


def minimal_system(*mounts: Mount, **fields: Any) -> Spec:
    """/usr read-only with the usual links, a new /proc, a minimal /dev and a private
    /tmp; then `mounts`. The environment is PATH only unless `env` is given.
    Nothing else of the host is visible: no /etc, no /home, no /root."""
    fields.setdefault("env", {"PATH": SYSTEM_PATH})
    return Spec(mounts=(*system_mounts(), *RUNTIME_MOUNTS, *mounts), **fields)


def python_mounts(executable: StrPath | None = None) -> tuple[Mount, ...]:
    """Read-only binds of what a Python interpreter needs beyond /usr: its
    installation (sys.base_prefix) and its virtual environment (sys.prefix),
    where they lie outside /usr. `executable` defaults to this interpreter."""
    prefixes = _prefixes(executable)
    return tuple(RoBind(path) for path in prefixes if not is_under(path, "/usr"))


def python_interpreter(*mounts: Mount, executable: StrPath | None = None, **fields: Any) -> Spec:
    """`minimal_system` plus the interpreter (this one by default) and its venv, read-only,
    with its bin directory first in PATH: `run(["python3", "-c", ...], python_interpreter())`
    runs the same Python with the packages installed in it. Bytecode is not written.
    A package installed in editable mode (`pip install -e`) lives in its source tree:
    bind that too."""
    python = sys.executable if executable is None else check_text("executable", as_text(executable))
    bindir = os.path.dirname(os.path.abspath(python))
    fields.setdefault("env", {"PATH": f"{bindir}:{SYSTEM_PATH}", "PYTHONDONTWRITEBYTECODE": "1"})
    return minimal_system(*python_mounts(python), *mounts, **fields)


def host_view(*mounts: Mount, writable: Iterable[StrPath] = (), **fields: Any) -> Spec:
    """bwrap's common `--ro-bind / / --proc /proc --dev /dev --tmpfs /tmp`: the whole
    host read-only (home directories and secrets included: add `probe_paths` or
    cover them with `Tmpfs`), a new /proc and /dev, a private /tmp; `writable`
    paths bound read-write on top; then `mounts`. Isolation is that of the
    namespaces and the read-only binds only: prefer `minimal_system` for
    untrusted code."""
    binds = tuple(Bind(path) for path in check_items("writable", writable, "paths"))
    return Spec(mounts=(RoBind("/"), *RUNTIME_MOUNTS, *binds, *mounts), **fields)


def _prefixes(executable: StrPath | None) -> list[str]:
    """sys.base_prefix and sys.prefix of `executable` (this interpreter's unless given)."""
    if executable is not None:
        executable = check_text("executable", as_text(executable))
    if executable is None or os.path.realpath(executable) == os.path.realpath(sys.executable):
        found = [sys.base_prefix, sys.prefix]
    else:
        import subprocess

        out = subprocess.run([executable, "-I", "-S", "-c", "import sys; print(sys.base_prefix); print(sys.prefix)"],
                             capture_output=True, text=True, check=True).stdout
        found = out.split("\n")[:2]
    return list(dict.fromkeys(os.path.abspath(p) for p in found if p))


