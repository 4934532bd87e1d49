"""sandbox.Session against a recycled Template, posix_spawn and bwrap.

Latency: one command of /bin/true and its wait, every variant interleaved in
one process (round-robin, timing.measure), medians and p99s, each median as
a ratio to posix_spawn's and to bwrap's: `Session.exec(["true"])` (the
subprocess.run-shaped call), `Session.start(...).wait()`, a recycled
Template's spawn+wait, sandbox.spawn, posix_spawn and bwrap per command
(latency.py's flatpak-like config; the Session's and the Templates' Spec is
the same mounts; its exec with writable_root=False too), and command line
against command line: `sandbox exec ID` into a session `sandbox session
start` keeps, and `podman exec` into a running container where root's
podman runs (benchmarks/containers.py). Then: a Session's
start and close, with the Spec as it is and with a writable root (the
default), read_file of 4 KiB and write_file of 4 KiB, and the scale rows:
memory per idle session (the PSS of its processes, and MemAvailable's drop
per session) and exec latency with 0, 100 and 1000 other sessions alive.

Targets (issue 37): exec into a session at most a recycled Template's
spawn+wait; read_file of 4 KiB at most 0.2 ms; exec latency flat within 1.5x
from 0 to 1000 sessions alive.

    python benchmarks/session.py [-n 300] [--alive 0,100,1000] [--readonly-root] [--before BIN] [--json out.json]

`--before BIN` adds a row of exec into a session whose pid 1 is BIN, a
sandbox-session built from an earlier commit (the same wire), for a before
and after side by side in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

from containers import running_container
from latency import BWRAP_ARGS, MOUNTS
from timing import measure, p99

import sandbox

POSIX = "posix_spawn /bin/true"
BWRAP = "bwrap per command (same config)"
EXEC = "Session.exec(['true'])"
EXEC_RO = "Session.exec(['true']), writable_root=False"
START = "Session.start(['true']).wait()"
CLI_EXEC = "sandbox exec ID /bin/true (command line, session kept)"
CONTAINER_EXEC = "podman exec NAME /bin/true (running container)"
RECYCLED = "Template(recycle=True).spawn+wait"
EXEC_BEFORE = "Session.exec(['true']), pid 1 of --before"
SPEC = sandbox.Spec(mounts=MOUNTS, env={"PATH": "/usr/bin:/bin"})


def _posix_spawn() -> None:
    pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
    os.waitpid(pid, 0)


def _checked(rc: int) -> None:
    if rc != 0:
        raise RuntimeError(f"sandboxed /bin/true exited {rc}")


def variants(session: sandbox.Session, readonly: sandbox.Session, recycled: sandbox.Template,
             before: sandbox.Session | None = None) -> dict[str, Callable[[], object]]:
    """name -> one command of /bin/true, waited for (`before`: a session run by another build's pid 1)."""
    out: dict[str, Callable[[], object]] = {
        POSIX: _posix_spawn,
        EXEC: lambda: _checked(session.exec(["/bin/true"]).returncode),
        EXEC_RO: lambda: _checked(readonly.exec(["/bin/true"]).returncode),
        START: lambda: _checked(session.start(["/bin/true"]).wait()),
        RECYCLED: lambda: _checked(recycled.spawn(["/bin/true"]).wait()),
        "sandbox.spawn+wait (fresh sandbox)": lambda: _checked(sandbox.spawn(["/bin/true"], SPEC).wait()),
    }
    if before is not None:
        out[EXEC_BEFORE] = lambda: _checked(before.exec(["/bin/true"]).returncode)
    bwrap = shutil.which("bwrap")
    if bwrap:
        out[BWRAP] = lambda: subprocess.run([bwrap, *BWRAP_ARGS, "/bin/true"], check=True)
    return out


@contextlib.contextmanager
def session_of(binary: str | None) -> Iterator[sandbox.Session | None]:
    """A Session whose pid 1 is `binary` (sandbox-session of another build, its wire the same), or None."""
    if binary is None:
        yield None
        return
    from sandbox.session import launch

    mine, launch.SESSION_PATH = launch.SESSION_PATH, os.path.abspath(binary)
    try:
        session = sandbox.Session(SPEC)
    finally:
        launch.SESSION_PATH = mine
    with session:
        yield session


@contextlib.contextmanager
def command_line_rows() -> Iterator[dict[str, Callable[[], object]]]:
    """`sandbox exec ID /bin/true` into a session kept by `sandbox session start`, and
    `podman exec` into a running container where one runs here: command line against command line."""
    rows: dict[str, Callable[[], object]] = {}
    cli = os.path.join(os.path.dirname(sys.executable), "sandbox")
    started = subprocess.run([cli, "session", "start", "--spec", SPEC.to_json()], capture_output=True, text=True,
                             check=True, timeout=60)
    name = started.stdout.strip()
    rows[CLI_EXEC] = lambda: subprocess.run([cli, "exec", name, "--", "/bin/true"], check=True)
    try:
        with running_container() as container:
            if container.exec is None:
                print(f"# no container row: {container.reason}")
            else:
                rows[CONTAINER_EXEC] = container.exec
            yield rows
    finally:
        subprocess.run([cli, "session", "stop", name], check=False, timeout=60)


def latency_table(times: dict[str, list[float]]) -> str:
    base = statistics.median(times[POSIX])
    bw = statistics.median(times[BWRAP]) if BWRAP in times else None
    rows = ["| variant | median ms | p99 ms | / posix_spawn | / bwrap |", "|---|---|---|---|---|"]
    for name, xs in times.items():
        med = statistics.median(xs)
        rows.append(f"| {name} | {med:.3f} | {p99(xs):.3f} | {med / base:.2f}x | "
                    f"{'' if bw is None else f'{med / bw:.2f}x'} |")
    return "\n".join(rows)


def lifetime_and_files(n: int) -> dict[str, float]:
    """Medians (ms): a Session's start and its close with the Spec as it is
    (writable_root=False) and with its copy-on-write root (the default: /usr
    overlaid, ld.so.cache copied), interleaved; read_file and write_file of 4 KiB."""
    starts, closes, both = [], [], []
    for _ in range(max(10, n // 10)):
        for writable in (False, True):
            t0 = time.perf_counter()
            s = sandbox.Session(SPEC, writable_root=writable)
            t1 = time.perf_counter()
            s.close()
            t2 = time.perf_counter()
            if writable:
                both.append((t2 - t0) * 1000)
            else:
                starts.append((t1 - t0) * 1000)
                closes.append((t2 - t1) * 1000)
    data = os.urandom(4096)
    reads, writes = [], []
    with sandbox.Session(SPEC) as s:
        s.write_file("/tmp/f", data)
        for _ in range(n * 10):
            t0 = time.perf_counter()
            s.read_file("/tmp/f")
            t1 = time.perf_counter()
            s.write_file("/tmp/g", data)
            t2 = time.perf_counter()
            reads.append((t1 - t0) * 1000)
            writes.append((t2 - t1) * 1000)
    return {"session start": statistics.median(starts), "session close": statistics.median(closes),
            "session start+close, Spec as is": statistics.median(a + b for a, b in zip(starts, closes, strict=True)),
            "session start+close, writable root": statistics.median(both),
            "read_file 4 KiB": statistics.median(reads), "write_file 4 KiB": statistics.median(writes)}


def _pss_kib(pid: int) -> int:
    """PSS (KiB) of `pid` and its children (a session's pid 1 and its call processes)."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            pass
    return total


def _available_kib() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))


def scale(alive: list[int], n: int, writable_root: bool = True) -> tuple[str, dict[str, float]]:
    """Exec latency with `alive` other sessions, and the memory an idle one takes."""
    rows = ["| sessions alive | exec(['true']) median ms | p99 ms | / with 0 alive |", "|---|---|---|---|"]
    figures: dict[str, float] = {}
    others: list[sandbox.Session] = []
    base = None
    try:
        with sandbox.Session(SPEC, writable_root=writable_root) as probe:
            rows.insert(0, f"sessions: writable_root={writable_root}, ids: {probe.ids.words()}\n")
            for count in sorted(alive):
                before, had = _available_kib(), len(others)
                while len(others) < count:
                    others.append(sandbox.Session(SPEC, writable_root=writable_root))
                time.sleep(3)  # the network namespace pool refills behind the sessions' leases (the probe's too)
                if count and count == max(alive):
                    added = count - had
                    figures["MemAvailable drop per session KiB"] = (before - _available_kib()) / max(1, added)
                    figures["PSS per idle session KiB"] = statistics.median(_pss_kib(s.pid) for s in others)
                times = measure({"exec": lambda: _checked(probe.exec(["/bin/true"]).returncode)}, n, warmup=10)
                med = statistics.median(times["exec"])
                base = base or med
                figures[f"exec with {count} alive"] = med
                rows.append(f"| {count} | {med:.3f} | {p99(times['exec']):.3f} | {med / base:.2f}x |")
    finally:
        for s in others:
            s.close()
    return "\n".join(rows), figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--alive", default="0,100,1000", help="numbers of idle sessions for the scale rows")
    parser.add_argument("--readonly-root", action="store_true",
                        help="the scale rows' sessions with writable_root=False (default: the copy-on-write root)")
    parser.add_argument("--before", metavar="BIN",
                        help="a sandbox-session built from another commit: a row of exec into a session it runs")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    with (sandbox.Session(SPEC) as session, sandbox.Session(SPEC, writable_root=False) as readonly,
          sandbox.Template(SPEC, recycle=True) as recycled, session_of(args.before) as before,
          command_line_rows() as rows):
        times = measure({**variants(session, readonly, recycled, before), **rows}, args.n)
    print(latency_table(times))
    files = lifetime_and_files(args.n)
    print("\n| what | median ms |\n|---|---|")
    for name, ms in files.items():
        print(f"| {name} | {ms:.3f} |")
    alive = [int(x) for x in args.alive.split(",") if x]
    table, figures = scale(alive, max(50, args.n // 3), not args.readonly_root)
    print()
    print(table)
    for name, value in figures.items():
        if "KiB" in name:
            print(f"{name}: {value:.0f}")
    if args.json:
        out = {"latency_median_ms": {k: statistics.median(v) for k, v in times.items()}, **files, **figures}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
