"""Every conformance case on the brokered executor: a Spec started inside a task sandbox, by its broker.

One task sandbox (sandbox.task.run) on each backend (native, bwrap: the
broker starts the nested sandboxes on its own sandbox's) runs one driver
process (brokered_driver.py) for the whole batch: for each case it arranges the
caller's state (cwd, environment, umask, signals, fds) in itself and calls
sandbox.run of the case's Spec with backend "auto", which inside a task
sandbox is the brokered executor: the Spec becomes a task description
(backends/brokered/description.py), the broker outside starts the nested
sandbox beside the task sandbox, and the driver prints what came back, one
JSON line per case. A session fixture runs the batch; a test per case checks
its line against the case's expectations for "brokered" (its `expect`,
`differs`, `expect_on`, `refused`, `unavailable`, `error`, `known_bug` and
`not_applicable`, cases.py; on bwrap, bwrap's own `differs` too).

The base world is test_conformance's, except the probe: a description shows
no file made of data (File), so the probe is bound read-only from the host
(its directory is shown read-only in the task sandbox). The host tree is
shown writable (a nested sandbox writes only where its parent may), and
each case's scratch tree is made on the host before the batch and looked at
on the host after it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import sandbox
from sandbox import errors, task
from sandbox import spec as S
from sandbox.backends import brokered
from sandbox.capabilities import Capability
from sandbox.host_system import TOP_LEVEL_LINKS
from sandbox.workerpool.interpreter import interpreter_paths

from . import probe
from .cases import BR_TOPS, CASES, LEAKED_FD, PASSED_FD
from .model import Case, fill
from .test_conformance import (
    BASE_WORLD,
    PROBE_PATH,
    PYTHON,
    build_spec,
    check_expectations,
    command,
    ctx,  # noqa: F401  (the session's host tree and host view, the fixture)
    host_report,
    make_tree,
)

pytestmark = pytest.mark.integration

BACKEND = "brokered"
DRIVER = Path(__file__).with_name("brokered_driver.py")
PROBE_BIND = S.RoBind(str(PROBE_PATH), "/probe.py")  # in place of the base world's File
ENV_ALLOW = ("SBX_CONF_*",)  # what a case's env_inherit asks for: a nested sandbox can only narrow its parent's
BATCH_TIMEOUT = 900
OUTER = ("native", "bwrap")  # the task sandbox's backend: the broker starts the nested sandboxes on it too


def skip_reason(case: Case) -> str | None:
    """Why `case` does not run on "brokered" here, or None."""
    if BACKEND in case.not_applicable:
        return f"not applicable on {BACKEND}: {case.not_applicable[BACKEND]}"
    if case.root_only and os.getuid() != 0:
        return "needs root"
    if case.nonroot_only and os.getuid() == 0:
        return "host root is exempt"
    return None


def spec_of(case: Case, run_ctx: Mapping[str, Any]) -> S.Spec:
    """The case's Spec, with the probe bound from the host instead of the base world's File."""
    spec = build_spec(case, run_ctx)
    probe_file = BASE_WORLD[-1]
    return spec.replace(mounts=tuple(PROBE_BIND if m == probe_file else m for m in spec.mounts))


def run_of(case: Case, run_ctx: Mapping[str, Any]) -> dict[str, Any]:
    """What the driver needs to run `case` as test_conformance.run_case does on the host."""
    env = {"HOME": "/nonexistent-home", **{name: fill(value, run_ctx) for name, value in case.host_env.items()}}
    return {"name": case.name, "spec": spec_of(case, run_ctx).to_dict(), "argv": command(case),
            "cwd": fill(case.host_cwd or "/{host}/cwd", run_ctx), "env": env, "umask": case.host_umask,
            "ignores": list(case.host_ignores), "blocks": list(case.host_blocks),
            "leak_fd": LEAKED_FD if case.leak_fd else None, "pass_fd": PASSED_FD if case.pass_fd else None}


def outer_sandbox(host: str) -> task.Sandbox:
    """The task sandbox the driver runs in: the driver and the probe read-only, the host tree writable, the
    host's network (which a nested sandbox may then ask for, as network_host does)."""
    return task.Sandbox(read=[str(DRIVER.parent)], write=[host], env_allow=list(ENV_ALLOW), network="open")


