"""The driver test_brokered.py runs inside ONE task sandbox: every conformance case through the brokered executor.

It reads a JSON list of runs on stdin (what test_brokered.py made of each
case: its Spec as Spec.to_dict, its command, the caller's cwd, environment,
umask, signal state and fds) and, for each, arranges that caller state in
this process, calls sandbox.run of the Spec with backend "auto" (inside a
task sandbox: the brokered executor, which sends it to the broker outside)
and prints one JSON line: the backend that ran it, its returncode, stdout
and stderr, or the error it raised (its class and the attributes a case
checks). Standard library and sandbox only: it runs with the framework's
interpreter, shown inside as installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import sandbox
from sandbox.spec import Spec

ERROR_ATTRS = ("field", "step", "path", "errno", "filename")


@contextlib.contextmanager
def caller_state(run: Mapping[str, Any]) -> Iterator[list[int]]:
    """This process as the case's caller while it runs: cwd, environment, umask,
    ignored and blocked signals, a leaked and a passed fd (yields the fds to pass)."""
    env, cwd = dict(os.environ), os.getcwd()
    os.chdir(run["cwd"])
    os.environ.update(run["env"])
    umask = os.umask(run["umask"]) if run["umask"] is not None else None
    dispositions = {sig: signal.signal(sig, signal.SIG_IGN) for sig in run["ignores"]}
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, run["blocks"])
    opened: list[int] = []
    try:
        if run["leak_fd"] is not None:
            fd = os.open("/dev/null", os.O_RDONLY)
            os.dup2(fd, run["leak_fd"], inheritable=True)
            os.close(fd)
            opened.append(run["leak_fd"])
        passed: list[int] = []
        if run["pass_fd"] is not None:
            r, w = os.pipe()
            os.dup2(r, run["pass_fd"])
            os.close(r)
            opened += [run["pass_fd"], w]
            passed.append(run["pass_fd"])
        yield passed
    finally:
        for fd in opened:
            os.close(fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for sig, old in dispositions.items():
            signal.signal(sig, old)
        if umask is not None:
            os.umask(umask)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)


def run_one(run: Mapping[str, Any]) -> dict[str, Any]:
    """One case's run: what sandbox.run returned, or the error it raised."""
    out: dict[str, Any] = {"name": run["name"]}
    try:
        with caller_state(run) as fds:
            result = sandbox.run(run["argv"], Spec.from_dict(run["spec"]), capture_output=True, pass_fds=fds,
                                 timeout=60)
    except sandbox.SandboxError as exc:
        out.update(error=type(exc).__name__, message=str(exc))
        attrs = {name: getattr(exc, name, None) for name in ERROR_ATTRS}
        out.update({name: value for name, value in attrs.items() if isinstance(value, (int, str))})
        return out
    out.update(backend=result.backend, returncode=result.returncode,
               stdout=result.stdout.decode(errors="replace"), stderr=result.stderr.decode(errors="replace"))
    return out


def main() -> None:
    for run in json.load(sys.stdin):
        try:
            line = run_one(run)
        except Exception as exc:  # noqa: BLE001 (reported per case: one case's failure is not the batch's)
            line = {"name": run["name"], "unexpected": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
