"""Ready-made Specs for the usual worlds, so examples need not re-spell /usr and its links.

    spec = sandbox.presets.minimal_system(sandbox.Bind("/home/me/work", "/work"), cwd="/work")
    spec = sandbox.presets.python_interpreter()          # this Python, its venv and the system
    spec = sandbox.presets.host_view()                   # bwrap's `--ro-bind / /` view of the host
    spec = sandbox.presets.image("debian:12")            # a container image's root (sandbox.images)

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
from typing import TYPE_CHECKING, Any

from .errors import SpecError
from .host_system import system_mounts
from .paths import is_under
from .spec import Bind, Dev, Mount, Overlay, Proc, RemountRo, RoBind, Spec, Tmpfs
from .validate import StrPath, as_text, check_items, check_text

if TYPE_CHECKING:
    from .images import Image, ImageStore

__all__ = ["host_view", "image", "minimal_system", "python_interpreter", "python_mounts", "system_mounts"]

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# A preset's /tmp holds at most this many bytes, whatever the host's RAM (a tmpfs's default is half of it,
# and what is written there is memory; a sandbox's memory limit, where there is one, counts it too).
TMP_SIZE = 512 << 20
# What a program expects beside its files: a process list, devices, a private /tmp.
RUNTIME_MOUNTS: tuple[Mount, ...] = (Proc(), Dev(), Tmpfs("/tmp", size=TMP_SIZE))


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


def image(img: Image | str, *mounts: Mount, writable: StrPath | bool | None = None, root: str = "auto",
          store: ImageStore | None = None, size: int | None = None, **fields: Any) -> Spec:
    """A container image as the root: `img` is an `Image` (of the store it
    came from, unless `store` says) or a reference looked up in `store`
    (default: `ImageStore()`). The image's layers are stacked read-only
    with overlayfs inside the sandbox's user namespace under a writable
    layer: a fresh tmpfs per sandbox (`size` bytes) by default, gone with
    it; `writable=DIR` keeps it in host directory DIR
    (its upper/ and work/); `writable=False` makes the root read-only.
    Then /proc, a minimal /dev, a private /tmp, the image's environment
    (PATH defaults to the usual one), working directory and user (root
    inside the sandbox's user namespace if it names none), and `mounts`.

    `root="merged"` (or "auto" where this host cannot mount an overlayfs
    in a user namespace, or the executor cannot: `overlay_works()`) binds
    one tree of the layers merged (made once per image, in the store)
    read-only instead, with a fresh tmpfs at /tmp, /run, /var/tmp, the
    image's home and its working directory: writes elsewhere fail, and a
    bind's mount point must exist in the image. `writable=DIR` needs
    "overlay". A Template serves either warm (sandbox.warm_overlay: each of
    its sandboxes its own writable layer; no `writable=DIR`); a WorkerPool
    runs the image's own Python (sandbox.images.python)."""
    # lazy: `import sandbox.presets` (minimal_system, ...) loads no image store: 44 ms (import timed, median of 7)
    from .images import Image, ImageStore, roots

    if root not in ("auto", "overlay", "merged"):
        raise SpecError("root", root, "must be 'auto', 'overlay' or 'merged'")
    if writable is not None and not isinstance(writable, (bool, str, os.PathLike)):
        raise SpecError("writable", writable, "must be None, False or a host directory to keep the writes in")
    if isinstance(img, str):
        img = (store or ImageStore()).get(img)
    if not isinstance(img, Image):
        raise SpecError("img", img, "must be a sandbox.images.Image or a reference (a str)")
    store = store or ImageStore(roots.store_path(img))
    config = img.config
    env = dict(config.env)
    env.setdefault("PATH", SYSTEM_PATH)
    fields.setdefault("env", env)
    fields.setdefault("cwd", config.working_dir or "/")
    if "uid" not in fields and "gid" not in fields:  # no User: root, as a container runs (of its userns)
        fields["uid"], fields["gid"] = _image_user(img, config.user) or (0, 0)
    overlay = root == "overlay" or (root == "auto" and (writable not in (None, False) or overlay_works()))
    if not overlay:
        if writable not in (None, False):
            raise SpecError("writable", writable, "a kept writable layer needs root='overlay'")
        if size is not None:
            raise SpecError("size", size, "sizes the overlay's writable layer; root='merged' has none")
        return Spec(mounts=(RoBind(store.merged(img), "/"), Proc(), Dev(),
                            *(Tmpfs(p) for p in roots.scratch_dirs(img)), *mounts), **fields)
    img = store.overlay_ready(img)
    lowers = [layer.path for layer in img.layers]
    kept = writable if isinstance(writable, (str, os.PathLike)) else None
    top = Overlay("/", lowers, upper=kept, size=size)
    tail = (RemountRo("/"),) if writable is False else ()
    return Spec(mounts=(top, *RUNTIME_MOUNTS, *mounts, *tail), **fields)


def overlay_works() -> bool:
    """Whether an overlayfs of the store's kind mounts in a sandbox here (in one of minimal_system()): a
    fact tried once per process, by sandbox.probe.overlay_works."""
    # lazy: `import sandbox.presets` does not load sandbox.probe, which loads the executors
    # (`python -X importtime`, median of 15, a loaded 2-CPU VM: presets alone 64 ms, with probe 163 ms)
    from .probe import overlay_works as probed

    return probed(minimal_system())


def _image_user(img: Image, user: str) -> tuple[int, int] | None:
    """The image's `User` (uid[:gid], or a name in the top-most /etc/passwd
    of its layers, read without following links) as ids; None if unset."""
    from .images import roots  # lazy: as image()'s: no image store for `import sandbox.presets`: 44 ms

    name, _, group = user.partition(":")
    if not name:
        return None
    if name.isdigit():
        return int(name), int(group) if group.isdigit() else 0
    for layer in reversed(img.layers):
        data = roots.read_file(layer, "etc/passwd")
        if data is None:
            continue
        for line in data.decode(errors="replace").splitlines():
            parts = line.split(":")
            if len(parts) > 3 and parts[0] == name and parts[2].isdigit() and parts[3].isdigit():
                return int(parts[2]), int(group) if group.isdigit() else int(parts[3])
        break
    raise SpecError("uid", user, "the image's User names no user of its /etc/passwd; give uid= and gid=")


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


