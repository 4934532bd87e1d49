"""Fuzzing what callers hand the public constructors (issue 21, "bad input stays a clear error").

- The task description's JSON form, as test_fuzz_parsers.py does the Spec's:
  `task.Sandbox.from_json` of arbitrary text, arbitrary JSON and mutations of
  real descriptions' JSON yields SpecError or a description that round-trips.
- Any Python value (JSON's, and what JSON cannot hold: bytes, tuples, sets,
  paths of str or bytes, a path whose __fspath__ fails, NaN, huge ints, odd
  objects) in any one field of every public constructor (Spec, the mounts,
  Namespaces, Limits, Seccomp, ArgRule, and task's Sandbox, Bind, Layout,
  Proxy, Limits), the others valid: the value is taken, or SpecError names a
  field of that constructor. No other exception escapes.
- `Spec.from_dict` / `task.Sandbox.from_dict` of a valid form with one value
  replaced by any Python value: the same.

Bounded by max_examples (the file takes a few seconds); SANDBOX_FUZZ_SCALE=N
runs N times as many. No example database is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from conftest import BadPath, BytesPath
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox import Limits, Namespaces, Spec, task
from sandbox.errors import SpecError
from sandbox.mounts import Bind, Chmod, Dev, DevBind, Dir, File, Mqueue, Proc, RemountRo, RoBind, Symlink, Tmpfs
from sandbox.seccomp import ArgRule, Seccomp

SCALE = int(os.environ.get("SANDBOX_FUZZ_SCALE", "1"))
FUZZ = settings(max_examples=300 * SCALE, deadline=None, database=None, suppress_health_check=list(HealthCheck))

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


class Unequal:
    """Compares unequal to everything and cannot be hashed."""

    __hash__ = None  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        return False


ODD = st.sampled_from([
    object(), Unequal(), BytesPath(), BadPath(), Path("/tmp"), Path("relative"), Path("/a/../b"), math.nan,
    math.inf, -math.inf, 2**64, -(2**64), b"/tmp", bytearray(b"/tmp"), memoryview(b"/tmp"), "\ud800",
    "/\ud800", "x\0y", "9" * 5000, "²", "٣", frozenset({"a"}), {1, 2}, {1: "a"}, {("a", "b"): 1}, (("A", "b"),),
    [("A", "b")], ((8080, 80),), [[8080, "/s"]], RoBind("/usr"), Tmpfs("/tmp"), Namespaces(), Limits(),
    task.Bind("/a", "/b"), task.Limits(), task.Proxy(), Seccomp(), ArgRule("ioctl", 1, "eq", 1), ...,
])
HUGE = st.just(5000).map(lambda digits: 10**digits)  # made when drawn: its repr() raises
PY = st.recursive(
    JSON | ODD | HUGE | st.binary(max_size=12),
    lambda inner: (st.lists(inner, max_size=3) | st.tuples(inner, inner)
                   | st.frozensets(st.text(max_size=4), max_size=3)
                   | st.dictionaries(st.integers(-3, 70000) | st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)

# Each public constructor with valid arguments, and the prefix its SpecErrors name fields with.
VALID: list[tuple[type, dict[str, Any], str]] = [
    (Spec, {}, ""),
    (Bind, {"src": "/a", "dest": "/b"}, "bind."), (RoBind, {"src": "/a"}, "ro-bind."),
    (DevBind, {"src": "/dev/null"}, "dev-bind."), (Tmpfs, {"dest": "/t"}, "tmpfs."), (Proc, {}, "proc."),
    (Dev, {}, "dev."), (Mqueue, {}, "mqueue."), (Dir, {"dest": "/d"}, "dir."),
    (Symlink, {"target_path": "usr/bin", "dest": "/bin"}, "symlink."), (File, {"dest": "/f"}, "file."),
    (RemountRo, {"dest": "/r"}, "remount-ro."), (Chmod, {"path": "/c", "perms": 0o755}, "chmod."),
    (Namespaces, {}, "namespaces."), (Limits, {}, "limits."),
    (Seccomp, {}, "seccomp."), (ArgRule, {"syscall": "ioctl", "arg_index": 1, "op": "eq", "value": 0x5412}, "rule."),
    (task.Sandbox, {}, ""), (task.Bind, {"source": "/a", "target": "/b"}, "binds."),
    (task.Layout, {"outside": "/w", "inside": "/work"}, "layout."), (task.Proxy, {}, "proxy."),
    (task.Limits, {}, "limits."),
]
NAMESPACES_AND_LIMITS = {Namespaces: "namespaces.", Limits: "limits."}


def _names_a_field(err: SpecError, cls: type, prefix: str) -> bool:
    """Whether `err.field` is `prefix` + one of `cls`'s fields (then '.', '[' or nothing)."""
    if cls in NAMESPACES_AND_LIMITS and err.field.startswith(prefix):  # validate(where) prefixes the caller's name
        return True
    head = re.split(r"[.\[]", err.field[len(prefix):], maxsplit=1)[0] if err.field.startswith(prefix) else None
    return head in {f.name for f in dataclasses.fields(cls)}


@FUZZ
@given(st.sampled_from(VALID), st.data())
def test_any_value_in_any_field_is_taken_or_a_spec_error_naming_a_field(case: tuple[type, dict[str, Any], str],
                                                                      data: st.DataObject) -> None:
    cls, valid, prefix = case
    field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(cls)]))
    value = data.draw(PY)
    try:
        made = cls(**{**valid, field: value})
    except SpecError as err:
        assert _names_a_field(err, cls, prefix), (err.field, cls, field)
        assert err.problem and str(err)
        return
    hash(made)  # frozen values all the way down
    for f in dataclasses.fields(made):
        kept = getattr(made, f.name)
        assert not isinstance(kept, (list, dict, set, bytearray, memoryview, os.PathLike)), (f.name, kept)


