"""The command's environment through the CLI is exactly what bwrap gives it: cold, direct or served.

A direct run is a Python process, and CPython coerces a C locale at start-up
(PEP 538: it sets LC_CTYPE=C.UTF-8 in its own environment); the command
must not inherit that (sandbox/exec_environ.py). Each caller's environment
(no locale, LC_CTYPE=C, LANG=C, a UTF-8 one) is run through the real bwrap,
`python -m sandbox run`, the installed client without a server (direct), the
client that starts its server (cold) and the client its server answers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from cli_helpers import TIMEOUT, Installation, cli_install, servers_of  # noqa: F401

pytestmark = pytest.mark.integration

BWRAP = shutil.which("bwrap")
WORLD = ["--ro-bind", "/", "/"]
CALLERS = [{}, {"LC_CTYPE": "C"}, {"LANG": "C"}, {"LC_ALL": "C"}, {"LANG": "C.UTF-8", "LC_CTYPE": "POSIX"}]


def _env(extra: dict[str, str]) -> dict[str, str]:
    """A caller's environment: `extra`, and the PYTHON* variables of the server's (a client whose
    differ runs directly, the server's notes say which)."""
    python = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}
    return {"PATH": "/usr/bin:/bin", "HOME": "/", **python, **extra}


def _command_env(argv: list[str], env: dict[str, str]) -> list[str]:
    result = subprocess.run([*argv, *WORLD, "env", "-0"], capture_output=True, timeout=TIMEOUT, env=env, cwd="/")
    assert result.returncode == 0, result.stderr
    return sorted(e.decode() for e in result.stdout.split(b"\0") if e and not e.startswith(b"SANDBOX_"))


@pytest.mark.skipif(BWRAP is None, reason="bwrap is not installed")
@pytest.mark.parametrize("extra", CALLERS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "none")
def test_the_commands_environment_is_the_callers(install: Installation, extra: dict[str, str]) -> None:
    assert BWRAP is not None
    expected = _command_env([BWRAP], _env(extra))
    assert not any(e.startswith("LC_CTYPE=C.UTF-8") for e in expected) or "LC_CTYPE" in extra
    client = str(install.root / "bwrap")
    assert _command_env([sys.executable, "-m", "sandbox", "run"], _env(extra)) == expected
    assert _command_env([client], _env({**extra, "SANDBOX_CLI_SERVER": "0"})) == expected  # direct
    assert _command_env([client], _env(extra)) == expected  # cold: it starts its server and runs directly
    for pid in servers_of(install.socket):  # that one keeps no notes: one that does serves the next
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + TIMEOUT
    while servers_of(install.socket) or os.path.exists(install.socket):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    install.start_server()
    assert _command_env([client], _env(extra)) == expected  # served
    assert install.served() >= 1, install.notes()
