"""Attack: read the caller's environment from inside through /proc.

bwrap's sandbox child is the sandbox's pid 1 (or a visible ancestor of the
command), and the kernel keeps the environment a program was exec'd with:
/proc/PID/environ shows it whatever bwrap's --clearenv did afterwards. A
secret in the caller's environment must not be readable anywhere in /proc.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from sandbox import Namespaces

from .attack import BACKENDS, make_base_spec, require, run_py

pytestmark = pytest.mark.integration

# Every process's environ, cmdline and its threads' too: print each one that holds the needle.
SCAN = """
import os, sys
needle = sys.argv[1].encode()
def threads(pid):
    try:
        return ["task/" + t + "/" for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # gone already
        return []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for sub in ["", *threads(pid)]:
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{sub}{name}", "rb") as f:
                    if needle in f.read():
                        print(f"/proc/{pid}/{sub}{name}")
            except OSError:
                pass
print("scanned")
"""


@pytest.fixture
def secret_in_environ() -> Iterator[str]:
    """A fresh secret in this process's environment (the caller's), removed afterwards."""
    name, value = "SBX_ADVERSARIAL_SECRET", "s3cr3t-" + secrets.token_hex(8)
    os.environ[name] = value
    try:
        yield value
    finally:
        del os.environ[name]


@pytest.mark.parametrize("pid_ns", [True, False], ids=["pidns", "no-pidns"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_caller_environment_not_in_proc(backend: str, pid_ns: bool, secret_in_environ: str) -> None:
    require(backend)
    # The needle is given in two halves so the scanner's own cmdline does not hold it.
    half = len(secret_in_environ) // 2
    code = SCAN.replace("needle = sys.argv[1].encode()", "needle = (sys.argv[1] + sys.argv[2]).encode()")
    spec = make_base_spec(namespaces=Namespaces(pid=pid_ns))
    done = run_py(backend, code, spec, secret_in_environ[:half], secret_in_environ[half:])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["scanned"], f"the caller's secret is readable inside: {done.stdout}"
