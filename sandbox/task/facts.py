"""What compiling a description needs to know about the host, gathered in one place.

compile.py is pure: it turns a Sandbox and these facts into a Spec. Here is
all the reading: the system's links, which /etc files exist, this
interpreter (pyenv.PythonFacts), and the files the `hide` names, the
`packages` and the framework package resolve to (never by importing them).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..errors import SpecError
from ..host_system import system_mounts
from ..mounts import Mount
from .description import Sandbox
from .pyenv import PythonFacts, locate, package_paths

# The few /etc files a program expects; never shadow, sudoers, ssh or ssl/private.
ETC_FILES = ("/etc/passwd", "/etc/group", "/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf",
             "/etc/ld.so.cache", "/etc/localtime", "/etc/ssl/certs")
HIDE_ENV = "SANDBOX_HIDE"


@dataclass(frozen=True)
class Facts:
    """The host as far as one description is concerned."""

    python: PythonFacts
    system: tuple[Mount, ...]
    etc: tuple[str, ...]
    hidden: tuple[tuple[str, str], ...]  # (name, host path), `hide` and SANDBOX_HIDE
    framework_paths: tuple[str, ...]  # where the framework package is installed (covered unless shown)
    packages: tuple[str, ...]  # host paths of `packages`
    realpaths: Mapping[str, str] = field(default_factory=dict)  # a path -> where its links lead
    empty_file: str = ""  # an empty read-only host file, bound over a hidden file

    @classmethod
    def gather(cls, sb: Sandbox, environ: Mapping[str, str], python: PythonFacts | None = None) -> Facts:
        """Read the host for `sb` (`environ` supplies SANDBOX_HIDE)."""
        py = python or PythonFacts.current()
        names = hide_names(sb, environ)
        hidden = tuple(_resolve_hidden(names, set(sb.hide)))
        fw: list[str] = []
        if sb.framework_package:
            fw = _installed_everywhere(sb.framework_package, py)
        pkgs = tuple(p for name in sb.packages for p in package_paths(name))
        for _, path in hidden:
            _make_pycache(path)
        real = {p: os.path.realpath(p) for p in (*[h for _, h in hidden], *fw, *py.site_dirs,
                                                 *sb.read, *sb.write, *(b.source for b in sb.binds))}
        return cls(python=py, system=system_mounts(), etc=tuple(p for p in ETC_FILES if os.path.exists(p)),
                   hidden=hidden, framework_paths=tuple(fw), packages=pkgs, realpaths=real,
                   empty_file=empty_file() if hidden or fw else "")


_empty: list[str] = []


def empty_file() -> str:
    """An empty file of this process (mode 0444, in a private 0711 directory),
    removed at exit: what a hidden module file is covered with. A file cannot
    be created over a file of a read-only bind, but one can be bound there."""
    if not _empty:
        directory = tempfile.mkdtemp(prefix="sandbox-task-")
        os.chmod(directory, 0o711)
        path = os.path.join(directory, "empty")
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o444))
        atexit.register(shutil.rmtree, directory, True)
        _empty.append(path)
    return _empty[0]


def hide_names(sb: Sandbox, environ: Mapping[str, str]) -> tuple[str, ...]:
    """`sb.hide` and the names of SANDBOX_HIDE (the judge's sandbox takes only its own)."""
    inherited = [] if sb.role == "judge" else [n.strip() for n in environ.get(HIDE_ENV, "").split(",")]
    return tuple(dict.fromkeys(n for n in (*sb.hide, *inherited) if n))


def _resolve_hidden(names: tuple[str, ...], own: set[str]) -> list[tuple[str, str]]:
    """(name, path) of each name; a name of this description that is not
    installed is an error, one inherited through SANDBOX_HIDE is skipped."""
    out = []
    for name in names:
        try:
            out.append((name, locate(name)))
        except SpecError:
            if name in own:
                raise
    return out


def _installed_everywhere(name: str, py: PythonFacts) -> list[str]:
    """Every place the package `name` is found: each site directory, each .pth addition, PYTHONPATH."""
    out = []
    for d in (*py.site_dirs, *py.pth_added, *py.pythonpath):
        with contextlib.suppress(Exception):
            out.append(locate(name, [d]))
    with contextlib.suppress(Exception):
        out.append(locate(name))
    return list(dict.fromkeys(out))


def _make_pycache(path: str) -> None:
    """A hidden module's `__pycache__` must exist to be covered: a cache that
    a later trusted import writes there is then never readable inside."""
    if os.path.isfile(path):
        with contextlib.suppress(OSError):
            os.makedirs(os.path.join(os.path.dirname(path), "__pycache__"), exist_ok=True)