def parse_lines(stdout: str) -> dict[str, dict[str, Any]]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {line["name"]: line for line in lines}


class Batch:
    """The batch's outcome: a line per case run, and what the host saw of each scratch tree."""

    def __init__(self, outer: str) -> None:
        self.outer = outer  # the task sandbox's backend, and so its nested sandboxes'
        self.lines: dict[str, dict[str, Any]] = {}
        self.hosts: dict[str, dict[str, Any]] = {}
        self.scratch: dict[str, dict[str, Any]] = {}
        self.seconds = 0.0
        self.tops = task_world_tops()
        self.stderr = ""


@pytest.fixture(scope="session", params=OUTER)
def batch(request: pytest.FixtureRequest, ctx: dict[str, Any]) -> Iterator[Batch]:  # noqa: F811  (test_conformance's)
    """The batch, in a task sandbox on the backend `request.param` (its nested sandboxes run on it too)."""
    probed = sandbox.probe()
    native = request.param == "native"
    ok, why = (probed.native, probed.native_reason) if native else (bool(probed.bwrap), probed.bwrap_reason)
    if not ok:
        pytest.skip(f"{request.param} backend unavailable for the task sandbox: {why}")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")
    out = Batch(request.param)
    runs = []
    try:
        for case in CASES:
            if skip_reason(case) is not None:
                continue
            run_ctx: Mapping[str, Any] = ctx
            if case.scratch is not None:
                root = Path(tempfile.mkdtemp(prefix="scratch-", dir=ctx["host"]))
                make_tree(root, case.scratch)
                run_ctx = out.scratch[case.name] = {**ctx, "scratch": str(root)}
            runs.append(run_of(case, run_ctx))
        start = time.monotonic()
        result = task.run([sys.executable, "-I", str(DRIVER)], outer_sandbox(ctx["host"]), input=json.dumps(runs),
                          capture_output=True, text=True, timeout=BATCH_TIMEOUT, backend=out.outer)
        out.seconds = time.monotonic() - start
        out.stderr = result.stderr
        assert result.returncode == 0, result.stderr[-3000:]
        out.lines = parse_lines(result.stdout)
        for case in CASES:
            if case.name in out.scratch:
                out.hosts[case.name] = host_report(case, out.scratch[case.name])
        yield out
    finally:
        for run_ctx in out.scratch.values():
            shutil.rmtree(run_ctx["scratch"], ignore_errors=True)


def task_world_tops() -> list[str]:
    """The entries of / every task sandbox shows (sandbox/task/compile.py): the system and its links, the /etc
    files, fresh /proc, /dev and /tmp, its broker's socket under /run, the interpreter's directories (as a
    WorkerPool's: "workerpool.tops"); and /probe.py, bound by every case."""
    links = [name for name in TOP_LEVEL_LINKS if os.path.lexists("/" + name)]
    return sorted({"usr", "etc", "proc", "dev", "tmp", "run", "probe.py", *links,
                   *(p.split("/")[1] for p in interpreter_paths())})


def check_unavailable(case: Case, line: Mapping[str, Any]) -> None:
    """The executor lacks a capability the case's Spec needs: sandbox.refusal's UnavailableError, with its reason."""
    lacks = Capability[case.unavailable[BACKEND]]
    assert lacks in brokered.TRAITS.because, f"{lacks} is not a capability the brokered executor lacks"
    assert line.get("error") == "UnavailableError", f"expected UnavailableError ({lacks}), got {line}"
    assert line["message"].endswith(f"({brokered.TRAITS.because[lacks]})"), line["message"]


