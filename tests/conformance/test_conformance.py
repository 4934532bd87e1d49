"""Every conformance case on every available backend, and native vs bwrap side by side.

The probe (probe.py, standard library only) runs inside the sandbox with
Debian's /usr/bin/python3 and prints what it sees; cases.py says what it must
see. The "workerpool" backend runs the same probe as a task function
(probe.task) of a sandbox.WorkerPool, with the pool's interpreter (see
run_in_workerpool). The differential test runs each case on native and bwrap
and compares the whole reports after removing what legitimately differs (see
`normalize`).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import SYSTEM_MOUNTS, child_pids, signal_state

import sandbox
from sandbox import backends, errors
from sandbox import spec as S
from sandbox.warm_plan import ZYGOTE_ROOT_STAND_IN
from sandbox.workerpool import TaskError
from sandbox.workerpool.interpreter import interpreter_paths

from . import probe
from .cases import CASES, HOST_TREE, LEAKED_FD, PASSED_FD
from .model import Case, Matcher, fill

pytestmark = pytest.mark.integration

PYTHON = "/usr/bin/python3"
PROBE_PATH = Path(__file__).with_name("probe.py")
PROBE = PROBE_PATH.read_bytes()
BASE_WORLD = (*SYSTEM_MOUNTS, S.File("/probe.py", PROBE, perms=0o644, readonly=True))
# template: every case through a sandbox.Template; template-recycle: through a
# Template(recycle=True), in a sandbox recycled after earlier requests (declared
# as "template"'s); workerpool: every case's probe as a task function
# (probe.task) of a sandbox.WorkerPool
BACKENDS = ("native", "bwrap", "template", "template-recycle", "workerpool", "blob")
DECLARED_AS = {"template-recycle": "template"}
ELSEWHERE = ("brokered",)  # backends whose cases run in a suite of their own (test_brokered.py)
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")


def available(backend: str) -> tuple[bool, str]:
    if backend in ("template", "template-recycle"):
        return backends.availability("template")
    if backend == "blob":
        return backends.availability("blob")
    result = sandbox.probe()
    if backend in ("native", "workerpool"):  # a WorkerPool's zygote is a native sandbox
        return result.native, result.native_reason
    return bool(result.bwrap), result.bwrap_reason


def require(backend: str) -> None:
    ok, reason = available(backend)
    if not ok:
        pytest.skip(f"{backend} backend unavailable: {reason}")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")


# ---------------------------------------------------------------- host context

def make_tree(root: Path, tree: Mapping[str, str | None] = HOST_TREE) -> None:
    """Make `tree` (name -> None for a directory, "->x" for a symlink, else a file's text) below `root`."""
    for name, content in tree.items():
        path = root / name
        if content is None:
            path.mkdir(mode=0o755)
        elif content.startswith("->"):
            path.symlink_to(content[2:])
        else:
            path.write_text(content)
            path.chmod(0o644)
    root.chmod(0o755)


def host_view() -> dict[str, Any]:
    """What the test process itself sees, for HostValue expectations."""
    with open("/proc/net/dev") as f:
        interfaces = sorted(line.split(":", 1)[0].strip() for line in f.read().splitlines()[2:])
    with open("/proc/self/uid_map") as f:
        uid_map = f.read().split()
    view: dict[str, Any] = {f"ns.{ns}": os.readlink(f"/proc/self/ns/{ns}") for ns in NAMESPACES}
    with open("/proc/1/cmdline") as f:
        pid1_cmdline = f.read().split("\0")[:-1]
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    view.update({"hostname": socket.gethostname(), "net.interfaces": interfaces, "ids.uid_map": uid_map,
                 "uid": os.getuid(), "gid": os.getgid(), "rlimit.nofile.hard": [nofile_hard, nofile_hard],
                 "proc.pid1_cmdline": pid1_cmdline,
                 "mode./usr/share": oct(stat.S_IMODE(os.stat("/usr/share").st_mode)),
                 # a WorkerPool task's uid in its parent user namespace when it runs as the caller's (with a
                 # Dev): its zygote's stand-in for root, else 0 (it is nested: see cases.WP_NESTS)
                 "wp_uid_outside": ZYGOTE_ROOT_STAND_IN if os.getuid() == 0 else 0,
                 # the entries of / that the interpreter's paths add to a WorkerPool task's world
                 "workerpool.tops": sorted({p.split("/")[1] for p in interpreter_paths()})})
    return view


@pytest.fixture(scope="session")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("conformance-host")
    make_tree(root)
    for parent in root.parents:  # the tree must be reachable by the sandbox's uid
        if parent == Path("/") or parent.stat().st_mode & 0o005 == 0o005:
            break
        if parent.stat().st_uid == os.getuid():
            parent.chmod(parent.stat().st_mode | 0o005)
    view = host_view()
    view["host"] = str(root)
    return view


# ---------------------------------------------------------------- running a case

def build_spec(case: Case, ctx: Mapping[str, Any]) -> S.Spec:
    mounts = (BASE_WORLD if case.base else ()) + tuple(fill(m, ctx) for m in case.mounts)
    if (case.request.get("mounts") or case.request.get("below")) and not any(isinstance(m, S.Proc) for m in mounts):
        mounts += (S.Proc(),)  # the probe reads /proc/self/mountinfo
    return S.Spec(mounts=mounts, **fill(dict(case.spec), ctx))


def command(case: Case) -> list[str]:
    if case.argv is not None:
        return list(case.argv)
    probe = str(PROBE_PATH) if case.probe_on_host else "/probe.py"
    return [PYTHON, "-I", "-S", probe, json.dumps(dict(case.request))]


def mark_known_bugs(case: Case, backends: tuple[str, ...]) -> None:
    for name in backends:
        if name in case.known_bug:
            pytest.xfail(f"known {name} bug: {case.known_bug[name]}")


def run_case(case: Case, backend: str, ctx: Mapping[str, Any], monkeypatch: pytest.MonkeyPatch
             ) -> tuple[sandbox.CompletedProcess, dict[str, Any]]:
    """Run `case` on `backend` (raises what spawn raises); return the result
    and what the host then sees of the case's scratch paths."""
    if case.root_only and os.getuid() != 0:
        pytest.skip("needs root")
    if case.nonroot_only and os.getuid() == 0:
        pytest.skip("host root is exempt")
    # A fixed caller: its cwd and HOME exist inside only where a case binds them.
    monkeypatch.chdir(fill(case.host_cwd or "/{host}/cwd", ctx))
    monkeypatch.setenv("HOME", "/nonexistent-home")
    for name, value in case.host_env.items():
        monkeypatch.setenv(name, fill(value, ctx))
    with (scratch_dir(case, ctx) as run_ctx, caller_umask(case.host_umask), extra_fds(case) as fds,
          caller_signals(case.host_ignores, case.host_blocks)):
        spec = build_spec(case, run_ctx)
        if backend in ("template", "template-recycle"):
            result = run_in_template(spec, command(case), fds, recycle=backend == "template-recycle")
        elif backend == "workerpool":
            result = run_in_workerpool(spec, case)
        else:
            result = sandbox.run(command(case), spec, capture_output=True, backend=backend, pass_fds=fds, timeout=60)
        return result, host_report(case, run_ctx)


@contextlib.contextmanager
def scratch_dir(case: Case, ctx: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """`ctx`, plus (if the case has a scratch tree) a fresh host directory made
    from it at "{scratch}", removed afterwards."""
    if case.scratch is None:
        yield ctx
        return
    root = Path(tempfile.mkdtemp(prefix="scratch-", dir=ctx["host"]))
    try:
        make_tree(root, case.scratch)
        yield {**ctx, "scratch": str(root)}
    finally:
        shutil.rmtree(root)


def caller_signals(ignore: tuple[int, ...], block: tuple[int, ...]) -> contextlib.AbstractContextManager[None]:
    """While the case runs: the test process ignores `ignore` and this thread blocks `block`."""
    return signal_state(dict.fromkeys(ignore, signal.SIG_IGN), signal.SIG_BLOCK, block)


@contextlib.contextmanager
def caller_umask(mask: int | None) -> Iterator[None]:
    if mask is None:
        yield
        return
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def host_report(case: Case, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """What the host sees at each of the case's host_paths (relative to its
    scratch directory): the probe's path_info, whether the caller owns it and
    whether the caller can still write it."""
    out = {}
    for name in case.host_paths:
        path = os.path.join(ctx["scratch"], name)
        info = probe.path_info(path)
        if info["exists"]:
            st = os.lstat(path)
            mine = (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
            info.update(owner="caller" if mine else f"{st.st_uid}:{st.st_gid}", writable=probe.writable(path))
        out[name] = info
    return out


def run_in_template(spec: S.Spec, argv: list[str], fds: list[int], recycle: bool = False) -> sandbox.CompletedProcess:
    """Run through a fresh sandbox.Template; a case it refuses (no mount namespace...) is skipped with its reason.
    `recycle`: a Template(recycle=True), whose standbys have each served a request and been reset first."""
    try:
        template = sandbox.Template(spec, recycle=recycle)
    except sandbox.UnavailableError as exc:
        if str(exc).startswith(("a Template ", "Template(recycle=True)")):
            pytest.skip(str(exc))
        raise
    with template:
        for _ in range(2 * len(child_pids(template.pid)) if recycle else 0):  # its standbys: the template's children
            with contextlib.suppress(sandbox.SandboxError):
                template.run(["/bin/true"], timeout=60)
            time.sleep(0.02)  # its reset, before the next request
        return template.run(argv, capture_output=True, pass_fds=fds, timeout=60)


def workerpool_mounts(spec: S.Spec) -> tuple[S.Mount, ...]:
    """What WorkerPool needs in every Spec and `spec` lacks: a Proc at /proc, and a Dev at /dev."""
    extra: list[S.Mount] = []
    if not any(isinstance(m, S.Proc) and m.dest == "/proc" for m in spec.mounts):
        extra.append(S.Proc())
    if not any(isinstance(m, S.Dev) and m.dest == "/dev" for m in spec.mounts):
        extra.append(S.Dev())
    return tuple(extra)


def run_in_workerpool(spec: S.Spec, case: Case) -> sandbox.CompletedProcess:
    """Run the case's probe as a task function (probe.task, sent by value) in
    a fresh sandbox.WorkerPool of `spec`: its report, or (a task that exits
    or is killed) its exit status and what it printed, as a CompletedProcess.

    WorkerPool refuses a Spec without a Proc and a Dev at /dev (SpecError
    naming "mounts"): for such a case that refusal is checked, and the case
    runs with them added at the end (its `differs`/`expect_on` for
    "workerpool" say what they change). Any other refusal, or any refusal of
    a case that expects one (`refused`), is raised.
    """
    try:
        pool = sandbox.WorkerPool(spec, 1, timeout=60)
    except errors.SpecError as exc:
        extra = workerpool_mounts(spec)
        if exc.field != "mounts" or not extra or "workerpool" in case.refused:
            raise
        pool = sandbox.WorkerPool(spec.replace(mounts=(*spec.mounts, *extra)), 1, timeout=60)
    args = ["probe.task", json.dumps(dict(case.request))]
    with pool:
        future = pool.submit(probe.task, args[1])
        try:
            report = future.result()
        except TaskError as exc:  # it exited or was killed: no reply (TaskExit has no returncode)
            if exc.returncode is None:
                raise
            return sandbox.CompletedProcess(args, exc.returncode, exc.stdout, exc.stderr, backend="workerpool")
    return sandbox.CompletedProcess(args, 0, report.encode(), future.stderr, backend="workerpool")


class extra_fds:
    """While the case runs: a pipe's read end at PASSED_FD (to pass), an
    inheritable fd at LEAKED_FD (not to pass)."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.fds: list[int] = []

    def __enter__(self) -> list[int]:
        for fd in (LEAKED_FD, PASSED_FD):
            try:
                os.fstat(fd)
            except OSError:
                continue
            raise RuntimeError(f"fd {fd} is in use in the test process: dup2 onto it would close it")
        if self.case.leak_fd:
            fd = os.open("/dev/null", os.O_RDONLY)
            os.dup2(fd, LEAKED_FD, inheritable=True)
            os.close(fd)
            self.fds.append(LEAKED_FD)
        if not self.case.pass_fd:
            return []
        r, w = os.pipe()
        os.dup2(r, PASSED_FD)
        os.close(r)
        self.fds += [PASSED_FD, w]
        return [PASSED_FD]

    def __exit__(self, *exc: object) -> None:
        for fd in self.fds:
            os.close(fd)


def report_of(result: sandbox.CompletedProcess, host: dict[str, Any] | None = None) -> dict[str, Any]:
    """The probe's report, with the host's view of the scratch paths under "host"."""
    assert result.stdout, f"no report; stderr: {result.stderr!r}"
    report: dict[str, Any] = json.loads(result.stdout)
    if host:
        report["host"] = host
    return report


def lookup(report: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = report
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def expectations(case: Case, backend: str) -> dict[tuple[str, ...], Any]:
    """The case's expectations on `backend`: `expect` without what `differs` there, with `expect_on`'s
    (a backend DECLARED_AS another has that one's declarations, then its own)."""
    names = (DECLARED_AS.get(backend, backend), backend)
    differs = [other for name in dict.fromkeys(names) for other in case.differs.get(name, ())]
    out = {path: expected for path, expected in case.expect.items()
           if not any(path[:len(other)] == other for other in differs)}
    for name in dict.fromkeys(names):
        out.update(case.expect_on.get(name, {}))
    out.pop(("returncode",), None)
    return out


def check_expectations(case: Case, backend: str, report: Mapping[str, Any], ctx: Mapping[str, Any]) -> None:
    failures = []
    for path, expected in expectations(case, backend).items():
        path = fill(path, ctx)
        expected = fill(expected, ctx)
        got = lookup(report, path)
        ok = expected.matches(got, ctx) if isinstance(expected, Matcher) else got == expected
        if not ok:
            failures.append(f"{'.'.join(path)}: expected {expected!r}, got {got!r}")
    assert not failures, "\n".join(failures)


def check_error(case: Case, exc: BaseException, ctx: Mapping[str, Any]) -> None:
    assert case.error is not None
    name, attrs = case.error
    assert isinstance(exc, getattr(errors, name)), f"expected {name}, got {type(exc).__name__}: {exc}"
    for attr, value in attrs.items():
        assert getattr(exc, attr) == fill(value, ctx), f"{attr}: expected {value!r}, got {getattr(exc, attr)!r}"


# ---------------------------------------------------------------- the tests

@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    require(request.param)
    yield request.param


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case: Case, backend: str, ctx: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    declared = DECLARED_AS.get(backend, backend)
    if declared in case.not_applicable:
        pytest.skip(f"not applicable on {backend}: {case.not_applicable[declared]}")
    if declared in case.known_bug:
        try:
            run_and_check(case, backend, ctx, monkeypatch)
        except (AssertionError, sandbox.SandboxError):
            mark_known_bugs(case, (backend,))
        return
    run_and_check(case, backend, ctx, monkeypatch)


def run_and_check(case: Case, backend: str, ctx: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    declared = DECLARED_AS.get(backend, backend)
    if declared in case.refused:
        with pytest.raises(errors.SpecError) as refusal:
            run_case(case, backend, ctx, monkeypatch)
        assert refusal.value.field == case.refused[declared], f"refused for another field: {refusal.value}"
        return
    if case.error is not None:
        with pytest.raises(sandbox.SandboxError) as info:
            run_case(case, backend, ctx, monkeypatch)
        check_error(case, info.value, ctx)
        return
    result, host = run_case(case, backend, ctx, monkeypatch)
    assert result.backend == declared
    returncode = case.expect_on.get(declared, {}).get(("returncode",), case.returncode)
    codes = returncode if isinstance(returncode, tuple) else (returncode,)
    assert result.returncode in codes, result.stderr
    if case.argv is None:
        report = report_of(result, host)
        if backend == "bwrap":  # a documented difference: bwrap always sets PWD
            assert report["env"].pop("PWD") == report["cwd"]
        check_expectations(case, backend, report, ctx)


def normalize(report: dict[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
    """Remove what legitimately differs between backends.

    - namespace inode numbers: only "the host's" or "new" is kept;
    - pid 1's command line (sandbox-init vs bwrap) and, without a pid
      namespace, every host pid (also when /proc is absent and the probe
      cannot tell which pid namespace it is in);
    - PWD, which bwrap always adds to the environment;
    - without a user namespace, CapBnd (bwrap 0.8.0 shrinks the bounding set
      only in a user namespace it made);
    - the number of mounts (bwrap does not self-bind a non-writable /proc/sys)
      and the mode= option and root of the tmpfs behind the root and behind
      File mounts (bwrap's root is a directory of its staging tmpfs);
    - how many host mounts a recursive bind of a host tree brought along
      (the host's own mount table may change between the two runs).
    """
    out: dict[str, Any] = json.loads(json.dumps(report))
    out["ns"] = {ns: "unknown" if not isinstance(value, str) else "host" if value == ctx[f"ns.{ns}"] else "new"
                 for ns, value in out["ns"].items()}
    out["proc"].pop("pid1_cmdline", None)
    if out["ns"]["pid"] != "new" and out["proc"].get("pid") not in (1, 2):
        for key in ("pid", "ppid", "visible_pids"):
            out["proc"].pop(key, None)
    if not set(out["proc"].get("visible_pids") or []) <= {1, 2}:  # the host's /proc: its pids come and go
        out["proc"].pop("visible_pids", None)
    out["env"].pop("PWD", None)
    if out["ns"]["user"] == "host" and isinstance(out.get("status"), dict):
        out["status"].pop("CapBnd", None)  # bwrap drops the bounding set only in a user namespace
    if isinstance(out.get("below"), dict):
        for tree in out["below"].values():
            tree.pop("count", None)
    mounts = out.get("mounts")
    if isinstance(mounts, dict):
        mounts.pop("count", None)
        for point, info in (mounts.get("points") or {}).items():
            if info and (point == "/" or (out["paths"].get(point) or {}).get("type") == "file"):
                info.pop("mode", None)
                info.pop("root", None)
    return out


def outcome(case: Case, backend: str, ctx: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    try:
        result, host = run_case(case, backend, ctx, monkeypatch)
    except sandbox.SandboxError as exc:
        return {"error": type(exc).__name__, "step": getattr(exc, "step", None), "path": getattr(exc, "path", None),
                "errno": getattr(exc, "errno", None)}
    out: dict[str, Any] = {"returncode": result.returncode}
    if case.argv is None and result.stdout:
        out["report"] = normalize(report_of(result, host), ctx)
        for path in {p for name in ("native", "bwrap") for p in case.differs.get(name, ())}:
            drop(out["report"], path)
    return out


def drop(report: dict[str, Any], path: tuple[str, ...]) -> None:
    """Remove the value at `path` (a documented difference)."""
    for key in path[:-1]:
        report = report.get(key) or {}
    report.pop(path[-1], None)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backends_agree(case: Case, ctx: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("native", "bwrap"):
        require(name)
        if name in case.not_applicable:
            pytest.skip(f"not applicable on {name}: {case.not_applicable[name]}")
    native = outcome(case, "native", ctx, monkeypatch)
    bwrap = outcome(case, "bwrap", ctx, monkeypatch)
    if native != bwrap and case.known_bug:
        mark_known_bugs(case, ("native", "bwrap"))
    if native != bwrap:
        diffs = describe_differences(native, bwrap)
        pytest.fail("native and bwrap disagree:\n" + "\n".join(diffs))


def test_declarations_name_backends_and_say_why() -> None:
    """A case's per-backend declarations name backends of the suite, and
    each "workerpool" difference says why (WorkerPool runs a function)."""
    sections = set(probe.gather({})) | {"host"}
    for case in CASES:
        for declared in (case.differs, case.expect_on, case.why, case.refused, case.unavailable, case.not_applicable,
                         case.known_bug):
            assert set(declared) <= {*BACKENDS, *ELSEWHERE}, f"{case.name}: unknown backend in {declared}"
        if "workerpool" in case.differs or "workerpool" in case.expect_on:
            assert case.why.get("workerpool"), f"{case.name}: its workerpool difference does not say why"
        assert set(case.why) <= set(case.differs) | set(case.expect_on), f"{case.name}: a why without a difference"
        for path in case.expect_on.get("workerpool", {}):
            assert path == ("returncode",) or path[0] in sections, f"{case.name}: no such key path {path}"


def describe_differences(a: Any, b: Any, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b), key=str):
            out += describe_differences(a.get(key), b.get(key), f"{where}.{key}")
        return out
    return [] if a == b else [f"{where or '.'}: native={a!r} bwrap={b!r}"]
