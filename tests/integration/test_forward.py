"""Port forwarding and the network isolation check, native backend, root and unprivileged.

Every host service here listens on the host's loopback; clients run inside
sandboxes that have only their own loopback, and reach the service through the
forwarded port. No traffic goes anywhere but loopback.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import usable_backend, wait_until

import sandbox
from sandbox import netpool

pytestmark = pytest.mark.integration

PY = "/usr/bin/python3"


@pytest.fixture(params=["native", "bwrap"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each test runs on both backends: forwarding and the check must hold under bwrap too."""
    return usable_backend(request.param)


@contextlib.contextmanager
def echo_server(unix_path: str | None = None) -> Iterator[int | str]:
    """An echo service on the host (TCP 127.0.0.1, or a Unix socket); yields its address."""
    if unix_path:
        srv = socket.socket(socket.AF_UNIX)
        srv.bind(unix_path)
        where: int | str = unix_path
    else:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        where = srv.getsockname()[1]
    srv.listen(64)
    stop = threading.Event()

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield where
    finally:
        stop.set()
        srv.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone would not
        srv.close()
        thread.join(timeout=5)
        assert not thread.is_alive()


def run_py(spec: sandbox.Spec, code: str, *args: str, backend: str = "native") -> sandbox.CompletedProcess:
    return sandbox.run([PY, "-I", "-S", "-c", code, *args], spec, capture_output=True, text=True, timeout=120,
                       backend=backend)


ROUND_TRIP = """
import hashlib, socket, sys, threading
size = int(sys.argv[1])
data = bytes(range(256)) * (size // 256)
s = socket.create_connection(("127.0.0.1", 8080))
def send():
    s.sendall(data); s.shutdown(socket.SHUT_WR)   # half-close: the echo still flows back
t = threading.Thread(target=send); t.start()
got = bytearray()
while chunk := s.recv(1 << 16):
    got += chunk
t.join()
print(len(got), hashlib.sha256(got).hexdigest())
"""


def expected(size: int) -> str:
    data = bytes(range(256)) * (size // 256)
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def relay_threads() -> set[threading.Thread]:
    """The relays' threads alive in this process (a test compares them with those before it: only its own count)."""
    return {t for t in threading.enumerate() if t.name.startswith("sandbox-forward")}


def test_ten_megabytes_round_trip_byte_exact(base_spec, backend: str) -> None:
    size = 10 << 20
    before = relay_threads()
    with echo_server() as port:
        done = run_py(base_spec(forward={8080: port}), ROUND_TRIP, str(size), backend=backend)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected(size)
    assert done.isolation["forwarded"] == {8080: port}
    assert not relay_threads() - before


def test_a_unix_socket_target(base_spec, tmp_path: Path, backend: str) -> None:
    path = str(tmp_path / "service.sock")
    with echo_server(path) as where:
        done = run_py(base_spec(forward={8080: where}), ROUND_TRIP, "65536", backend=backend)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected(65536)


CONCURRENT = """
import socket, threading
results = {}
def one(i):
    payload = (b"conn-%03d:" % i) * 5000
    s = socket.create_connection(("127.0.0.1", 8080))
    s.sendall(payload); s.shutdown(socket.SHUT_WR)
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    results[i] = got == payload
ts = [threading.Thread(target=one, args=(i,)) for i in range(50)]
[t.start() for t in ts]; [t.join() for t in ts]
print(sum(results.values()), len(results))
"""


def test_fifty_concurrent_connections_do_not_mix(base_spec, backend: str) -> None:
    with echo_server() as port:
        done = run_py(base_spec(forward={8080: port}), CONCURRENT, backend=backend)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["50", "50"]


REFUSED = """
import socket, time
t = time.monotonic()
try:  # the reset may already be there when connect() returns (a busy machine), or come at the first read
    s = socket.create_connection(("127.0.0.1", 8080), timeout=30)
    data = s.recv(10)
    print("eof" if data == b"" else "data", round(time.monotonic() - t, 1))
except ConnectionResetError:
    print("reset", round(time.monotonic() - t, 1))
"""


def test_no_host_listener_means_a_reset_not_a_hang(base_spec, backend: str) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    done = run_py(base_spec(forward={8080: port}), REFUSED, backend=backend)
    assert done.returncode == 0, done.stderr
    what, seconds = done.stdout.split()
    assert what == "reset" and float(seconds) < 5


def test_check_reports_the_network_findings(base_spec, backend: str) -> None:
    done = sandbox.run(["true"], base_spec(check=True), backend=backend, timeout=60)
    assert done.isolation["network"] == {"interfaces": ["lo"], "addresses": ["127.0.0.1/8", "::1/128"],
                                         "routes": 0}


def test_host_network_says_so(base_spec, backend: str) -> None:
    done = sandbox.run(["true"], base_spec(network="host"), backend=backend, timeout=60)
    assert done.network == "host"
    with pytest.raises(sandbox.SpecError):
        base_spec(network="host", forward={8080: 9090})


def test_forward_validation() -> None:
    for bad in ({0: 80}, {80: 0}, {80: "relative.sock"}, {"x": 80}):
        with pytest.raises(sandbox.SpecError):
            sandbox.Spec(forward=bad)
    spec = sandbox.Spec(forward={8080: 9090, 53: "/run/dns.sock"})
    assert sandbox.Spec.from_json(spec.to_json()) == spec


def test_nothing_is_left_after_the_session(base_spec) -> None:
    before = relay_threads()
    with echo_server() as port:
        for _ in range(3):
            assert run_py(base_spec(forward={8080: port}), ROUND_TRIP, "4096").returncode == 0
    assert wait_until(lambda: not relay_threads() - before, timeout=5)
    pool = netpool.pool_for("pool")
    assert pool is not None and pool.wait_filled(10)
    assert pool.stats()["in_use"] == pool.stats()["reserved"]  # only kept Templates' standbys hold leases
    netpool.disable()
    assert pool.closed
    netpool.restore_default()