# ---------------------------------------------------------------- the JSON forms, one value replaced

SPEC_FORM = json.loads(Spec(mounts=(RoBind("/usr"), Tmpfs("/tmp", size=1 << 20), File("/etc/motd", b"hi"),
                                    Symlink("usr/bin", "/bin")), env=(("A", "b"),), env_inherit=("HOME",),
                                cwd="/tmp", forward=((8080, 80),), probe_paths=("/root",)).to_json())
TASK_FORM = json.loads(task.Sandbox(read=("/data",), write=("/runs/1",), binds=(task.Bind("/w", "/work"),),
                                    layout=task.Layout("/w", "/work"), env=(("K", "v"),), ports=(8080,),
                                    sockets=((9000, "/run/s.sock"),), proxy=task.Proxy(("api.example.com",)),
                                    limits=task.Limits(memory_mb=512), probes=("/root",)).to_json())


def _places(doc: object, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _places(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _places(v, (*at, i))
    return out


def _replaced(doc: Any, where: tuple[Any, ...], value: object) -> Any:
    if not where:
        return value
    doc = json.loads(json.dumps(doc))
    parent = doc
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = value
    return doc


def _any_value_anywhere(cls: Any, valid: dict[str, Any], data: st.DataObject) -> None:
    """`cls.from_dict` of the form `valid` with one value replaced by any Python value: SpecError, or a
    description that round-trips through JSON."""
    where = data.draw(st.sampled_from(_places(valid)[1:]))
    form = _replaced(valid, where, data.draw(PY))
    try:
        built = cls.from_dict(form)
    except SpecError:
        return
    assert cls.from_json(built.to_json()) == built


@FUZZ
@given(st.data())
def test_spec_from_dict_with_any_value_anywhere(data: st.DataObject) -> None:
    _any_value_anywhere(Spec, SPEC_FORM, data)


@FUZZ
@given(st.data())
def test_task_from_dict_with_any_value_anywhere(data: st.DataObject) -> None:
    _any_value_anywhere(task.Sandbox, TASK_FORM, data)


# ---------------------------------------------------------------- task description JSON (as the Spec's)

def _task_accept_or_refuse(text: str | bytes) -> None:
    try:
        sb = task.Sandbox.from_json(text)
    except SpecError:
        return
    again = task.Sandbox.from_json(sb.to_json())
    assert again == sb and again.to_json() == sb.to_json()


@FUZZ
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_task_from_arbitrary_text(text: str | bytes) -> None:
    _task_accept_or_refuse(text)


@FUZZ
@given(JSON | st.dictionaries(st.sampled_from(sorted(TASK_FORM)), JSON, max_size=4))
def test_task_from_arbitrary_json(value: object) -> None:
    _task_accept_or_refuse(json.dumps(value))


@FUZZ
@given(st.data())
def test_task_from_mutated_json(data: st.DataObject) -> None:
    doc = TASK_FORM
    for _ in range(data.draw(st.integers(1, 3))):
        doc = _replaced(doc, data.draw(st.sampled_from(_places(doc))), data.draw(JSON))
    _task_accept_or_refuse(json.dumps(doc))


# ---------------------------------------------------------------- what the fuzzing found (fixed)

def test_unknown_keys_of_mixed_types_are_named() -> None:
    for build in (lambda: Spec.from_dict({"seccomp": {0: [], "": []}}), lambda: Spec.from_dict({1: 2, "a": 3})):
        try:
            build()
        except SpecError as err:
            assert "unknown key" in err.problem
        else:
            raise AssertionError("accepted")


def test_a_value_whose_repr_fails_is_still_shown() -> None:
    try:
        Spec(uid=10**5000)
    except SpecError as err:
        assert str(err) == "uid=<int object>: must be an integer between 0 and 4294967294"
    else:
        raise AssertionError("accepted")
