"""What a conformance case is: the Case record, the matchers an expectation
may use instead of a plain value, and `fill()`, which puts the session's host
paths and ids into a case before it runs (see cases.py for the cases).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox import spec as S

Path = tuple[str, ...]


# ---------------------------------------------------------------- matchers

class Matcher:
    """An expectation that is not a plain value."""

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        raise NotImplementedError


@dataclass(frozen=True)
class Contains(Matcher):
    """The observed list (or dict, or string) contains `item`."""

    item: Any

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return value is not None and self.item in value


@dataclass(frozen=True)
class ContainsAll(Matcher):
    """The observed list contains every one of `items`."""

    items: tuple[Any, ...]

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return isinstance(value, list) and all(item in value for item in self.items)


@dataclass(frozen=True)
class Lacks(Matcher):
    """The observed list (or dict) does not contain `item`."""

    item: Any

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return value is None or self.item not in value


@dataclass(frozen=True)
class SubsetOf(Matcher):
    """Every element of the observed list is one of `items` or one of the host's values at `host_keys`."""

    items: tuple[Any, ...] = ()
    host_keys: tuple[str, ...] = ()

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        allowed = {*self.items, *(ctx[key] for key in self.host_keys)}
        return isinstance(value, list) and set(value) <= allowed


@dataclass(frozen=True)
class Prefix(Matcher):
    """The observed list starts with `items`."""

    items: tuple[Any, ...]

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return isinstance(value, list) and value[:len(self.items)] == list(self.items)


@dataclass(frozen=True)
class EndsWith(Matcher):
    """A string that ends with `suffix`."""

    suffix: str

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return isinstance(value, str) and value.endswith(self.suffix)


@dataclass(frozen=True)
class Greater(Matcher):
    """A number greater than `than`."""

    than: int

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return isinstance(value, int) and value > self.than


@dataclass(frozen=True)
class CountedOn(Matcher):
    """[1, n] or [1, m, n], n > 2: pid 1, where there is one its command maker (m), and a command whose
    pid number kept counting (a recycled Template sandbox's, csrc/template/template_maker.c)."""

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return isinstance(value, list) and len(value) in (2, 3) and value[0] == 1 and value[-1] > 2 and (
            len(value) == 2 or 1 < value[1] < value[2])


@dataclass(frozen=True)
class HostValue(Matcher):
    """Equal to ctx[key] (what the host sees); with differ=True, a value of the
    same type that is not equal (so an error report never passes for "new")."""

    key: str
    differ: bool = False

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        host = ctx[self.key]
        if self.differ:
            return type(value) is type(host) and bool(value != host)
        return bool(value == host)


@dataclass(frozen=True)
class InHost(Matcher):
    """True if `item` is among the host's values at `key`, else False."""

    item: Any
    key: str

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return value is (self.item in ctx[self.key])


@dataclass(frozen=True)
class WithHost(Matcher):
    """Exactly `items` and the host's values at `key`, sorted, each once."""

    items: tuple[Any, ...]
    key: str

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return bool(value == sorted({*self.items, *ctx[self.key]}))


@dataclass(frozen=True)
class OneOf(Matcher):
    """Any of `values`."""

    values: tuple[Any, ...]

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return value in self.values


@dataclass(frozen=True)
class Plus(Matcher):
    """A dict of exactly `items` plus the keys `extra` (whatever their values)."""

    items: Mapping[str, Any]
    extra: tuple[str, ...]

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return (isinstance(value, dict) and set(value) == {*self.items, *self.extra}
                and all(value[k] == v for k, v in self.items.items()))


@dataclass(frozen=True)
class AbsentOr(Matcher):
    """None (the thing observed does not exist on this host), or what `then` accepts."""

    then: Matcher

    def matches(self, value: Any, ctx: Mapping[str, Any]) -> bool:
        return value is None or self.then.matches(value, ctx)


