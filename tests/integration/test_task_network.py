"""The task sandbox's network, on both backends, root and unprivileged.

Every service is on the host's loopback; host names used resolve to loopback
(`localhost`); nothing leaves loopback. Clients run inside with the
framework's interpreter.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_serving import serving
from task_helpers import PY, pyrun, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

from sandbox import IsolationError, task
from sandbox.task import Proxy, Sandbox

pytestmark = pytest.mark.integration


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802  (the stdlib's name)
        body = f"hello {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def http_server() -> Iterator[int]:
    """An HTTP server on the host's 127.0.0.1; yields its port."""
    with serving(_Hello) as port:
        yield port


GET = ("import os, sys, urllib.request\n"
       "for url in sys.argv[1:]:\n"
       "    try:\n"
       "        print(urllib.request.urlopen(url, timeout=10).read().decode())\n"
       "    except Exception as e:\n"
       "        print('FAIL', type(e).__name__, getattr(e, 'code', ''))\n")


def get(sb: Sandbox, backend: str, *urls: str, environ: dict[str, str] | None = None) -> list[str]:
    r = task.run([PY, "-c", GET, *urls],
                 sb, backend=backend, capture_output=True, text=True, timeout=60, environ=environ)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split("\n")


def test_ports_are_forwarded_and_nothing_else_reaches_the_host(backend: str) -> None:
    with http_server() as port, http_server() as other:
        out = get(Sandbox(ports=(port,)), backend, f"http://127.0.0.1:{port}/a", f"http://127.0.0.1:{other}/b")
    assert out[0] == "hello /a"
    assert out[1].startswith("FAIL")


def test_an_env_url_is_forwarded_and_an_argv_url_is_not(backend: str) -> None:
    with http_server() as in_env, http_server() as in_argv:
        environ = {"MODEL_URL": f"http://localhost:{in_env}/v1"}
        sb = Sandbox(env_allow=("MODEL_URL",))
        out = get(sb, backend, f"http://127.0.0.1:{in_env}/e", f"http://127.0.0.1:{in_argv}/a", environ=environ)
        r = task.run(["sh", "-c", "echo $MODEL_URL"], sb, backend=backend, capture_output=True, text=True,
                     environ=environ, timeout=60)
    assert out[0] == "hello /e" and out[1].startswith("FAIL")
    assert r.stdout.strip() == f"http://localhost:{in_env}/v1"
    assert r.record["ports"] == [in_env]


def test_a_unix_socket_is_forwarded(backend: str, tmp_path: Path) -> None:
    path = str(tmp_path / "meter.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)

    def serve() -> None:  # the isolation check connects first (and sends nothing)
        with contextlib.suppress(OSError):
            while True:
                conn, _ = srv.accept()
                with conn:
                    data = conn.recv(100)
                    if data:
                        conn.sendall(b"metered " + data)
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        code = ("import socket; s = socket.create_connection(('127.0.0.1', 7311)); s.sendall(b'x'); "
                "print(s.recv(100).decode())")
        r = pyrun(code, Sandbox(sockets={7311: path}), backend)
    finally:
        srv.shutdown(socket.SHUT_RDWR)
        srv.close()
        t.join(5)
    assert r.stdout.strip() == "metered x", r.stderr


def test_the_proxy_allows_one_host_and_refuses_another(backend: str) -> None:
    with http_server() as port:
        sb = Sandbox(proxy=Proxy(("localhost",)))
        # NO_PROXY sends loopback names direct (test_task_no_proxy.py); dropped
        # here, so the proxy's own matching of names is what is tested.
        through = ("import os\nfor v in ('NO_PROXY', 'no_proxy'): del os.environ[v]\n" + GET)
        r = task.run([PY, "-c", through, f"http://localhost:{port}/ok", f"http://127.0.0.1:{port}/no"],
                     sb, backend=backend, capture_output=True, text=True, timeout=60)
        out = r.stdout.strip().split("\n")
        code = (f"import socket; s = socket.create_connection(('127.0.0.1', int(__import__('os').environ["
                f"'HTTPS_PROXY'].rsplit(':', 1)[1]))); s.sendall(b'CONNECT localhost:{port} HTTP/1.1\\r\\n\\r\\n');"
                "print(s.recv(100).split(b'\\r\\n')[0].decode());"
                "s.sendall(b'GET /tunnel HTTP/1.0\\r\\n\\r\\n'); import time; time.sleep(0.2);"
                "print(s.recv(1000).decode().rsplit('\\r\\n', 1)[-1])")
        tunnel = pyrun(code, sb, backend)
        r = pyrun("import os; print(sorted(k for k in os.environ if 'proxy' in k.lower()))", sb, backend)
    assert out[0] == "hello /ok"
    assert out[1] == "FAIL HTTPError 403"  # localhost does not imply 127.0.0.1
    assert tunnel.stdout.split("\n")[:2] == ["HTTP/1.1 200 Connection established", "hello /tunnel"], tunnel.stderr
    assert r.stdout.strip() == "['HTTPS_PROXY', 'HTTP_PROXY', 'NO_PROXY', 'http_proxy', 'https_proxy', 'no_proxy']"


def test_a_forwarded_port_that_does_not_answer_fails_the_start(backend: str, tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = s.getsockname()[1]
    s.close()
    marker = tmp_path / "ran"
    with pytest.raises(IsolationError, match=f"port {dead}"):
        task.run(["touch", str(marker)], Sandbox(ports=(dead,), write=(str(tmp_path),)), backend=backend)
    assert not marker.exists()


def test_open_is_the_host_network(backend: str) -> None:
    with http_server() as port:
        out = get(Sandbox(network="open"), backend, f"http://127.0.0.1:{port}/open")
    assert out == ["hello /open"]
