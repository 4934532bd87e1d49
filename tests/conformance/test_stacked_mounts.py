"""Every mount type over every other at the same destination, on every executor.

A Spec may stack two operations at one path (`presets.minimal_system(Bind(dir,
"/tmp"))` puts a Bind over the preset's Tmpfs). What the command then sees at
that path (the file's type, mode and content, the topmost mount's type and
flags, whether it can write there, or the error that refuses the Spec) must be
the same on every executor as on native, and native's must be bubblewrap's.
Each executor that builds part of a sandbox ahead (a Template, a recycled one,
a WorkerPool's zygote) splits such a stack between what it builds once and
what each sandbox makes afresh; this is the test of that split.

The differences that hold by design are declared in DIFFERS (what is
ignored, and why) and REFUSED (an executor that refuses the Spec, and why);
a disagreement not yet fixed, in KNOWN (the test is then an expected failure).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox import spec as S

from . import probe
from .test_conformance import BACKENDS, BASE_WORLD, PYTHON, available, require, run_in_template

pytestmark = pytest.mark.integration

DEST = "/stack"
REQUEST = json.dumps({"paths": [DEST], "writable": [DEST], "mounts": [DEST]})
# The host tree the binds and overlays name: a directory per role (what lies
# below, what goes on top), each holding a file named after it.
ROLES = ("lower", "upper")

MountMaker = Callable[[str, str], S.Mount]  # (role, host directory) -> the operation at DEST
MAKERS: dict[str, MountMaker] = {
    "bind": lambda role, host: S.Bind(f"{host}/{role}", DEST),
    "ro-bind": lambda role, host: S.RoBind(f"{host}/{role}", DEST),
    "dev-bind": lambda role, host: S.DevBind(f"{host}/{role}", DEST),
    "tmpfs": lambda role, host: S.Tmpfs(DEST, perms=0o750 if role == "lower" else 0o710),
    "proc": lambda role, host: S.Proc(DEST),
    "dev": lambda role, host: S.Dev(DEST),
    "mqueue": lambda role, host: S.Mqueue(DEST),
    "dir": lambda role, host: S.Dir(DEST, perms=0o750 if role == "lower" else 0o710),
    "overlay": lambda role, host: S.Overlay(DEST, [f"{host}/layer-{role}"]),
    "file": lambda role, host: S.File(DEST, f"{role}\n", perms=0o640),
    "symlink": lambda role, host: S.Symlink(f"{role}-target", DEST),
}
# Modifiers act on what is there: only on top.
UPPER_ONLY: dict[str, MountMaker] = {
    "remount-ro": lambda role, host: S.RemountRo(DEST),
    "chmod": lambda role, host: S.Chmod(DEST, 0o701),
}
EXECUTORS = tuple(b for b in BACKENDS if b != "native")
WARM = ("template", "template-recycle", "workerpool")  # the executors that build part of a sandbox ahead


def accepted(lower: str, upper: str) -> bool:
    """Whether a Spec takes `upper` over `lower` (some stacks are refused by
    the Spec itself, alike for every executor: a File over a directory...)."""
    try:
        build(lower, upper, "/nonexistent-host")
    except S.SpecError:
        return False
    return True


ANY = "*"
# The differences that hold by design: (executors, lower, upper, keys of
# observe() ignored there, why); ANY matches every type.
DIFFERS: list[tuple[tuple[str, ...], str, str, tuple[str, ...], str]] = [
    (WARM, ANY, "dev", ("flags", "writable"),
     "its Dev is one tmpfs built once and shared by its sandboxes: read-only in each (each has its own shm and pts)"),
    (WARM, "dev", "dir", ("flags", "writable"), "the same Dev, still in view"),
    (WARM, "dev", "chmod", ("flags", "writable"), "the same Dev, still in view"),
    (WARM, "dir", "dir", ("writable",),
     "its root is one tmpfs built once and shared by its sandboxes: read-only in each, its directories too"),
    (WARM, "dir", "chmod", ("writable",), "the same shared root"),
    (("workerpool",), ANY, "overlay", ("flags", "writable"),
     "a WorkerPool zygote's Overlay is one mount shared by its tasks: read-only in them"),
    (("workerpool",), "overlay", "dir", ("flags", "writable"), "the same shared Overlay, still in view"),
    (("workerpool",), "overlay", "chmod", ("flags", "writable"), "the same shared Overlay, still in view"),
    (WARM, "file", "chmod", ("fstype", "flags"),
     "a writable File is each sandbox's private copy, bound over the template's: a mount point there"),
    (WARM, "file", "file", ("fstype", "flags"),
     "the upper writable File is each sandbox's private copy too, bound over the template's"),
]
# Executors that refuse a type anywhere in a Spec: executor -> {type: (the error, why)}.
REFUSED: dict[str, dict[str, tuple[str, str]]] = {
    "bwrap": {"overlay": ("UnavailableError", "bubblewrap mounts no overlayfs of host directories")},
    "template-recycle": {"overlay": ("UnavailableError", "a recycled sandbox's pid 1 cannot make its overlay root "
                                                         "again (refusal.NEEDS, backends.template.RECYCLE_TRAITS)")},
}
# Known disagreements, written down until fixed: (executor, lower, upper) -> what.
KNOWN: dict[tuple[str, str, str], str] = {
    ("bwrap", "symlink", "dir"): ("bubblewrap's --dir over a dangling symlink does nothing (mkdir's EEXIST is "
                                  "taken as done); native fails the setup"),
    ("bwrap", "mqueue", "mqueue"): "bubblewrap fails to mount an mqueue over another; native stacks it",
}


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("stacked-mounts")
    for role in ROLES:
        for name in (role, f"layer-{role}"):
            (root / name).mkdir()
            (root / name / f"{name}-file").write_text(f"{name}\n")
            (root / name).chmod(0o755)
    for parent in root.parents:  # reachable by the sandbox's uid
        if parent == Path("/") or parent.stat().st_mode & 0o005 == 0o005:
            break
        if parent.stat().st_uid == os.getuid():
            parent.chmod(parent.stat().st_mode | 0o005)
    root.chmod(0o755)
    yield str(root)


def build(lower: str, upper: str, host: str) -> S.Spec:
    on_top = {**MAKERS, **UPPER_ONLY}[upper]
    mounts = (*BASE_WORLD, S.Proc(), S.Dev(), MAKERS[lower]("lower", host), on_top("upper", host))
    return S.Spec(mounts=mounts)


def report_on(executor: str, spec: S.Spec, binds: tuple[S.Bind, ...] = ()) -> dict[str, Any]:
    """The probe's report on `executor`, or {"error": the exception's class
    name}; `binds`: a call's own (Template.run's, WorkerPool.submit_task's)."""
    try:
        if executor in ("template", "template-recycle"):
            result = in_template(spec, binds, recycle=executor == "template-recycle")
        elif executor == "workerpool":
            with sandbox.WorkerPool(spec, 1, timeout=60) as pool:
                text: str = pool.submit_task(probe.task, (REQUEST,), binds=binds).result()
            return dict(json.loads(text))
        else:
            result = sandbox.run([PYTHON, "-I", "-S", "/probe.py", REQUEST], spec, capture_output=True,
                                 backend=executor, timeout=60)
    except sandbox.SandboxError as exc:
        return {"error": type(exc).__name__}
    except pytest.skip.Exception as exc:  # a Template refusing this Spec (run_in_template skips)
        return {"error": "UnavailableError", "why": str(exc)}
    assert result.returncode == 0 and result.stdout, f"{executor}: {result.returncode} {result.stderr!r}"
    return dict(json.loads(result.stdout))


