"""Shared by the tests of the session command line (tests/integration/test_session_cli.py,
tests/adversarial/test_session_cli.py): the installed `sandbox` command, a session started with
it and always stopped (its holder killed if the stop fails), and the holder's socket spoken raw."""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import make_base_spec

from sandbox import Spec

SANDBOX = str(Path(sys.executable).with_name("sandbox"))  # the installed client: `session`/`exec` go to sandbox-py
TIMEOUT = 60


def cli(*args: str, env: Mapping[str, str] | None = None, timeout: float = TIMEOUT,
        **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`sandbox ARGS...`, captured as text."""
    done: subprocess.CompletedProcess[str] = subprocess.run(
        [SANDBOX, *args], capture_output=True, text=True, timeout=timeout, env=None if env is None else dict(env),
        **kwargs)
    return done


def spec_file(directory: Path, spec: Spec | None = None, name: str = "spec.json") -> Path:
    """The JSON of `spec` (the base world by default) in a file of `directory`."""
    path = directory / name
    path.write_text((spec or make_base_spec()).to_json())
    return path


@dataclass
class Started:
    """A session started with `sandbox session start`: its id, its holder's pid, its pid 1."""

    ident: str
    holder: int
    pid1: int
    env: Mapping[str, str] | None

    def exec(self, *argv: str, options: tuple[str, ...] = (), **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """`sandbox exec [OPTIONS] ID -- ARGV...`."""
        return cli("exec", *options, self.ident, "--", *argv, env=self.env, **kwargs)


def listed(ident: str, env: Mapping[str, str] | None = None, **kwargs: Any) -> tuple[int, int] | None:
    """(holder pid, pid 1) of session `ident` as `sandbox session list` shows it, or None."""
    for line in cli("session", "list", env=env, **kwargs).stdout.splitlines()[1:]:
        fields = line.split()
        if fields[0] == ident:
            return int(fields[1]), int(fields[2])
    return None


@contextlib.contextmanager
def started(spec: Path, *options: str, env: Mapping[str, str] | None = None) -> Iterator[Started]:
    """A session of the Spec in file `spec`; stopped at the end (its processes killed if not)."""
    done = cli("session", "start", "--spec", str(spec), *options, env=env)
    assert done.returncode == 0, done.stderr
    ident = done.stdout.strip()
    pids = listed(ident, env)
    assert pids is not None, f"session {ident} is not listed"
    try:
        yield Started(ident, pids[0], pids[1], env)
    finally:
        stop_all(session_dir(env), [ident], env)


def stop_all(directory: str, idents: list[str], env: Mapping[str, str] | None) -> None:
    """Stop sessions `idents` of `directory` (their holders and pids 1 killed if the stop fails)
    and remove their logs: a session a test ended otherwise (its pid 1 killed, idle) keeps one."""
    for ident in idents:
        pids = listed(ident, env)
        cli("session", "stop", ident, env=env)
        for pid in pids or ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{directory}/session-{ident}.log")


def left_in(directory: str) -> list[str]:
    """The ids of the sessions whose sockets are in `directory`."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [n[len("session-"):-len(".sock")] for n in names if n.startswith("session-") and n.endswith(".sock")]


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether process `pid` has ended (a zombie counts as ended) within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


def session_dir(env: Mapping[str, str] | None = None) -> str:
    """The directory of this user's sessions (as the CLI computes it)."""
    if env and env.get("SANDBOX_SESSION_DIR"):
        return env["SANDBOX_SESSION_DIR"]
    from sandbox.cliserver import socket_dir

    return socket_dir()


def raw_connect(directory: str, ident: str) -> socket.socket:
    """A connection to a holder's socket, with none of the client's checks."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    sock.connect(f"{directory}/session-{ident}.sock")
    return sock


def raw_send(sock: socket.socket, payload: bytes, fds: tuple[int, ...] = ()) -> None:
    """`payload` framed as the holder reads a message (4-byte length first), with `fds`."""
    data = struct.pack("!I", len(payload)) + payload
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    with contextlib.suppress(BrokenPipeError):  # a refused peer is answered and closed at once: read on
        sock.sendmsg([data], anc)


def raw_answer(sock: socket.socket) -> dict[str, object] | None:
    """The holder's next message (None at EOF)."""
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (size,) = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None
        body += chunk
    answer = json.loads(body)
    assert isinstance(answer, dict)
    return answer
