"""The sandbox description: frozen, validated, pure data with a JSON round trip.

A Spec says what the sandboxed command sees. It does no I/O; validation
happens at construction and raises SpecError naming the field and value.
Mounts use bubblewrap's vocabulary and are applied in order inside an empty
root: a path that no mount declares does not exist in the sandbox.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from .seccomp import Seccomp

from .errors import SpecError, shown
from .mounts import (
    MOUNT_TYPES,
    Bind,
    Chmod,
    Dev,
    DevBind,
    Dir,
    File,
    Mount,
    Mqueue,
    Overlay,
    Proc,
    RemountRo,
    RoBind,
    Symlink,
    Tmpfs,
    mount_from_dict,
    mount_to_dict,
)
from .validate import (
    JsonForm,
    StrPath,
    as_text,
    check_bool,
    check_env,
    check_items,
    check_path,
    check_perms,
    check_port,
    check_positive,
    check_text,
    init_fields,
    json_object,
    normalize_path,
    replaced,
)

__all__ = [
    "CAPABILITIES", "MAX_HOSTNAME", "MAX_ID", "MOUNT_TYPES", "NETWORK_MODES", "Bind", "Chmod", "Dev", "DevBind",
    "Dir", "File", "Limits", "Mount", "Mqueue", "Namespaces", "Overlay", "Proc", "RemountRo", "RoBind", "Spec",
    "Symlink", "Tmpfs",
    "check_bool", "check_path", "check_perms", "check_positive", "check_text", "normalize_path",
]

# Capability names in kernel numbering order (linux/capability.h). Index = number.
CAPABILITIES: tuple[str, ...] = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)

# "none": a private network namespace with only lo; "pool": the same, leased
# from a pool of pre-made ones (sandbox.netpool) where the backend can;
# "host": the caller's network.
NETWORK_MODES = ("none", "pool", "host")
MAX_ID = 2**32 - 2  # (uid_t)-1 is "no id"
MAX_HOSTNAME = 64
_D = TypeVar("_D", bound="DataclassInstance")


# ---------------------------------------------------------------- other parts

@dataclass(frozen=True)
class Namespaces:
    """Which namespaces the sandbox gets. The network namespace is `Spec.network`."""

    user: bool = True
    mount: bool = True
    pid: bool = True
    ipc: bool = True
    uts: bool = True
    cgroup: bool = True

    def __post_init__(self) -> None:
        self.validate("namespaces")

    def validate(self, where: str) -> None:
        for f in dataclasses.fields(self):
            check_bool(f"{where}.{f.name}", getattr(self, f.name))


@dataclass(frozen=True)
class Limits:
    """Resource limits of the sandbox (not of the uid).

    memory_mb: the sandbox's resident memory, swap included where the host
    has swap (a cgroup's memory limit); nproc: the number of tasks in the
    sandbox, whatever their uid (a cgroup's pids limit); cpu_cores: a CPU
    bandwidth cap (0.5: half of one CPU; a cgroup's CPU quota). Where no
    cgroup can be made (see sandbox.cgroups) memory_mb falls back to
    RLIMIT_DATA, nproc to RLIMIT_NPROC (the uid's processes) and cpu_cores to
    nothing, and the result's `usage.mechanism` says so; require_cgroups=True
    refuses to start instead, naming why.

    Rlimits (soft = hard, per process): cpu_s: CPU seconds (RLIMIT_CPU);
    address_space_mb: address space (RLIMIT_AS; breaks runtimes that reserve
    more than they touch: V8, the JVM, Go); file_mb: largest file written
    (RLIMIT_FSIZE); nofile: open fds (RLIMIT_NOFILE); file_bytes:
    RLIMIT_FSIZE to the byte (the smaller of the two file limits wins).
    """

    cpu_s: int | None = None
    memory_mb: int | None = None
    file_mb: int | None = None
    nofile: int | None = None
    nproc: int | None = None
    file_bytes: int | None = None
    address_space_mb: int | None = None
    cpu_cores: float | None = None
    require_cgroups: bool = False

    def __post_init__(self) -> None:
        self.validate("limits")

    def validate(self, where: str) -> None:
        for f in dataclasses.fields(self):
            if f.name == "cpu_cores":
                value = self.cpu_cores
                if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                          or not 0.001 <= value <= 65536):
                    raise SpecError(f"{where}.cpu_cores", value, "must be a number of CPUs from 0.001 up")
            elif f.name == "require_cgroups":
                check_bool(f"{where}.require_cgroups", self.require_cgroups)
            else:
                check_positive(f"{where}.{f.name}", getattr(self, f.name))


def _forwards(value: object, network: str) -> tuple[tuple[int, int | str], ...]:
    """Validate `forward` (inside port -> host loopback port or Unix socket path)."""
    what = "must map inside ports to host ports or Unix socket paths"
    if isinstance(value, Mapping):
        pairs: tuple[Any, ...] = tuple(value.items())
    else:
        pairs = check_items("forward", value, "(inside port, host port or socket path) pairs, or a mapping")
    out: dict[int, int | str] = {}
    for pair in pairs:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise SpecError("forward", value, what)
        port = check_port(f"forward[{shown(pair[0])}]", pair[0])
        target = as_text(pair[1])
        if isinstance(target, str):
            target = check_path(f"forward[{port}]", target)
        elif isinstance(target, bool) or not isinstance(target, int) or not 1 <= target <= 65535:
            raise SpecError(f"forward[{port}]", target, "must be a host port (1-65535) or a Unix socket path")
        out[port] = target
    if out and network == "host":
        raise SpecError("forward", value, "needs a network namespace of the sandbox's own (network 'none' or 'pool')")
    return tuple(sorted(out.items()))


def _strings(value: object, where: str) -> tuple[str, ...]:
    return tuple(check_text(f"{where}[{i}]", v) for i, v in enumerate(check_items(where, value, "strings")))


_NAMESPACES = Namespaces()
_LIMITS = Limits()


class _DefaultPolicy:
    """What Spec's `seccomp` defaults to: sandbox.seccomp.DEFAULT_POLICY, which
    a Spec takes on construction. Only a Spec that keeps the default imports
    the seccomp package (a policy, its assembler and the syscall table): the
    command line's Specs, without a filter as bwrap's, never load it."""

    def __repr__(self) -> str:
        return "sandbox.seccomp.DEFAULT_POLICY"


# Typed as what a Spec holds once constructed: the default policy.
_DEFAULT_POLICY: Seccomp = _DefaultPolicy()  # type: ignore[assignment]


@dataclass(frozen=True, init=False)
class Spec(JsonForm):
    """What a sandboxed command sees. Pure data; validated on construction.

    The defaults are the safe ones: every namespace, no network but loopback,
    an empty root (declare mounts), an empty environment, no capabilities.

    Construction takes what a caller naturally has (a list of mounts, a dict
    for `env` and `forward`, any iterable of names, a pathlib.Path for a path)
    and keeps it frozen: tuples (`env` and `forward` as sorted pairs) and str
    paths. A wrong value raises SpecError naming the field and what it accepts.
    """

    json_name: ClassVar[str] = "spec"

    mounts: tuple[Mount, ...] = ()
    namespaces: Namespaces = field(default_factory=Namespaces)
    network: str = "none"
    hostname: str | None = None
    uid: int | None = None
    gid: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    env_inherit: tuple[str, ...] = ()
    cwd: str | None = None
    limits: Limits = field(default_factory=Limits)
    die_with_parent: bool = True
    new_session: bool = True
    as_pid_1: bool = False
    cap_add: tuple[str, ...] = ()
    seccomp: Seccomp | None = _DEFAULT_POLICY
    disable_userns: bool = False
    landlock: bool | str = False
    probe_paths: tuple[str, ...] = ()
    forward: tuple[tuple[int, int | str], ...] = ()
    # inspect the network namespace from the host before the command runs (on whenever `forward` is set)
    check_network: bool = False

    def __init__(
        self,
        mounts: Sequence[Mount] = (),
        namespaces: Namespaces = _NAMESPACES,
        network: str = "none",
        hostname: str | None = None,
        uid: int | None = None,
        gid: int | None = None,
        env: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        env_inherit: Iterable[str] = (),
        cwd: StrPath | None = None,
        limits: Limits = _LIMITS,
        die_with_parent: bool = True,
        new_session: bool = True,
        as_pid_1: bool = False,
        cap_add: Iterable[str] = (),
        seccomp: Seccomp | None = _DEFAULT_POLICY,
        disable_userns: bool = False,
        landlock: bool | str = False,
        probe_paths: Iterable[StrPath] = (),
        forward: Mapping[int, int | StrPath] | Sequence[tuple[int, int | StrPath]] = (),
        check_network: bool = False,
        *,
        check: bool | None = None,
    ) -> None:
        """The fields as the class names them; `check` is `check_network`'s old name, still taken."""
        check_network = _renamed("check", check, "check_network", check_network)
        init_fields(self, mounts=mounts, namespaces=namespaces, network=network, hostname=hostname, uid=uid, gid=gid,
                    env=env, env_inherit=env_inherit, cwd=cwd, limits=limits, die_with_parent=die_with_parent,
                    new_session=new_session, as_pid_1=as_pid_1, cap_add=cap_add, seccomp=seccomp,
                    disable_userns=disable_userns, landlock=landlock, probe_paths=probe_paths, forward=forward,
                    check_network=check_network)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if isinstance(self.mounts, (str, bytes)) or not isinstance(self.mounts, Sequence):
            raise SpecError("mounts", self.mounts, "must be a list of mount operations (Bind, Tmpfs, ...), in order")
        set_(self, "mounts", tuple(self.mounts))
        for i, m in enumerate(self.mounts):
            if not isinstance(m, Mount) or type(m) is Mount:
                raise SpecError(f"mounts[{i}]", m, "must be a mount operation (Bind, Tmpfs, ...)")
            m.validate(f"mounts[{i}]")
        self._check_destinations()
        if not isinstance(self.namespaces, Namespaces):
            raise SpecError("namespaces", self.namespaces, "must be a Namespaces")
        self.namespaces.validate("namespaces")
        if not isinstance(self.network, str) or self.network not in NETWORK_MODES:
            raise SpecError("network", self.network, f"must be one of {', '.join(NETWORK_MODES)}")
        self._check_identity()
        set_(self, "env", check_env("env", self.env))
        set_(self, "env_inherit", _strings(self.env_inherit, "env_inherit"))
        if self.cwd is not None:
            set_(self, "cwd", normalize_path(check_path("cwd", self.cwd)))
        if not isinstance(self.limits, Limits):
            raise SpecError("limits", self.limits, "must be a Limits")
        self.limits.validate("limits")
        for name in ("die_with_parent", "new_session", "as_pid_1", "disable_userns"):
            check_bool(name, getattr(self, name))
        self._check_seccomp()
        set_(self, "probe_paths", tuple(normalize_path(check_path(f"probe_paths[{i}]", p))
                                  for i, p in enumerate(check_items("probe_paths", self.probe_paths, "paths"))))
        set_(self, "forward", _forwards(self.forward, self.network))
        check_bool("check_network", self.check_network)
        if not isinstance(self.landlock, (bool, str)) or self.landlock not in (False, True, "best-effort"):
            raise SpecError("landlock", self.landlock, "must be false, true or 'best-effort'")
        if self.disable_userns and not self.namespaces.user:
            raise SpecError("disable_userns", True, "needs a user namespace (namespaces.user=True)")
        if self.as_pid_1 and not self.namespaces.pid:
            raise SpecError("as_pid_1", True, "needs a pid namespace (namespaces.pid=True)")
        set_(self, "cap_add", tuple(_cap_name(c) for c in _strings(self.cap_add, "cap_add")))
        if self.mounts and not self.namespaces.mount:
            raise SpecError("namespaces.mount", False, "mounts need a mount namespace")

    def _check_seccomp(self) -> None:
        """The default's placeholder replaced by the default policy; any other value a Seccomp or None."""
        if self.seccomp is None:
            return
        if isinstance(self.seccomp, _DefaultPolicy):
            # lazy: a Spec without a filter loads no seccomp (test_cold_path's plain run): 5 ms
            from .seccomp import DEFAULT_POLICY

            object.__setattr__(self, "seccomp", DEFAULT_POLICY)
        from .seccomp import Seccomp  # lazy: as above: a Spec without a filter loads no seccomp: 3 ms

        if not isinstance(self.seccomp, Seccomp):
            raise SpecError("seccomp", self.seccomp, "must be a sandbox.seccomp.Seccomp or None")

    def _check_destinations(self) -> None:
        """Reject two operations that create the same path, or one under a file or link."""
        made: dict[str, tuple[int, Mount]] = {}
        for i, m in enumerate(self.mounts):
            if not m.creates():
                continue
            dest = m.dest_path()
            if dest in made and not _can_overmount(made[dest][1], m):
                j = made[dest][0]
                raise SpecError(f"mounts[{i}].dest", dest, f"conflicts with mounts[{j}] ({made[dest][1].kind})")
            if dest in made and isinstance(made[dest][1], Symlink) and _link_target(dest, made) is None:
                raise SpecError(f"mounts[{i}].dest", dest, f"the symlink of mounts[{made[dest][0]}] must be relative "
                                "and lead to a path inside the sandbox for a mount to follow it")
            for parent, (j, pm) in made.items():
                if isinstance(pm, (Symlink, File)) and dest.startswith(parent + "/"):
                    raise SpecError(f"mounts[{i}].dest", dest, f"lies under the {pm.kind} of mounts[{j}]")
            made[dest] = (i, m)

    def _check_identity(self) -> None:
        for name in ("uid", "gid"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
                raise SpecError(name, value, f"must be an integer between 0 and {MAX_ID}")
            if not self.namespaces.user:
                raise SpecError(name, value, "needs a user namespace (namespaces.user=True)")
        if self.hostname is not None:
            check_text("hostname", self.hostname)
            if not self.hostname or len(self.hostname) > MAX_HOSTNAME or "/" in self.hostname:
                raise SpecError("hostname", self.hostname, f"must be 1 to {MAX_HOSTNAME} characters without '/'")
            if not self.namespaces.uts:
                raise SpecError("hostname", self.hostname, "needs a UTS namespace (namespaces.uts=True)")

    # ------------------------------------------------------------ conveniences

    @property
    def env_dict(self) -> dict[str, str]:
        """The declared environment as a dict."""
        return dict(self.env)

    @property
    def check(self) -> bool:
        """`check_network`, by its old name."""
        return self.check_network

    def replace(self, **changes: Any) -> Spec:
        """A copy with `changes` applied (validated again); `check` is `check_network`'s old name."""
        if "check" in changes:
            changes = dict(changes)
            changes["check_network"] = _renamed("check", changes.pop("check"), "check_network",
                                                changes.get("check_network"))
        return replaced(self, "spec", changes)

    # ------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `Spec.from_dict` inverts it."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "mounts":
                value = [mount_to_dict(m) for m in value]
            elif f.name in ("namespaces", "limits"):
                value = dataclasses.asdict(value)
            elif f.name == "seccomp":
                value = None if value is None else value.to_dict()
            elif f.name == "env":
                value = dict(value)
            elif f.name == "forward":
                value = {str(port): target for port, target in value}
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Spec:
        """Build a Spec from `to_dict` output; unknown keys raise SpecError by name."""
        kwargs = json_object("spec", data, {"check", *(f.name for f in dataclasses.fields(cls))})
        if "mounts" in kwargs:
            if not isinstance(kwargs["mounts"], (list, tuple)):
                raise SpecError("mounts", kwargs["mounts"], "must be a list")
            kwargs["mounts"] = tuple(mount_from_dict(f"mounts[{i}]", m) for i, m in enumerate(kwargs["mounts"]))
        if "namespaces" in kwargs:
            kwargs["namespaces"] = _sub_from_dict("namespaces", Namespaces, kwargs["namespaces"])
        if "limits" in kwargs:
            kwargs["limits"] = _sub_from_dict("limits", Limits, kwargs["limits"])
        if kwargs.get("seccomp") is not None:
            from .seccomp import Seccomp  # lazy: as in _check_seccomp: no seccomp without a filter: 3 ms

            kwargs["seccomp"] = Seccomp.from_dict(kwargs["seccomp"], where="seccomp")
        return cls(**kwargs)


def _renamed(old: str, old_value: Any, new: str, new_value: Any) -> Any:
    """The value of a field given by its `old` name (None: not given) or its `new` one; SpecError if the two
    disagree."""
    if old_value is None:
        return new_value
    if new_value not in (False, None) and new_value != old_value:
        raise SpecError(old, old_value, f"is {new}'s old name: give one of them")
    return old_value


def _link_target(path: str, made: Mapping[str, tuple[int, Mount]], depth: int = 0) -> str | None:
    """Where `path` leads through the symlinks of `made` (normalized), or None
    if a link on the way is absolute or climbs above the root: only such a
    target names the same place under either backend (bwrap resolves a
    destination against its intermediate root, where the host's is visible)."""
    parts: list[str] = []
    for name in path.strip("/").split("/"):
        if name in ("", "."):
            continue
        if name == "..":
            if not parts:
                return None
            parts.pop()
            continue
        parts.append(name)
        here = "/" + "/".join(parts)
        link = made.get(here, (0, None))[1]
        if isinstance(link, Symlink):
            if link.target_path.startswith("/") or depth >= MAX_LINKS:
                return None
            target = _link_target("/".join(parts[:-1]) + "/" + link.target_path, made, depth + 1)
            if target is None:
                return None
            parts = [p for p in target.strip("/").split("/") if p]
    return "/" + "/".join(parts)


MAX_LINKS = 40  # as the kernel's limit on links followed in one lookup


def _can_overmount(earlier: Mount, later: Mount) -> bool:
    """Whether `later` may act on the path `earlier` created.

    A mount may cover an earlier directory or mount (`--dir /x --tmpfs /x`,
    `--ro-bind / / --tmpfs /`), and a bind may cover an earlier file; `Dir`
    on an existing directory keeps it. On an earlier symlink (or under one),
    the destination is resolved through the link inside the sandbox, as bwrap
    does (`--dir /d --symlink d /l --bind /etc /l`; see `_link_target`). A file
    may replace an earlier writable file, as bwrap's `--file` then
    `--ro-bind-data` on one path (Flatpak's /.flatpak-info): the later wins
    (sandbox.plan.files_over_files). Nothing replaces a symlink (bwrap 0.8.0
    fails even on an identical one) nor a read-only file (bwrap fails on
    those too), and no file or link is created where something else is."""
    if isinstance(later, File):
        return isinstance(earlier, File) and not earlier.readonly
    if isinstance(later, Symlink):
        return False
    if isinstance(earlier, Symlink):
        return True
    if isinstance(later, Dir):
        return not isinstance(earlier, File)
    if isinstance(earlier, File):
        return isinstance(later, Bind)
    return True


def _cap_name(name: str) -> str:
    upper = name.upper()
    full = upper if upper.startswith("CAP_") else "CAP_" + upper
    if full not in CAPABILITIES:
        raise SpecError("cap_add", name, "is not a capability name this kernel knows")
    return full


def _sub_from_dict(where: str, klass: type[_D], data: object) -> _D:
    return klass(**json_object(where, data, {f.name for f in dataclasses.fields(klass)}))