def in_template(spec: S.Spec, binds: tuple[S.Bind, ...], recycle: bool) -> sandbox.CompletedProcess:
    argv = [PYTHON, "-I", "-S", "/probe.py", REQUEST]
    if not binds:
        return run_in_template(spec, argv, [], recycle=recycle)
    with sandbox.Template(spec, recycle=recycle) as template:
        template.run(["/bin/true"], binds=binds, timeout=60)  # (recycled: a sandbox that served a call first)
        return template.run(argv, binds=binds, capture_output=True, timeout=60)


def observe(report: dict[str, Any]) -> dict[str, Any]:
    """What the command saw at DEST: its type, mode, entries (not a procfs's:
    its pids) or content, the topmost mount's type and flags, and whether it
    could write there; or the error."""
    if "error" in report:
        return report
    path = report["paths"][DEST]
    top = (report["mounts"].get("points") or {}).get(DEST) or {}
    seen = {"type": path.get("type"), "mode": path.get("mode"), "content": path.get("content"),
            "target": path.get("target"), "fstype": top.get("fstype"), "flags": top.get("flags"),
            "writable": report["writable"][DEST]}
    if top.get("fstype") != "proc":
        seen["entries"] = path.get("entries")
    return seen


def ignored(executor: str, lower: str, upper: str) -> set[str]:
    """The keys of observe() that DIFFERS lets differ from native's."""
    return {key for names, low, up, keys, _ in DIFFERS if executor in names and low in (ANY, lower)
            and up in (ANY, upper) for key in keys}


