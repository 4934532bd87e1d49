"""The task sandbox's description: one frozen value with a JSON form.

The keys and shapes are those of a framework's sandbox layer (see docs/task.md): every key optional, `{}` a
valid description, unknown keys refused by name, and a JSON round trip gives
an equal value. Validation happens at construction and raises SpecError
naming the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

from ..errors import SpecError, shown
from ..validate import (
    JsonForm,
    StrPath,
    check_bool,
    check_env,
    check_instance,
    check_items,
    check_path,
    check_port,
    check_positive,
    check_text,
    init_fields,
    json_object,
    normalize_path,
    replaced,
)

NETWORKS = ("isolated", "open")
ENFORCE = ("required", "best_effort")
ROLES = ("task", "judge", "tool", "learner", "llm", "strict")
_D = TypeVar("_D", bound="DataclassInstance")


def _path(where: str, value: object) -> str:
    return normalize_path(check_path(where, value))


def _paths(where: str, value: object) -> tuple[str, ...]:
    return tuple(_path(f"{where}[{i}]", v) for i, v in enumerate(_list(where, value, "paths")))


def _list(where: str, value: object, what: str = "values") -> tuple[Any, ...]:
    return check_items(where, value, what)


def _names(where: str, value: object) -> tuple[str, ...]:
    out = []
    for i, v in enumerate(_list(where, value, "names")):
        check_text(f"{where}[{i}]", v)
        if not v:
            raise SpecError(f"{where}[{i}]", v, "must not be empty")
        out.append(v)
    return tuple(out)


def _choice(where: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise SpecError(where, value, f"must be one of {', '.join(allowed)}")
    return str(value)


@dataclass(frozen=True, init=False)
class Bind:
    """A host path `source` shown inside as `target`, read-only unless `writable`."""

    source: str
    target: str
    writable: bool = False

    def __init__(self, source: StrPath, target: StrPath, writable: bool = False) -> None:
        init_fields(self, source=source, target=target, writable=writable)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", _path("binds.source", self.source))
        object.__setattr__(self, "target", _path("binds.target", self.target))
        check_bool("binds.writable", self.writable)


@dataclass(frozen=True, init=False)
class Layout:
    """The working directory a learner is told about: `outside` on the host is `inside` in the sandbox."""

    outside: str
    inside: str

    def __init__(self, outside: StrPath, inside: StrPath) -> None:
        init_fields(self, outside=outside, inside=inside)

    def __post_init__(self) -> None:
        object.__setattr__(self, "outside", _path("layout.outside", self.outside))
        object.__setattr__(self, "inside", _path("layout.inside", self.inside))


@dataclass(frozen=True, init=False)
class Proxy:
    """An allowlist proxy: HTTP CONNECT and plain HTTP to `allowed_hosts` only (exact names, any port)."""

    allowed_hosts: tuple[str, ...] = ()

    def __init__(self, allowed_hosts: Iterable[str] = ()) -> None:
        init_fields(self, allowed_hosts=allowed_hosts)

    def __post_init__(self) -> None:
        hosts = _names("proxy.allowed_hosts", self.allowed_hosts)
        object.__setattr__(self, "allowed_hosts", tuple(h.lower() for h in hosts))


@dataclass(frozen=True)
class Limits:
    """Applied to the command and everything it starts (rlimits)."""

    memory_mb: int | None = None
    file_mb: int | None = None
    cpu_s: int | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_positive(f"limits.{f.name}", getattr(self, f.name))


_LIMITS = Limits()


@dataclass(frozen=True, init=False)
class Sandbox(JsonForm):
    """One sandbox of a framework, described (see the module docstring for the JSON form).

    Construction takes what a caller naturally has (lists or any iterable, a
    dict for `env` and `sockets`, a pathlib.Path for a path) and keeps it
    frozen: tuples (`env` and `sockets` as sorted pairs) and str paths."""

    json_name: ClassVar[str] = "sandbox"

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    binds: tuple[Bind, ...] = ()
    layout: Layout | None = None
    chdir: str | None = None
    packages: tuple[str, ...] = ()
    framework_package: str | None = None
    framework: bool = False
    hide: tuple[str, ...] = ()
    env_allow: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    network: str = "isolated"
    ports: tuple[int, ...] = ()
    sockets: tuple[tuple[int, str], ...] = ()
    proxy: Proxy | None = None
    limits: Limits = field(default_factory=Limits)
    enforce: str = "required"
    enabled: bool = True
    records: str | None = None
    probes: tuple[str, ...] = ()
    role: str = "task"

    def __init__(
        self,
        read: Iterable[StrPath] = (),
        write: Iterable[StrPath] = (),
        binds: Sequence[Bind] = (),
        layout: Layout | None = None,
        chdir: StrPath | None = None,
        packages: Iterable[str] = (),
        framework_package: str | None = None,
        framework: bool = False,
        hide: Iterable[str] = (),
        env_allow: Iterable[str] = (),
        env: Mapping[str, str] | Sequence[tuple[str, str]] = (),
        network: str = "isolated",
        ports: Iterable[int] = (),
        sockets: Mapping[int, StrPath] | Sequence[tuple[int, StrPath]] = (),
        proxy: Proxy | None = None,
        limits: Limits = _LIMITS,
        enforce: str = "required",
        enabled: bool = True,
        records: StrPath | None = None,
        probes: Iterable[StrPath] = (),
        role: str = "task",
    ) -> None:
        init_fields(self, read=read, write=write, binds=binds, layout=layout, chdir=chdir, packages=packages,
                    framework_package=framework_package, framework=framework, hide=hide, env_allow=env_allow,
                    env=env, network=network, ports=ports, sockets=sockets, proxy=proxy, limits=limits,
                    enforce=enforce, enabled=enabled, records=records, probes=probes, role=role)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "read", _paths("read", self.read))
        set_(self, "write", _paths("write", self.write))
        binds = _list("binds", self.binds, "sandbox.task.Bind")
        for i, b in enumerate(binds):
            if not isinstance(b, Bind):
                raise SpecError(f"binds[{i}]", b, "must be a sandbox.task.Bind")
        set_(self, "binds", binds)
        if self.layout is not None and not isinstance(self.layout, Layout):
            raise SpecError("layout", self.layout, "must be a sandbox.task.Layout or None")
        if self.chdir is not None:
            set_(self, "chdir", _path("chdir", self.chdir))
        set_(self, "packages", _names("packages", self.packages))
        if self.framework_package is not None:
            check_text("framework_package", self.framework_package)
        check_bool("framework", self.framework)
        set_(self, "hide", _names("hide", self.hide))
        set_(self, "env_allow", _names("env_allow", self.env_allow))
        set_(self, "env", check_env("env", self.env))
        _choice("network", self.network, NETWORKS)
        ports = _list("ports", self.ports, "port numbers")
        set_(self, "ports", tuple(sorted({check_port(f"ports[{i}]", p) for i, p in enumerate(ports)})))
        set_(self, "sockets", _sockets(self.sockets))
        if self.proxy is not None and not isinstance(self.proxy, Proxy):
            raise SpecError("proxy", self.proxy, "must be a sandbox.task.Proxy or None")
        if not isinstance(self.limits, Limits):
            raise SpecError("limits", self.limits, "must be a sandbox.task.Limits")
        _choice("enforce", self.enforce, ENFORCE)
        check_bool("enabled", self.enabled)
        if self.records is not None:
            set_(self, "records", _path("records", self.records))
        set_(self, "probes", _paths("probes", self.probes))
        _choice("role", self.role, ROLES)
        both = sorted(set(self.ports) & {p for p, _ in self.sockets})
        if both:
            raise SpecError("sockets", both[0], "is also in ports: an inside port forwards to one target")
        if self.network == "open" and (self.ports or self.sockets or self.proxy):
            what = "ports" if self.ports else "sockets" if self.sockets else "proxy"
            raise SpecError(what, getattr(self, what), "forwarding needs network 'isolated' ('open' is the host's)")

    # ------------------------------------------------------------ conveniences

    def replace(self, **changes: Any) -> Sandbox:
        """A copy with `changes` applied (validated again)."""
        return replaced(self, "sandbox", changes)

    def view(self, *, binds: Sequence[Bind] = (), layout: Layout | None = None) -> Sandbox:
        """A new description with its own `binds` and `layout` in place of these,
        keeping the network, proxy, environment, enforcement, records and limits."""
        return self.replace(binds=binds, layout=layout)

    @property
    def env_dict(self) -> dict[str, str]:
        """The explicit environment as a dict."""
        return dict(self.env)

    # ------------------------------------------------------------ JSON

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (every key); `Sandbox.from_dict` inverts it."""
        return {
            "read": list(self.read), "write": list(self.write),
            "binds": [dataclasses.asdict(b) for b in self.binds],
            "layout": None if self.layout is None else dataclasses.asdict(self.layout),
            "chdir": self.chdir, "packages": list(self.packages), "framework_package": self.framework_package,
            "framework": self.framework, "hide": list(self.hide), "env_allow": list(self.env_allow),
            "env": dict(self.env), "network": self.network, "ports": list(self.ports),
            "sockets": {str(p): path for p, path in self.sockets},
            "proxy": None if self.proxy is None else {"allowed_hosts": list(self.proxy.allowed_hosts)},
            "limits": {k: v for k, v in dataclasses.asdict(self.limits).items() if v is not None},
            "enforce": self.enforce, "enabled": self.enabled, "records": self.records,
            "probes": list(self.probes), "role": self.role,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sandbox:
        """Build from the JSON form; unknown keys raise SpecError naming the key."""
        kw = json_object("sandbox", data, {f.name for f in dataclasses.fields(cls)})
        if "binds" in kw:
            kw["binds"] = tuple(_sub(f"binds[{i}]", Bind, b) for i, b in enumerate(_list("binds", kw["binds"])))
        if kw.get("layout") is not None:
            kw["layout"] = _sub("layout", Layout, kw["layout"])
        if kw.get("proxy") is not None:
            kw["proxy"] = _sub("proxy", Proxy, kw["proxy"])
        if "limits" in kw:
            kw["limits"] = _sub("limits", Limits, {} if kw["limits"] is None else kw["limits"])
        for name in ("read", "write", "packages", "hide", "env_allow", "ports", "probes"):
            if name in kw:
                kw[name] = _list(name, kw[name])
        return cls(**kw)


def check_sandbox(value: object, field_name: str = "sandbox") -> Sandbox:
    """`value` if it is a task description."""
    return check_instance(field_name, value, Sandbox, "a sandbox.task.Sandbox")


def _sub(where: str, klass: type[_D], data: object) -> _D:
    kw = json_object(where, data, {f.name for f in dataclasses.fields(klass)})
    try:
        return klass(**kw)
    except TypeError as exc:
        raise SpecError(where, kw, f"missing a required key: {exc}") from None
    except SpecError as exc:
        tail = exc.field.split(".", 1)[1] if "." in exc.field else exc.field
        raise SpecError(f"{where}.{tail}", exc.value, exc.problem) from None


def _sockets(value: object) -> tuple[tuple[int, str], ...]:
    items = tuple(value.items()) if isinstance(value, Mapping) else _list("sockets", value, "(port, path) pairs")
    out: dict[int, str] = {}
    for pair in items:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise SpecError("sockets", value, "must map inside ports to Unix socket paths")
        port = check_port(f"sockets[{shown(pair[0])}]", pair[0])
        out[port] = _path(f"sockets[{port}]", pair[1])
    return tuple(sorted(out.items()))
