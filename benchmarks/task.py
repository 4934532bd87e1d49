"""The task sandbox's start, side by side with the same description rendered for bwrap.

One description (`Sandbox(write=[a scratch dir], env_allow=["LANG"], hide=["cffi"])`,
isolated network) started five ways, interleaved in one process:

- `task native`: `sandbox.task.run([python3, -c, pass], sb, backend="native")`
  (the whole task layer: facts, compile, the isolation check, the record);
- `spawn of the Spec, no netns check`: `sandbox.run` of the compiled Spec with
  `check=False` (what the namespace inspection costs);
- `task bwrap`: the same through the bwrap backend;
- `bwrap rendered`: the compiled world written as a bwrap command line and
  run with subprocess.run, which is what a bwrap-rendering framework layer
  does today (no seccomp, no isolation check: bwrap's floor);
- `task worker`: one call of a WorkerPool started from the description
  (`task.worker_pool(sb).submit(pass_fn)`);
- `bare exec`: `subprocess.run([python3, -c, pass])`, the floor;
- `nested native` / `nested bwrap`: the same `task.run` called by code
  inside a task sandbox of that backend, for a description narrowed from
  it (`Sandbox(env_allow=["LANG"])`, the parent's hides folded in): the
  request goes through the outer sandbox's broker, which starts the child
  beside it (a round trip over a pipe to the code inside is included);
- `top-level, nested's description`: that description started from the
  host, the nested start's counterpart.

Prints median and p90 in ms, and each ratio to `bwrap rendered`.

    python benchmarks/task.py [-n 60]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable

import sandbox
from sandbox import spec as S
from sandbox import task

if __package__:
    from .timing import measure, percentile
else:  # run as a script: benchmarks/ is sys.path[0]
    from timing import measure, percentile

PY = sys.executable
CMD = [PY, "-c", "pass"]


def bwrap_argv(spec: S.Spec, argv: list[str]) -> list[str]:
    """The Spec's world as a plain bwrap command line (a framework's rendering)."""
    out = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    for m in spec.mounts:
        if isinstance(m, S.RoBind):
            out += ["--ro-bind-try" if m.optional else "--ro-bind", m.src, m.dest_path()]
        elif isinstance(m, S.Bind):
            out += ["--bind", m.src, m.dest_path()]
        elif isinstance(m, S.Symlink):
            out += ["--symlink", m.target_path, m.dest]
        elif isinstance(m, S.Proc):
            out += ["--proc", m.dest]
        elif isinstance(m, S.Dev):
            out += ["--dev", m.dest]
        elif isinstance(m, S.Tmpfs):
            out += ["--perms", oct(m.perms)[2:], "--tmpfs", m.dest]
        elif isinstance(m, S.RemountRo):
            out += ["--remount-ro", m.dest]
        else:
            raise ValueError(f"not rendered: {m}")
    for name, value in spec.env:
        out += ["--setenv", name, value]
    return [*out, "--", *argv]


def _pass() -> None:
    return None


# Inside the outer sandbox: one nested start per line read, its status written back.
NESTED_SERVER = """
import sys
from sandbox import task
sb = task.Sandbox(env_allow=["LANG"], hide=["cffi"])
for line in sys.stdin:
    print(task.run(sys.argv[1:], sb).returncode, flush=True)
"""


class Nested:
    """An outer task sandbox on `backend` whose code starts one nested sandbox per call()."""

    def __init__(self, outer: task.Sandbox, backend: str) -> None:
        self.proc = task.spawn([PY, "-c", NESTED_SERVER, *CMD], outer, backend=backend,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def call(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if line.strip() != b"0":
            raise RuntimeError(f"nested start answered {line!r}")

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.proc.stdout.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=60)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        sb = task.Sandbox(write=(scratch,), env_allow=("LANG",), hide=("cffi",))
        compiled = task.compile(sb).spec
        rendered = bwrap_argv(compiled, CMD)
        unchecked = compiled.replace(check=False)

        def check(rc: int, what: str) -> None:
            if rc != 0:
                raise RuntimeError(f"{what} exited {rc}")

        child = task.Sandbox(env_allow=("LANG",), hide=("cffi",))
        nested = {be: Nested(sb, be) for be in ("native", "bwrap")}
        with task.worker_pool(sb, max_workers=1) as pool:
            modes: dict[str, Callable[[], object]] = {
                "nested native": nested["native"].call,
                "nested bwrap": nested["bwrap"].call,
                "top-level, nested's description": lambda: check(task.run(CMD, child, backend="native").returncode,
                                                                  "top-level"),
                "task native": lambda: check(task.run(CMD, sb, backend="native").returncode, "task native"),
                "spawn of the Spec, no netns check": lambda: check(sandbox.run(CMD, unchecked, backend="native")
                                                                   .returncode, "unchecked"),
                "task bwrap": lambda: check(task.run(CMD, sb, backend="bwrap").returncode, "task bwrap"),
                "bwrap rendered": lambda: check(subprocess.run(rendered).returncode, "bwrap rendered"),
                "task worker": lambda: pool.submit(_pass).result(timeout=60),
                "bare exec": lambda: check(subprocess.run(CMD).returncode, "bare exec"),
            }
            try:
                times = measure(modes, args.n, warmup=3)
            finally:
                for n in nested.values():
                    n.close()
    base = statistics.median(times["bwrap rendered"])
    print(f"# task sandbox start of `python3 -c pass` (and one WorkerPool call), n={args.n}, uid={os.getuid()}, "
          f"load {os.getloadavg()[0]:.1f}")
    print("| mode | median ms | p90 ms | / bwrap rendered |")
    print("|---|---|---|---|")
    for mode, xs in times.items():
        med = statistics.median(xs)
        print(f"| {mode} | {med:.2f} | {percentile(xs, 0.9):.2f} | {med / base:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