def differences(want: dict[str, Any], got: dict[str, Any], executor: str, lower: str, upper: str) -> list[str]:
    skip = ignored(executor, lower, upper)
    return [f"{executor}: {key}: native={want.get(key)!r} {executor}={got.get(key)!r}"
            for key in sorted(set(want) | set(got)) if key not in skip and want.get(key) != got.get(key)]


def agree(native: dict[str, Any], executors: tuple[str, ...], lower: str, upper: str, kinds: tuple[str, ...],
          seen_on: Callable[[str], dict[str, Any]]) -> None:
    """Each available executor saw (`seen_on(executor)`) what native saw, or refused with the error REFUSED
    declares for one of the mount `kinds` it was given; a KNOWN difference is an xfail, any other a failure."""
    failures, known = [], []
    for executor in executors:
        if not available(executor)[0]:
            continue
        seen = seen_on(executor)
        refused = {REFUSED[executor][kind][0] for kind in kinds if kind in REFUSED.get(executor, {})}
        if refused:
            found = [] if seen.get("error") in refused else [f"{executor}: should refuse with {refused}: {seen}"]
        else:
            found = differences(native, seen, executor, lower, upper)
        (known if (executor, lower, upper) in KNOWN else failures).extend(found)
    assert not failures, f"native saw {native}\n" + "\n".join(failures)
    if known:
        pytest.xfail("; ".join(KNOWN[(e, lower, upper)] for e in executors if (e, lower, upper) in KNOWN))


PAIRS = [(lower, upper) for lower in MAKERS for upper in (*MAKERS, *UPPER_ONLY) if accepted(lower, upper)]


@pytest.mark.parametrize(("lower", "upper"), PAIRS, ids=[f"{upper}-over-{lower}" for lower, upper in PAIRS])
def test_stack_agrees(lower: str, upper: str, host: str) -> None:
    require("native")
    spec = build(lower, upper, host)
    native = observe(report_on("native", spec))
    agree(native, EXECUTORS, lower, upper, (lower, upper), lambda executor: observe(report_on(executor, spec)))


def test_declarations_name_executors_and_types() -> None:
    types = {*MAKERS, *UPPER_ONLY, ANY}
    for names, lower, upper, keys, why in DIFFERS:
        assert set(names) <= set(EXECUTORS) and {lower, upper} <= types and why, (names, lower, upper)
        assert set(keys) <= {"type", "mode", "content", "target", "fstype", "flags", "writable", "entries"}
    for executor, kinds in REFUSED.items():
        assert executor in EXECUTORS and set(kinds) <= set(MAKERS), executor
    for executor, lower, upper in KNOWN:
        assert executor in EXECUTORS and (lower, upper) in PAIRS, (executor, lower, upper)


CALL_BINDS = ("bind", "ro-bind", "dev-bind")
CALL_PAIRS = [(lower, upper) for lower in MAKERS for upper in CALL_BINDS if accepted(lower, upper)]
TAKE_BINDS = ("template", "template-recycle", "workerpool")  # the executors whose calls take binds of their own


@pytest.mark.parametrize(("lower", "upper"), CALL_PAIRS, ids=[f"{upper}-over-{lower}" for lower, upper in CALL_PAIRS])
def test_a_calls_bind_over_a_spec_mount_agrees(lower: str, upper: str, host: str) -> None:
    """A call's own bind (Template.run's binds=, WorkerPool.submit_task's)
    over a mount of the Spec at its path: as native sees that bind last in
    the Spec (presets.minimal_system() and binds=[Bind(dir, "/tmp")])."""
    require("native")
    spec = build(lower, upper, host)
    native = observe(report_on("native", spec))
    below = spec.replace(mounts=spec.mounts[:-1])
    bind = MAKERS[upper]("upper", host)
    agree(native, TAKE_BINDS, lower, upper, (lower,),
          lambda executor: observe(report_on(executor, below, (bind,))))  # type: ignore[arg-type]
