"""Output caps (issue 39, item 1): one meaning on every executor (sandbox.output).

A command prints 50 MiB (and a marker before and after) under a 1 MiB cap,
on each executor (sandbox.run's native and bwrap backends, a Template, a
WorkerPool task, the task layer) and with each on_overflow: what was kept
(the last bytes for "tail", the first for the others) comes back with the
count of the bytes dropped, "kill" and "raise" end the sandbox with
killed_by "output", "raise" raises a typed error carrying what was kept.
Each case runs in a fresh interpreter that measures its own peak RSS
(ru_maxrss) across the 50 MiB print after a warm-up: the caller's memory
stays bounded by the cap, not by what the command wrote.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap

import pytest
from conftest import make_base_spec

import sandbox
from sandbox import task
from sandbox.output import DEFAULT_MAX_OUTPUT, MODES, OutputCap, OutputLimitError
from sandbox.presets import python_interpreter
from sandbox.workerpool import TaskLimitError

pytestmark = pytest.mark.integration
PY = sys.executable
CAP = 1 << 20
BIG = 50 << 20
MARK = 1000  # bytes of "a" before the 50 MiB of "x", and of "z" after

# One case, in a fresh interpreter: warm the executor up with a small print,
# then read ru_maxrss, print 50 MiB under the cap, read it again.
CASE = textwrap.dedent('''
    import json, resource, sys
    import sandbox
    from sandbox import task
    from sandbox.presets import python_interpreter
    from sandbox.output import OutputLimitError
    from sandbox.workerpool import TaskError

    executor, mode, cap, big, mark = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    PY = sys.executable
    CODE = ("import sys; n = int(sys.argv[1]); sys.stdout.write('a' * %d + 'x' * n + 'z' * %d); "
            "sys.stdout.flush(); print('done', file=sys.stderr)") % (mark, mark)

    def loud(n, mark=mark):
        import sys
        sys.stdout.write("a" * mark + "x" * n + "z" * mark)
        sys.stdout.flush()
        print("done", file=sys.stderr)
        return "result"

    def maxrss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def outcome(run):
        run(1000)  # warm-up: every import, the Template or pool started
        before = maxrss()
        out = {"raised": None, "result": None}
        try:
            r = run(big)
            out.update(stdout=r[0], stdout_dropped=r[1], stderr=r[2], killed_by=r[3], returncode=r[4],
                       result=r[5])
        except (OutputLimitError, TaskError) as exc:
            out.update(raised=type(exc).__name__, stdout=exc.stdout, stdout_dropped=exc.stdout_dropped,
                       stderr=exc.stderr, killed_by=exc.killed_by, returncode=exc.returncode)
        out["maxrss_delta_kb"] = maxrss() - before
        s = out.pop("stdout")
        out["kept"] = len(s)
        out["first"], out["last"] = s[:3].decode(), s[-3:].decode()
        out["stderr"] = out["stderr"].decode() if out["stderr"] else ""
        print(json.dumps(out))

    caps = {"max_output": cap, "on_overflow": mode}
    if executor in ("native", "bwrap"):
        spec = python_interpreter()
        def run(n):
            r = sandbox.run([PY, "-c", CODE, str(n)], spec, backend=executor, capture_output=True, timeout=120,
                            **caps)
            return r.stdout, r.stdout_dropped, r.stderr, r.killed_by, r.returncode, None
        outcome(run)
    elif executor == "template":
        with sandbox.Template(python_interpreter()) as t:
            def run(n):
                r = t.run([PY, "-c", CODE, str(n)], capture_output=True, timeout=120, **caps)
                return r.stdout, r.stdout_dropped, r.stderr, r.killed_by, r.returncode, None
            outcome(run)
    elif executor == "task":
        def run(n):
            r = task.run([PY, "-c", CODE, str(n)], task.Sandbox(), capture_output=True, timeout=120, **caps)
            return r.stdout, r.stdout_dropped, r.stderr, r.killed_by, r.returncode, None
        outcome(run)
    else:
        with sandbox.WorkerPool(python_interpreter(), 1, **caps) as pool:
            def run(n):
                f = pool.submit(loud, n)
                value = f.result(timeout=120)
                return f.stdout, f.stdout_dropped, f.stderr, f.killed_by, 0, value
            outcome(run)
''')

EXECUTORS = ["native", "bwrap", "template", "workerpool", "task"]


def _available(executor: str) -> None:
    backend = {"workerpool": "native", "task": "native"}.get(executor, executor)
    ok, why = sandbox.backends.availability(backend)
    if not ok:
        pytest.skip(f"{executor}: {why}")


def _case(executor: str, mode: str) -> dict[str, object]:
    # cwd "/": the checkout (a cwd of "") must not shadow the installed package
    done = subprocess.run([PY, "-c", CASE, executor, mode, str(CAP), str(BIG), str(MARK)], capture_output=True,
                          timeout=300, cwd="/")
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    result: dict[str, object] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_50_mib_print_keeps_the_cap_and_counts_the_rest(executor: str, mode: str) -> None:
    _available(executor)
    r = _case(executor, mode)
    total = BIG + 2 * MARK
    assert r["kept"] == CAP, r
    assert int(r["maxrss_delta_kb"]) < 16 << 10, r  # KiB: the caller never held the 50 MiB
    if mode in ("tail", "head"):  # the command ran to its end
        assert r["raised"] is None and r["killed_by"] is None and r["returncode"] == 0, r
        assert r["stdout_dropped"] == total - CAP, r
        assert r["stderr"] == "done\n", r
        assert (r["first"], r["last"]) == (("xxx", "zzz") if mode == "tail" else ("aaa", "xxx")), r
        if executor == "workerpool":
            assert r["result"] == "result"
        return
    assert (r["first"], r["last"]) == ("aaa", "xxx"), r  # the head, up to the cap
    assert r["killed_by"] == "output", r
    assert 0 < int(r["stdout_dropped"]) < total - CAP, r  # what was read past the cap before the kill took
    assert r["stderr"] == "", r  # killed before it got there
    if mode == "raise":
        assert r["raised"] == ("TaskLimitError" if executor == "workerpool" else "OutputLimitError"), r
    elif executor == "workerpool":
        assert r["raised"] == "TaskError", r  # killed before its reply: no result
    else:
        assert r["raised"] is None and r["returncode"] == -9, r


def test_spawn_communicate_takes_the_cap_and_stderr_has_its_own() -> None:
    _available("native")
    code = "import sys; sys.stdout.write('o' * 300000); sys.stderr.write('e' * 5000)"
    with sandbox.spawn([PY, "-c", code], python_interpreter(), stdout=sandbox.PIPE,
                       stderr=sandbox.PIPE, max_output=100000, on_overflow="head") as proc:
        out, err = proc.communicate(timeout=60)
    assert (out, err) == (b"o" * 100000, b"e" * 5000)
    assert (proc.stdout_dropped, proc.stderr_dropped) == (200000, 0)
    assert proc.killed_by is None


def test_raise_carries_what_was_kept_and_pickles() -> None:
    _available("native")
    code = "import sys; sys.stdout.write('o' * 300000); sys.stdout.flush(); import time; time.sleep(30)"
    with pytest.raises(OutputLimitError) as info:
        sandbox.run([PY, "-c", code], python_interpreter(), capture_output=True, text=True,
                    max_output=4096, on_overflow="raise", timeout=60)
    exc = info.value
    assert exc.stdout == "o" * 4096 and exc.killed_by == "output" and exc.max_output == 4096
    again = __import__("pickle").loads(__import__("pickle").dumps(exc))
    assert (type(again), str(again), again.stdout, again.stdout_dropped) == (
        OutputLimitError, str(exc), exc.stdout, exc.stdout_dropped)


def test_run_keeps_64_mib_per_stream_by_default() -> None:
    for fn in (sandbox.run, sandbox.Template.run, task.run):
        params = inspect.signature(fn).parameters
        assert params["max_output"].default == DEFAULT_MAX_OUTPUT == 64 << 20, fn
        assert params["on_overflow"].default == "tail", fn


@pytest.mark.parametrize(("kwargs", "field"), [({"max_output": 0}, "max_output"),
                                                ({"max_output": "1"}, "max_output"),
                                                ({"max_output": True}, "max_output"),
                                                ({"on_overflow": "truncate"}, "on_overflow")])
def test_a_bad_cap_is_refused_before_anything_runs(kwargs: dict[str, object], field: str) -> None:
    _available("native")
    with pytest.raises(sandbox.SpecError) as info:
        sandbox.run(["/bin/true"], make_base_spec(), **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    with pytest.raises(sandbox.SpecError) as info:
        task.run(["/bin/true"], task.Sandbox(), **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    with pytest.raises(sandbox.SpecError) as info:
        sandbox.WorkerPool(make_base_spec(), 1, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


# ---------------------------------------------------------------- the cap itself, as Session feeds it

def feed(cap: OutputCap, total: int, chunk: int = 7000) -> list[bool]:
    data = bytes(i % 251 for i in range(total))
    return [cap.feed(data[i:i + chunk]) for i in range(0, total, chunk)]


@pytest.mark.parametrize("mode", MODES)
def test_output_cap_keeps_exactly_the_cap(mode: str) -> None:
    data = bytes(i % 251 for i in range(100000))
    cap = OutputCap(12345, mode)
    kills = feed(cap, len(data))
    assert cap.dropped == 100000 - 12345 and cap.overflowed  # before kept() too
    kept = cap.kept()
    assert len(kept) == 12345 and cap.dropped == 100000 - 12345 and cap.overflowed
    assert cap.kept() == kept
    assert kept == (data[-12345:] if mode == "tail" else data[:12345])
    assert kills.count(True) == (1 if mode in ("kill", "raise") else 0)


def test_output_cap_under_the_cap_keeps_all_and_none_keeps_everything() -> None:
    for cap in (OutputCap(10**6, "tail"), OutputCap(None, "head")):
        feed(cap, 50000)
        assert cap.kept() == bytes(i % 251 for i in range(50000)) and cap.dropped == 0 and not cap.overflowed


def loud_and_big(n: int) -> bytes:
    import sys

    sys.stdout.write("y" * 70000)
    sys.stdout.flush()
    return b"x" * n


def test_a_task_passing_two_caps_at_once_does_not_break_the_pool() -> None:
    """A task whose output and reply both pass their caps in one select() batch: the first cap drops its
    channels, and the second event, on a closed fd, once broke the pool's I/O thread (EBADF) for every task."""
    _available("native")
    with sandbox.WorkerPool(python_interpreter(), 2, max_reply=1 << 20, max_output=1 << 16) as pool:
        for _ in range(40):
            with pytest.raises(TaskLimitError):
                pool.submit(loud_and_big, 4 << 20).result(timeout=60)
        assert pool.submit(len, "ok").result(timeout=60) == 2