def check_refused(case: Case, line: Mapping[str, Any]) -> None:
    """The brokered executor refused the case's Spec by design: a SpecError naming the declared field."""
    assert line.get("error") == "SpecError", f"expected a SpecError for {case.refused[BACKEND]}, got {line}"
    assert line.get("field") == case.refused[BACKEND], f"refused for another field: {line.get('message')}"


def check_error_line(case: Case, line: Mapping[str, Any], host: Mapping[str, Any]) -> None:
    """The error the case expects, by class name (or a subclass of it) and attributes."""
    assert case.error is not None
    name, attrs = case.error
    got = getattr(errors, str(line.get("error")), None)
    assert isinstance(got, type) and issubclass(got, getattr(errors, name)), f"expected {name}, got {line}"
    for attr, value in attrs.items():
        assert line.get(attr) == fill(value, host), f"{attr}: expected {value!r}, got {line.get(attr)!r} ({line})"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Case, batch: Batch, ctx: dict[str, Any]) -> None:  # noqa: F811
    why = skip_reason(case)
    if why is not None:
        pytest.skip(why)
    line = batch.lines.get(case.name)
    assert line is not None, f"the driver printed nothing for {case.name}; its stderr: {batch.stderr[-2000:]}"
    assert "unexpected" not in line, line["unexpected"]
    if BACKEND in case.known_bug:
        try:
            check_line(case, line, batch, ctx)
        except AssertionError:
            pytest.xfail(f"known {BACKEND} bug: {case.known_bug[BACKEND]}")
        return
    check_line(case, line, batch, ctx)


def check_line(case: Case, line: Mapping[str, Any], batch: Batch, host: Mapping[str, Any]) -> None:
    """The case's line against what the case declares for "brokered"."""
    if BACKEND in case.refused:
        check_refused(case, line)
        return
    if BACKEND in case.unavailable:
        check_unavailable(case, line)
        return
    if case.error is not None:
        check_error_line(case, line, host)
        return
    assert "error" not in line, f"{line['error']}: {line['message']}"
    assert line["backend"] == BACKEND
    returncode = case.expect_on.get(BACKEND, {}).get(("returncode",), case.returncode)
    codes = returncode if isinstance(returncode, tuple) else (returncode,)
    assert line["returncode"] in codes, line["stderr"]
    if case.argv is None:
        assert line["stdout"], f"no report; stderr: {line['stderr']!r}"
        report = json.loads(line["stdout"])
        if case.name in batch.hosts:
            report["host"] = batch.hosts[case.name]
        if batch.outer == "bwrap":  # bwrap's documented differences: it always sets PWD, and the cases' own
            assert report["env"].pop("PWD") == report["cwd"]
            case = dataclasses.replace(case, differs={BACKEND: (*case.differs.get(BACKEND, ()),
                                                                *case.differs.get("bwrap", ()))})
        check_expectations(case, BACKEND, report, {**host, **batch.scratch.get(case.name, {}), BR_TOPS: batch.tops})


def test_brokered_declarations_say_why() -> None:
    """Each "brokered" difference says why, and names a section of the probe's report."""
    sections = set(probe.gather({})) | {"host"}
    for case in CASES:
        if BACKEND in case.differs or BACKEND in case.expect_on:
            assert case.why.get(BACKEND), f"{case.name}: its brokered difference does not say why"
        for path in (*case.differs.get(BACKEND, ()), *case.expect_on.get(BACKEND, {})):
            assert path == ("returncode",) or path[0] in sections, f"{case.name}: no such key path {path}"


def test_batch_ran_every_case_in_one_task_sandbox(batch: Batch) -> None:
    """Each case that runs here has its line, every nested sandbox was brokered, and the figures are kept."""
    ran = [c.name for c in CASES if skip_reason(c) is None]
    assert sorted(batch.lines) == sorted(ran)
    backends = {line.get("backend") for line in batch.lines.values()} - {None}
    assert backends == {BACKEND}, backends
    refused = sum(1 for line in batch.lines.values() if "error" in line)
    print(f"\nbrokered conformance on {batch.outer}: {len(ran)} cases in {batch.seconds:.1f} s, {refused} raised")

