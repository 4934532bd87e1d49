"""Shared by the tests of the installed `sandbox` command and its CLI server (test_cli_server.py,
test_cli_plan.py): a private installation of the client with a server of its own, and its notes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox.cliserver import socket_path

TIMEOUT = 60
BIN = Path(sys.executable).parent
SYSTEM = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
          "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev"]


# A process that speaks the CLI server's wire itself, with no client's check of the server:
# `python -c RAW_REQUEST SOCKET IDENTITY` (PYTHONPATH: tests/unit, for test_cliwire.request) asks for
# a plan of `sandbox run --ro-bind / / true` and writes the server's first frame to stdout.
RAW_REQUEST = (
    "import socket,sys\n"
    "from test_cliwire import request\n"
    "s=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\ns.connect(sys.argv[1])\n"
    "exe=tuple(int(v) for v in sys.argv[2].split(':'))\n"
    "socket.send_fds(s,[request(argv=(b'sandbox',b'run',b'--ro-bind',b'/',b'/',b'true'),fds=(0,1,2),"
    "exe=exe)],[0,1,2])\n"
    "sys.stdout.buffer.write(s.recv(64))\n")
UNIT_TESTS = str(Path(__file__).resolve().parents[1] / "unit")  # PYTHONPATH for RAW_REQUEST

# The start of a fake CLI server (`python -c FAKE_SERVER_ACCEPT + ... SOCKET ANSWER_FILE ...`): it
# listens on SOCKET, says "ready", takes one client's request and has `c` (the connection) and
# `answer` (the file's bytes) for what follows.
FAKE_SERVER_ACCEPT = """
import array, socket, sys
from sandbox._core.fdpass import recv_fds
from sandbox._core import cliwire as wire
path, answer = sys.argv[1], open(sys.argv[2], 'rb').read()
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(path)
s.listen()
print('ready', flush=True)
c, _ = s.accept()
recv_fds(c, wire.MAX_REQUEST + 1, wire.MAX_FDS)
"""


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without the package's own settings (a client with any runs directly)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_")}
    return {**env, **extra}


@dataclass
class Installation:
    """A private copy of the client and its `sandbox-py`, with its server's socket and notes."""

    root: Path
    client: Path
    socket: str
    log: Path
    server: subprocess.Popen[bytes] | None = None

    def identity(self) -> str:
        st = os.stat(self.client)
        return f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}"

    def start_server(self, identity: str | None = None) -> None:
        self.server = subprocess.Popen(
            [str(self.root / "sandbox-py"), "serve", "--socket", self.socket, "--client",
             identity or self.identity(), "--log", str(self.log), "--idle", "60"],
            env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + TIMEOUT
        while not os.path.exists(self.socket):
            assert self.server.poll() is None, self.server.communicate()[1]
            assert time.monotonic() < deadline, "the server did not listen"
            time.sleep(0.02)

    def run(self, *args: str, name: str = "sandbox", **kw) -> subprocess.CompletedProcess[str]:
        kw.setdefault("env", clean_env())
        kw.setdefault("cwd", "/")
        argv0 = self.client if name == "sandbox" else self.root / name
        return subprocess.run([str(argv0), *args], capture_output=True, text=True, timeout=TIMEOUT, **kw)

    def notes(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def plans(self) -> int:
        """Clients that ran the plan the server compiled themselves."""
        return sum(1 for line in self.notes() if line.endswith(": runs the plan itself"))

    def workers(self) -> int:
        """Clients whose command line a worker of the server ran."""
        return sum(1 for line in self.notes() if line.endswith(": handed off"))

    def served(self) -> int:
        return self.plans() + self.workers()

    def ran_directly(self) -> list[str]:
        return [line for line in self.notes() if ": runs directly: " in line]


def servers_of(socket: str) -> set[int]:
    """Every process serving `socket` (by its command line), this user's own."""
    found = set()
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if socket.encode() in f.read().split(b"\0") and os.stat(f"/proc/{pid}").st_uid == os.getuid():
                    found.add(pid)
    return found


@pytest.fixture(name="install")
def cli_install(tmp_path: Path) -> Iterator[Installation]:
    """A private installation (no server yet); whatever server serves it is gone afterwards."""
    root = tmp_path / "bin"
    root.mkdir()
    for name in ("sandbox", "sandbox-py"):
        shutil.copy2(BIN / name, root / name)
    (root / "bwrap").symlink_to("sandbox")
    tmp_path.chmod(0o755)
    path = socket_path(str(root))
    inst = Installation(root=root, client=root / "sandbox", socket=path, log=tmp_path / "notes.log")
    try:
        yield inst
    finally:
        if inst.server is not None:
            inst.server.terminate()
            try:
                inst.server.wait(timeout=TIMEOUT)
            finally:  # the test has failed already then: nothing is left behind anyway
                if inst.server.poll() is None:
                    inst.server.kill()
                    inst.server.wait()
        for pid in servers_of(path):  # one the client started itself
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + TIMEOUT
        while servers_of(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        for leftover in (path, path.removesuffix(".sock") + ".lock", path.removesuffix(".sock") + ".log"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)
        with contextlib.suppress(OSError):  # the socket directory, if nothing else is in it
            os.rmdir(os.path.dirname(path))


@pytest.fixture(name="served")
def cli_served(install: Installation) -> Installation:
    install.start_server()
    return install
