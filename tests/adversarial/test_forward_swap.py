"""Issue 11, item 8: a forwarded Unix-socket target inside a writable bind,
swapped by the sandbox for a link to another host socket, must not be
followed by the relay (which connects with the caller's rights).

The sandbox replaces the target (or a directory on its path) with a link to
a second host socket it was never given; a connection to the forwarded port
must then be reset, never reach that socket. Both backends, root and
unprivileged. A target outside any writable bind is connected by path as
before, and a server that recreates its socket in place is still found.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox
from sandbox import Bind

from .attack import BACKENDS, PYTHON, require, require_spawnable, run_py

pytestmark = pytest.mark.integration


@contextlib.contextmanager
def greeter(path: Path, greeting: bytes) -> Iterator[list[int]]:
    """A host Unix socket at `path` that sends `greeting` to each client; yields the list of accepts."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(16)
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            accepted.append(1)
            with conn:
                conn.sendall(greeting)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield accepted
    finally:
        srv.shutdown(socket.SHUT_RDWR)
        srv.close()
        thread.join(timeout=5)
        assert not thread.is_alive()


# argv: the path to replace inside, the link's text (a host path)
SWAP_AND_CONNECT = """
import os, shutil, socket, sys
victim, link = sys.argv[1], sys.argv[2]
def ask():
    s = socket.create_connection(("127.0.0.1", 8080))
    try:
        s.settimeout(10)
        return s.recv(64).decode() or "eof"
    except OSError as e:
        return type(e).__name__
    finally:
        s.close()
before = ask()
if os.path.isdir(victim) and not os.path.islink(victim):
    shutil.rmtree(victim)
else:
    os.unlink(victim)
os.symlink(link, victim)
print(before, ask())
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("swap", ["socket", "directory"])
def test_a_swapped_target_is_not_followed(base_spec, tmp_path: Path, backend: str, swap: str) -> None:
    if backend == "template":
        pytest.skip("a Template does not forward ports")
    require(backend)
    box = tmp_path / "box"
    (box / "svc").mkdir(parents=True)
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    target = box / "svc" / "service.sock"
    secret = secret_dir / "service.sock"  # same name: a directory swap lands on it
    victim, link = (("/box/svc/service.sock", str(secret)) if swap == "socket"
                    else ("/box/svc", str(secret_dir)))
    spec = base_spec(Bind(str(box), "/box"), forward={8080: str(target)})
    with greeter(target, b"public"), greeter(secret, b"SECRET") as secret_accepts:
        done = run_py(backend, SWAP_AND_CONNECT, spec, victim, link)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert before == "public"
    assert "SECRET" not in done.stdout and not secret_accepts, "the relay followed the planted link"
    assert after in ("ConnectionResetError", "eof"), done.stdout


RECONNECT = """
import socket
def ask():
    s = socket.create_connection(("127.0.0.1", 8080))
    s.settimeout(10)
    with s:
        try:
            return s.recv(64).decode() or "eof"
        except OSError as e:
            return type(e).__name__
print(ask())
input()
print(ask())
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_socket_recreated_in_place_is_still_found(base_spec, tmp_path: Path, backend: str) -> None:
    if backend == "template":
        pytest.skip("a Template does not forward ports")
    require_spawnable(backend)
    box = tmp_path / "box"
    box.mkdir()
    target = box / "service.sock"
    spec = base_spec(Bind(str(box), "/box"), forward={8080: str(target)})
    proc = sandbox.spawn([PYTHON, "-I", "-S", "-c", RECONNECT], spec, backend=backend, stdin=-1, stdout=-1)
    try:
        with greeter(target, b"first"):
            assert proc.stdout.readline().strip() == b"first"
        os.unlink(target)
        with greeter(target, b"second"):
            proc.stdin.write(b"\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == b"second"
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
