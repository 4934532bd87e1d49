"""The framework's interpreter as installed, read from the host (no module is imported).

`PythonFacts.current()` gathers what compile.py needs: this interpreter's
executable, standard library and site directories; the paths the site
directories' `.pth` files add (an editable install's checkout: never shown);
and every other interpreter's site directory found on the host (emptied
inside). `locate(name)` finds the file or directory of a module by name, the
way the import system would, without running any package code: a dotted
name's parents are walked on the filesystem, their `__init__` never run.
"""

from __future__ import annotations

import glob
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import SpecError
from ..paths import executable_chain


@dataclass(frozen=True)
class PythonFacts:
    """What the task layer shows of an interpreter; plain data, so compile() is pure."""

    executable: str  # as invoked (a venv's bin/python), with the links it leads through
    executable_chain: tuple[str, ...]
    venv_cfg: str | None  # a venv's pyvenv.cfg: without it the interpreter does not know its venv
    bindir: str
    stdlib: tuple[str, ...]  # the standard library, lib-dynload, the zip
    site_dirs: tuple[str, ...]  # site directories on sys.path
    pth_added: tuple[str, ...]  # paths .pth files add: never shown
    other_site_dirs: tuple[str, ...]  # other interpreters' site directories: emptied
    pythonpath: tuple[str, ...]  # PYTHONPATH entries of the caller

    @classmethod
    def current(cls) -> PythonFacts:
        """This interpreter's facts; read again when sys.path, PYTHONPATH or a
        site directory (a .pth file added or removed) changes."""
        key = (tuple(sys.path), os.environ.get("PYTHONPATH", ""),
               tuple(_mtime(p) for p in sys.path if p.endswith(("site-packages", "dist-packages"))))
        if _cache.get("key") != key:
            _cache["facts"], _cache["key"] = cls._read(), key
        return _cache["facts"]  # type: ignore[return-value]

    @classmethod
    def _read(cls) -> PythonFacts:
        site_dirs = _site_dirs()
        chain = tuple(executable_chain(sys.executable))
        # (a venv's platstdlib is its own lib/pythonX.Y, which holds no standard library)
        stdlib = tuple(dict.fromkeys(p for p in (sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"))
                                     if p and os.path.isfile(os.path.join(p, "os.py"))))
        stdlib += tuple(p for p in sys.path if p.endswith(".zip") and os.path.exists(p))
        stdlib += tuple(p for p in sys.path if p.endswith("lib-dynload") and os.path.isdir(p) and p not in stdlib)
        pp = tuple(p for p in os.environ.get("PYTHONPATH", "").split(":") if p.startswith("/"))
        cfg = os.path.join(sys.prefix, "pyvenv.cfg")
        return cls(executable=sys.executable, executable_chain=chain,
                   venv_cfg=cfg if sys.prefix != sys.base_prefix and os.path.isfile(cfg) else None,
                   bindir=os.path.dirname(os.path.abspath(sys.executable)), stdlib=stdlib,
                   site_dirs=site_dirs, pth_added=tuple(pth_additions(site_dirs)),
                   other_site_dirs=tuple(p for p in _all_site_dirs() if p not in site_dirs), pythonpath=pp)


_cache: dict[str, object] = {}


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _site_dirs() -> tuple[str, ...]:
    """The site directories on sys.path (those `site` knows, as installed)."""
    known = set(site.getsitepackages()) | {site.getusersitepackages()}
    known |= {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    return tuple(dict.fromkeys(os.path.normpath(p) for p in sys.path if p in known and os.path.isdir(p)))


def _all_site_dirs() -> list[str]:
    """Site directories of every interpreter on the host's usual places, and this one's base installation."""
    found = []
    for prefix in ("/usr", "/usr/local", sys.base_prefix, sys.base_exec_prefix):
        for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages",
                        "lib64/python3*/site-packages"):
            found += glob.glob(os.path.join(prefix, pattern))
    return sorted({os.path.normpath(p) for p in found if os.path.isdir(p)})


def pth_additions(site_dirs: Sequence[str]) -> list[str]:
    """The directories the `.pth` files of `site_dirs` add to sys.path (not
    their `import` lines, which are code: those are never run here)."""
    out = []
    for d in site_dirs:
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".pth"))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(d, name), encoding="utf-8", errors="replace") as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                path = os.path.normpath(os.path.join(d, line))
                if os.path.isdir(path) and path not in site_dirs:
                    out.append(path)
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------- modules by name

SUFFIXES = tuple(importlib.machinery.all_suffixes())


def _in_dirs(name: str, dirs: Sequence[str]) -> str | None:
    """The package directory or module file `name` (one component) in the first of `dirs` holding it."""
    for d in dirs:
        pkg = os.path.join(d, name)
        if os.path.isdir(pkg):
            return pkg  # a regular package or a namespace portion: the directory either way
        for suffix in SUFFIXES:
            if os.path.isfile(pkg + suffix):
                return pkg + suffix
    return None


def locate(name: str, search: Sequence[str] | None = None) -> str:
    """The host path of module or package `name` (dotted allowed), found
    without importing it or any parent: the top level through the finders
    (they read the filesystem, never run the package), each further component
    on the filesystem below it. SpecError if it is not found."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        raise SpecError("hide", name, "is not a module name")
    top = _locate_top(parts[0], search)
    if top is None:
        raise SpecError("hide", name, "no such module or package is installed")
    path = top
    for comp in parts[1:]:
        if not os.path.isdir(path):
            raise SpecError("hide", name, f"{os.path.basename(path)} is a module, not a package")
        found = _in_dirs(comp, [path])
        if found is None:
            raise SpecError("hide", name, f"{comp!r} not found in {path}")
        path = found
    return path


def _locate_top(name: str, search: Sequence[str] | None) -> str | None:
    if search is not None:
        return _in_dirs(name, search)
    mod = sys.modules.get(name)
    spec = getattr(mod, "__spec__", None) if mod is not None else None
    if spec is None:
        try:
            spec = importlib.util.find_spec(name)  # a top-level name: finders only, no code of the package
        except (ImportError, ValueError):
            spec = None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        locations = list(spec.submodule_search_locations)
        return locations[0] if locations else None
    return spec.origin if spec.origin and os.path.isabs(spec.origin) else None


def package_paths(name: str) -> list[str]:
    """What `packages` shows for `name`: the top-level packages and modules of
    the distribution so named, else the module or package of that name."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    tops: list[str] = []
    if dist is not None:
        text = dist.read_text("top_level.txt")
        tops = text.split() if text else []
        if not tops:
            tops = sorted({str(f).split("/")[0].removesuffix(".py") for f in (dist.files or [])
                           if not str(f).startswith(("..", "__")) and ".dist-info" not in str(f)
                           and str(f).split("/")[0].removesuffix(".py").isidentifier()})
        tops = [t for t in tops if t.isidentifier()]
    out = []
    for top in tops or [name]:
        try:
            out.append(locate(top))
        except SpecError:
            if not tops:
                raise SpecError("packages", name, "no such distribution or module") from None
    if not out:
        raise SpecError("packages", name, "the distribution's packages were not found")
    return out