# ---------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    """One conformance case (see cases.py's docstring)."""

    name: str
    mounts: tuple[S.Mount, ...] = ()
    spec: Mapping[str, Any] = field(default_factory=dict)
    request: Mapping[str, Any] = field(default_factory=dict)
    expect: Mapping[Path, Any] = field(default_factory=dict)
    returncode: int | tuple[int, ...] = 0  # a tuple: any of these
    error: tuple[str, Mapping[str, Any]] | None = None  # (exception class name, attributes)
    argv: tuple[str, ...] | None = None  # instead of the probe
    base: bool = True  # add the base world
    root_only: bool = False
    nonroot_only: bool = False
    host_cwd: str | None = None  # run with this host cwd
    host_umask: int | None = None  # run with this umask in the caller
    pass_fd: bool = False  # pass an extra pipe fd to the command
    host_env: Mapping[str, str] = field(default_factory=dict)  # added to the caller's environ
    leak_fd: bool = False  # the caller holds an inheritable fd (LEAKED_FD) that must not get in
    probe_on_host: bool = False  # run the probe from its host path (for worlds without the base)
    host_ignores: tuple[int, ...] = ()  # signals the caller ignores while it spawns
    host_blocks: tuple[int, ...] = ()  # signals the spawning thread blocks meanwhile
    # A fresh host directory for each run, made from this tree (as HOST_TREE)
    # at "/{scratch}", and the paths in it (relative) that the host looks at
    # afterwards; what it sees is the report's "host" section.
    scratch: Mapping[str, str | None] | None = None
    host_paths: tuple[str, ...] = ()
    # Documented backend differences: backend -> key paths whose expectation
    # does not hold there (and that the differential test ignores).
    differs: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)
    # backend -> expectations that hold there instead of `expect`'s at the same
    # key paths; the pseudo-path ("returncode",) replaces `returncode`.
    expect_on: Mapping[str, Mapping[Path, Any]] = field(default_factory=dict)
    # backend -> why its `differs` and `expect_on` entries hold (a "workerpool"
    # entry must say why: WorkerPool runs a function, not a command).
    why: Mapping[str, str] = field(default_factory=dict)
    # backend -> the Spec field it refuses the case's Spec for, by design (it
    # raises SpecError naming that field; the case's expectations do not apply).
    refused: Mapping[str, str] = field(default_factory=dict)
    # backend -> the capability (a sandbox.capabilities.Capability name) the case's Spec needs and the
    # backend lacks: sandbox.refusal raises UnavailableError with the backend's reason, before anything runs.
    unavailable: Mapping[str, str] = field(default_factory=dict)
    # backend -> why the case has no meaning there (it is skipped, saying why).
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    # Known bugs: backend -> description; the case is expected to fail there (xfail, not strict).
    known_bug: Mapping[str, str] = field(default_factory=dict)


def ro(src: str, dest: str | None = None, optional: bool = False) -> S.RoBind:
    return S.RoBind(src, dest, optional)


def rw(src: str, dest: str | None = None, optional: bool = False) -> S.Bind:
    return S.Bind(src, dest, optional)


def fill(value: Any, ctx: Mapping[str, Any]) -> Any:
    """`value` with "/{host}", "/{scratch}", "{uid}", "{gid}" and "{wp_uid_outside}" substituted in every
    string, recursively."""
    if isinstance(value, str):
        value = value.replace("/{host}", str(ctx["host"]))
        if "scratch" in ctx:
            value = value.replace("/{scratch}", str(ctx["scratch"]))
        for key in ("uid", "gid", "wp_uid_outside"):
            value = value.replace("{" + key + "}", str(ctx[key]))
        return value
    if isinstance(value, tuple):
        return tuple(fill(v, ctx) for v in value)
    if isinstance(value, list):
        return [fill(v, ctx) for v in value]
    if isinstance(value, dict):
        return {fill(k, ctx): fill(v, ctx) for k, v in value.items()}
    if isinstance(value, S.Mount):
        changes = {f.name: fill(getattr(value, f.name), ctx) for f in dataclasses.fields(value)
                   if isinstance(getattr(value, f.name), (str, tuple))}  # an Overlay's lowers: a tuple
        return dataclasses.replace(value, **changes)
    if isinstance(value, Matcher) and dataclasses.is_dataclass(value):
        return dataclasses.replace(value, **{f.name: fill(getattr(value, f.name), ctx)
                                             for f in dataclasses.fields(value)})
    return value
