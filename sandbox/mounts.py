"""The mount operations of a Spec, in bubblewrap's vocabulary, and their JSON form.

Frozen and validated on construction (SpecError names the field); applied in
order inside an empty root by the backends, as the Plan says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import SpecError
from .validate import (
    StrPath,
    as_text,
    check_bool,
    check_items,
    check_path,
    check_perms,
    check_positive,
    check_text,
    init_fields,
    normalize_path,
    reject_unknown,
)


@dataclass(frozen=True)
class Mount:
    """Base of the mount operations. `kind` is the bwrap option name without '--'.

    Each operation's __init__ takes a path as a str or an os.PathLike (a
    pathlib.Path) and keeps it as a normalized str."""

    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        self.validate(self.kind)

    def validate(self, where: str) -> None:
        """Check and normalize the fields; raise SpecError naming `where`.field."""
        raise NotImplementedError

    def dest_path(self) -> str:
        """The path inside the sandbox this operation creates or changes."""
        raise NotImplementedError

    def target(self) -> str:
        """dest_path(), by its old name (kept for callers that use it)."""
        return self.dest_path()

    def creates(self) -> bool:
        """True if the operation creates something at dest_path() (not a modifier)."""
        return True

    def _path(self, where: str, name: str) -> None:
        """Check the path field `name` and keep it as a normalized str."""
        object.__setattr__(self, name, normalize_path(check_path(f"{where}.{name}", getattr(self, name))))


@dataclass(frozen=True, init=False)
class Bind(Mount):
    """Bind host path `src` at `dest` (default: the same path), writable.

    Always recursive and nosuid; nodev unless DevBind. `optional=True` skips a
    missing source (bwrap's `--bind-try`). A source that is a symlink binds its target.
    A source `/proc/self/fd/N` binds what the spawning process's fd N names
    (bwrap's `--bind-fd`), found again by its path and checked to be that file.
    """

    src: str
    dest: str | None = None
    optional: bool = False
    kind: ClassVar[str] = "bind"
    readonly: ClassVar[bool] = False
    devices: ClassVar[bool] = False

    def __init__(self, src: StrPath, dest: StrPath | None = None, optional: bool = False) -> None:
        init_fields(self, src=src, dest=dest, optional=optional)

    def validate(self, where: str) -> None:
        self._path(where, "src")
        if self.dest is None:
            object.__setattr__(self, "dest", self.src)
        self._path(where, "dest")
        check_bool(f"{where}.optional", self.optional)

    def dest_path(self) -> str:
        return self.dest or self.src


@dataclass(frozen=True, init=False)
class RoBind(Bind):
    """Bind host path `src` at `dest`, read-only on every submount (bwrap `--ro-bind`)."""

    kind: ClassVar[str] = "ro-bind"
    readonly: ClassVar[bool] = True


@dataclass(frozen=True, init=False)
class DevBind(Bind):
    """Bind host path `src` at `dest` with device access allowed (bwrap `--dev-bind`)."""

    kind: ClassVar[str] = "dev-bind"
    devices: ClassVar[bool] = True


@dataclass(frozen=True, init=False)
class _AtDest(Mount):
    """A mount whose target is its `dest` (the only field of a Proc, Dev, Mqueue)."""

    dest: str

    def validate(self, where: str) -> None:
        self._path(where, "dest")

    def dest_path(self) -> str:
        return self.dest


@dataclass(frozen=True, init=False)
class Tmpfs(_AtDest):
    """A fresh tmpfs at `dest` (nosuid, nodev), `size` in bytes, mode `perms`."""

    dest: str
    size: int | None = None
    perms: int = 0o755
    kind: ClassVar[str] = "tmpfs"

    def __init__(self, dest: StrPath, size: int | None = None, perms: int = 0o755) -> None:
        init_fields(self, dest=dest, size=size, perms=perms)

    def validate(self, where: str) -> None:
        super().validate(where)
        check_positive(f"{where}.size", self.size)
        check_perms(f"{where}.perms", self.perms)


# The sets of /proc entries a Proc may cover (sandbox.plan.proc_covers says what each holds).
PROC_COVER_SETS = ("strict", "bwrap")


@dataclass(frozen=True, init=False)
class Proc(_AtDest):
    """procfs at `dest`: a fresh one with a pid namespace, else the host's, bound.

    `covers` names the entries covered right after it is mounted (the plan
    lists them: sandbox.plan.proc_covers). "strict", the default: the entries
    that reconfigure the kernel read-only, and those that leak what the
    sandbox should not read hidden. "bwrap": bubblewrap 0.8.0's own, which
    `sandbox run` chooses: nothing for a caller other than root, so a user
    namespace made inside can mount a procfs of its own (the kernel allows
    that only where a procfs with nothing mounted over its entries is
    already visible); for a root caller, read-only /proc/sys, sysrq-trigger,
    irq and bus, and its root-only files hidden.
    """

    dest: str = "/proc"
    covers: str = "strict"
    kind: ClassVar[str] = "proc"

    def __init__(self, dest: StrPath = "/proc", covers: str = "strict") -> None:
        init_fields(self, dest=dest, covers=covers)

    def validate(self, where: str) -> None:
        super().validate(where)
        if self.covers not in PROC_COVER_SETS:
            raise SpecError(f"{where}.covers", self.covers, f"must be one of {', '.join(PROC_COVER_SETS)}")


@dataclass(frozen=True, init=False)
class Dev(_AtDest):
    """A minimal /dev at `dest`: null, zero, full, random, urandom, tty, a private
    devpts with ptmx, shm, and the fd/stdin/stdout/stderr links."""

    dest: str = "/dev"
    kind: ClassVar[str] = "dev"

    def __init__(self, dest: StrPath = "/dev") -> None:
        init_fields(self, dest=dest)


@dataclass(frozen=True, init=False)
class Mqueue(_AtDest):
    """A fresh POSIX message queue filesystem at `dest` (bwrap `--mqueue`):
    the queues of the sandbox's IPC namespace. Mounting it needs privilege
    over that namespace, so in a user namespace it needs `namespaces.ipc`."""

    dest: str = "/dev/mqueue"
    kind: ClassVar[str] = "mqueue"

    def __init__(self, dest: StrPath = "/dev/mqueue") -> None:
        init_fields(self, dest=dest)


@dataclass(frozen=True, init=False)
class Dir(_AtDest):
    """A directory at `dest` with mode `perms` (an existing one keeps its mode)."""

    dest: str
    perms: int = 0o755
    kind: ClassVar[str] = "dir"

    def __init__(self, dest: StrPath, perms: int = 0o755) -> None:
        init_fields(self, dest=dest, perms=perms)

    def validate(self, where: str) -> None:
        super().validate(where)
        check_perms(f"{where}.perms", self.perms)


@dataclass(frozen=True, init=False)
class Symlink(Mount):
    """A symlink at `dest` pointing to `target_path` (bwrap `--symlink TARGET DEST`)."""

    target_path: str
    dest: str
    kind: ClassVar[str] = "symlink"

    def __init__(self, target_path: StrPath, dest: StrPath) -> None:
        init_fields(self, target_path=target_path, dest=dest)

    def validate(self, where: str) -> None:
        object.__setattr__(self, "target_path", check_text(f"{where}.target_path", as_text(self.target_path)))
        if not self.target_path:
            raise SpecError(f"{where}.target_path", self.target_path, "must not be empty")
        self._path(where, "dest")

    def dest_path(self) -> str:
        return self.dest


@dataclass(frozen=True, init=False)
class File(_AtDest):
    """A regular file at `dest` holding `data` (bytes, or a str written as UTF-8),
    mode `perms`; `readonly` binds it read-only."""

    dest: str
    data: bytes = b""
    perms: int = 0o666
    readonly: bool = False
    kind: ClassVar[str] = "file"

    def __init__(self, dest: StrPath, data: bytes | str = b"", perms: int = 0o666, readonly: bool = False) -> None:
        init_fields(self, dest=dest, data=data, perms=perms, readonly=readonly)

    def validate(self, where: str) -> None:
        super().validate(where)
        if isinstance(self.data, str):
            try:
                object.__setattr__(self, "data", self.data.encode())
            except UnicodeEncodeError:  # a lone surrogate
                raise SpecError(f"{where}.data", self.data, "must be bytes or a str UTF-8 can encode") from None
        if not isinstance(self.data, bytes):
            raise SpecError(f"{where}.data", self.data, "must be bytes or str")
        check_perms(f"{where}.perms", self.perms)
        check_bool(f"{where}.readonly", self.readonly)


@dataclass(frozen=True, init=False)
class RemountRo(_AtDest):
    """Make the mount at `dest` read-only (also nosuid, nodev), not recursively."""

    dest: str
    kind: ClassVar[str] = "remount-ro"

    def __init__(self, dest: StrPath) -> None:
        init_fields(self, dest=dest)

    def creates(self) -> bool:
        return False


@dataclass(frozen=True, init=False)
class Chmod(Mount):
    """Change the mode of an existing `path` inside the sandbox."""

    path: str
    perms: int
    kind: ClassVar[str] = "chmod"

    def __init__(self, path: StrPath, perms: int) -> None:
        init_fields(self, path=path, perms=perms)

    def validate(self, where: str) -> None:
        self._path(where, "path")
        check_perms(f"{where}.perms", self.perms)

    def dest_path(self) -> str:
        return self.path

    def creates(self) -> bool:
        return False


# overlayfs stacks at most this many lower layers (the kernel's OVL_MAX_STACK).
MAX_OVERLAY_LOWERS = 500


@dataclass(frozen=True, init=False)
class Overlay(Mount):
    """An overlayfs at `dest`: the host directories `lowers` (bottom first, as
    `sandbox.images.Image.layers`) stacked read-only, under a writable layer
    that is, by default, a fresh tmpfs of this sandbox (`size` bytes), gone
    with it; with `upper`, the host directory `upper`'s `upper/` and `work/`
    subdirectories (each made if missing, `upper` too), kept; with
    `writable=False`, none (the stack is read-only: its mount points must
    exist in the layers).

    Mounted inside the sandbox's user namespace with overlayfs's `userxattr`:
    a whiteout is a 0:0 character device, an opaque directory carries
    `user.overlay.opaque=y` (`ImageStore.overlay_ready` makes an image's
    layers so). Always nosuid and nodev. Native executor only.
    """

    dest: str
    lowers: tuple[str, ...]
    upper: str | None = None
    writable: bool = True
    size: int | None = None
    kind: ClassVar[str] = "overlay"

    def __init__(self, dest: StrPath, lowers: Iterable[StrPath], upper: StrPath | None = None,
                 writable: bool = True, size: int | None = None) -> None:
        init_fields(self, dest=dest, lowers=lowers, upper=upper, writable=writable, size=size)

    def validate(self, where: str) -> None:
        self._path(where, "dest")
        lowers = check_items(f"{where}.lowers", self.lowers, "host directories")
        if not lowers:
            raise SpecError(f"{where}.lowers", self.lowers, "must name at least one directory")
        if len(lowers) > MAX_OVERLAY_LOWERS:
            raise SpecError(f"{where}.lowers", f"{len(lowers)} directories",
                            f"overlayfs stacks at most {MAX_OVERLAY_LOWERS}")
        object.__setattr__(self, "lowers", tuple(normalize_path(check_path(f"{where}.lowers[{k}]", p))
                                                 for k, p in enumerate(lowers)))
        check_bool(f"{where}.writable", self.writable)
        check_positive(f"{where}.size", self.size)
        if self.upper is not None:
            self._path(where, "upper")
            if not self.writable:
                raise SpecError(f"{where}.upper", self.upper, "a read-only overlay (writable=False) has no upper")
            if self.size is not None:
                raise SpecError(f"{where}.size", self.size, "sizes the tmpfs upper; a kept upper directory has none")
        elif self.size is not None and not self.writable:
            raise SpecError(f"{where}.size", self.size, "a read-only overlay (writable=False) has no upper to size")

    def dest_path(self) -> str:
        return self.dest


MOUNT_TYPES: dict[str, type[Mount]] = {
    cls.kind: cls
    for cls in (Bind, RoBind, DevBind, Tmpfs, Proc, Dev, Mqueue, Dir, Symlink, File, RemountRo, Chmod,
                Overlay)
}


def mount_to_dict(m: Mount) -> dict[str, Any]:
    out: dict[str, Any] = {"type": m.kind}
    for f in dataclasses.fields(m):
        value = getattr(m, f.name)
        if f.name == "data":
            import base64  # only for a File, and only here and below

            out["data_base64"] = base64.b64encode(value).decode()
        else:
            out[f.name] = value
    return out


def mount_from_dict(where: str, data: object) -> Mount:
    if not isinstance(data, Mapping) or "type" not in data:
        raise SpecError(where, data, "must be an object with a 'type'")
    kind = data["type"]
    klass = MOUNT_TYPES.get(kind) if isinstance(kind, str) else None  # a list or object is no type (unhashable)
    if klass is None:
        raise SpecError(f"{where}.type", data["type"], f"unknown mount type (known: {', '.join(MOUNT_TYPES)})")
    fields = {f.name for f in dataclasses.fields(klass)}
    if klass is File:
        fields = (fields - {"data"}) | {"data_base64"}
    body = {k: v for k, v in data.items() if k != "type"}
    reject_unknown(where, body, fields)
    if "data_base64" in body:
        import base64

        try:
            body["data"] = base64.b64decode(body.pop("data_base64"), validate=True)
        except (ValueError, TypeError):
            raise SpecError(f"{where}.data_base64", data["data_base64"], "is not valid base64") from None
    try:
        return klass(**body)
    except TypeError as exc:
        raise SpecError(where, dict(data), f"missing a required key: {exc}") from None
    except SpecError as exc:  # name the mount by its position, not its kind
        field = exc.field.split(".", 1)[1] if "." in exc.field else exc.field
        raise SpecError(f"{where}.{field}", exc.value, exc.problem) from None
