"""The zygote's Spec: the caller's Spec plus the caller's interpreter, read-only.

The zygote is a fresh run of the caller's own interpreter, so the sandbox must
show its executable (and each symlink on the way to it), its standard library,
its site directories (a venv's too), and where this package and cloudpickle
live, all read-only at their host paths. The shared libraries the interpreter
links (libc, libffi) come from the Spec itself (a RoBind of /usr, as usual).
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

import cloudpickle

from .. import spec as S
from ..errors import SpecError
from ..paths import executable_chain, is_under

PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the `sandbox` package
CLOUDPICKLE_ROOT = str(Path(cloudpickle.__file__).resolve().parents[1])
ZYGOTE_SCRIPT = str(Path(__file__).resolve().parent / "zygote.py")




def interpreter_paths() -> list[str]:
    """Host paths of the calling interpreter that its fresh run needs, the
    fewest that cover them all (none beneath another), existing ones only."""
    found = executable_chain(sys.executable)
    if sys.prefix != sys.base_prefix:
        found.append(sys.prefix)  # a venv: its pyvenv.cfg, bin and site-packages
    found += [sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    found += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    found += [PACKAGE_ROOT, CLOUDPICKLE_ROOT]
    paths = sorted({os.path.normpath(p) for p in found if p and os.path.exists(p)})
    return [p for p in paths if not any(q != p and is_under(p, q) for q in paths)]


@functools.cache
def import_dirs() -> frozenset[str]:
    """The directories the zygote imports top-level modules from: its
    interpreter's (`-I`: no script directory, PYTHONPATH or user site) and
    cloudpickle's. A checkout's directory is not among them, even when an
    editable install makes this package importable from there."""
    found = [sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    found += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    found += [os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload"), CLOUDPICKLE_ROOT]
    return frozenset(os.path.realpath(p) for p in found if p)


def importable_inside(module: ModuleType) -> bool:
    """Whether the zygote can import `module` by its name: this package, or
    a module whose top-level package lies directly in one of import_dirs().
    Anything else (`__main__`, a script's or a test's module, a checkout's
    package) must be sent to tasks by value."""
    top = module.__name__.partition(".")[0]
    if top == __name__.partition(".")[0]:
        return True  # this package: bound, and importable in the zygote as the caller imports it
    root = sys.modules.get(top)
    root_file = getattr(root, "__file__", None)
    if root is None or root_file is None:
        return getattr(module, "__file__", None) is None and module.__name__ != "__main__"  # built in
    return _import_dir(root_file, hasattr(root, "__path__")) in import_dirs()


@functools.lru_cache(maxsize=1024)
def _import_dir(top_file: str, package: bool) -> str:
    """The directory a top-level module (or package, by its __init__) is imported from."""
    where = os.path.dirname(os.path.realpath(top_file))
    return os.path.dirname(where) if package else where


def _covered(path: str, mounts: Iterable[S.Mount]) -> bool:
    """A read-only bind of the Spec already shows `path` at its host path."""
    return any(isinstance(m, S.Bind) and m.readonly and m.dest_path() == m.src and is_under(path, m.src)
               for m in mounts)


def check_spec(spec: S.Spec) -> None:
    """Refuse, by field, what a WorkerPool's tasks cannot be given."""
    ns = spec.namespaces
    if not (ns.user and ns.mount and ns.pid and ns.ipc and ns.uts):
        raise SpecError("namespaces", ns, "WorkerPool tasks always get user, mount, pid, ipc and uts namespaces")
    if spec.network == "host":
        raise SpecError("network", spec.network, "WorkerPool tasks always get a loopback-only network namespace")
    if spec.forward or spec.check_network:
        raise SpecError("forward" if spec.forward else "check_network", spec.forward or spec.check_network,
                        "not supported by WorkerPool")
    if not spec.die_with_parent:
        raise SpecError("die_with_parent", False, "a WorkerPool and its tasks always die with the caller")
    if not any(isinstance(m, S.Proc) and m.dest == "/proc" for m in spec.mounts):
        raise SpecError("mounts", "no Proc at /proc", "WorkerPool needs a Proc at /proc (tasks map their ids "
                        "through it and mount their own)")
    if not any(isinstance(m, S.Dev) and m.dest == "/dev" for m in spec.mounts):
        raise SpecError("mounts", "no Dev at /dev", "WorkerPool needs a Dev at /dev (a task's /proc covers mask "
                        "files with the /dev/null of the zygote's tree)")


def own_root(spec: S.Spec) -> bool:
    """Whether `spec`'s root is not the host's: an Overlay at /, or a bind at
    / of anything but the host's / (an image: sandbox.presets.image). Its
    tasks cannot run the caller's interpreter there (its libraries would be
    the root's), only the root's own."""
    for m in spec.mounts:
        if m.dest_path() == "/" and (isinstance(m, S.Overlay) or
                                  (isinstance(m, S.Bind) and os.path.realpath(m.src) != "/")):
            return True
    return False


def zygote_spec(spec: S.Spec) -> S.Spec:
    """`spec` with the interpreter's paths bound read-only after its own mounts (skipping
    those a read-only bind of the Spec already shows), a reaper as pid 1. In a root of
    its own (an image), only this package's and cloudpickle's: the image's Python runs."""
    check_spec(spec)
    wanted = [PACKAGE_ROOT, CLOUDPICKLE_ROOT] if own_root(spec) else interpreter_paths()
    extra = [S.RoBind(p) for p in dict.fromkeys(wanted) if not _covered(p, spec.mounts)]
    return spec.replace(mounts=(*spec.mounts, *extra), as_pid_1=False)
