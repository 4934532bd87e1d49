"""With the proxy set, loopback and forwarded ports go direct, with real HTTP clients (issue 24, item 2).

Inside a task sandbox with `ports` and a `proxy`, urllib (and requests and
httpx where the framework's interpreter has them) reach a real HTTP server on
the host's loopback through the forwarded port, not through the proxy (which
would answer 403); and a host of the allowlist (the machine's own name, when
it resolves to loopback, so nothing leaves loopback) is still reached through
the proxy.
"""

from __future__ import annotations

import importlib.util
import socket

import pytest
from task_helpers import PY, pyrun, task_backend  # noqa: F401  (task_backend: the fixture `backend`)
from test_task_network import http_server

from sandbox import task
from sandbox.task import Proxy, Sandbox

pytestmark = pytest.mark.integration

CLIENTS = {
    "urllib": "import urllib.request\ndef get(u): return urllib.request.urlopen(u, timeout=10).read().decode()\n",
    "requests": "import requests\ndef get(u): r = requests.get(u, timeout=10); r.raise_for_status(); return r.text\n",
    "httpx": "import httpx\ndef get(u): r = httpx.get(u, timeout=10); r.raise_for_status(); return r.text\n",
}


def _loopback_name() -> str:
    """A name of this machine that resolves to 127.0.0.1 and is not a loopback name of NO_PROXY."""
    name = socket.gethostname()
    try:
        addr = socket.gethostbyname(name)
    except OSError:
        addr = ""
    if not name or name == "localhost" or addr != "127.0.0.1":
        pytest.skip(f"the host name {name!r} does not resolve to 127.0.0.1 (needed to stay on loopback)")
    return name


@pytest.fixture(params=sorted(CLIENTS))
def client(request: pytest.FixtureRequest) -> str:
    """Each client; requests and httpx are skipped (visibly) where not installed."""
    if request.param != "urllib" and importlib.util.find_spec(request.param) is None:
        pytest.skip(f"{request.param} is not installed in this interpreter")
    return str(request.param)


def test_a_forwarded_port_goes_direct_and_an_allowed_host_through_the_proxy(backend: str, client: str) -> None:
    name = _loopback_name()
    with http_server() as forwarded, http_server() as behind_proxy:
        sb = Sandbox(ports=(forwarded,), proxy=Proxy((name,)))
        code = CLIENTS[client] + "import sys\nfor u in sys.argv[1:]:\n    print(get(u))\n"
        urls = [f"http://127.0.0.1:{forwarded}/ip", f"http://localhost:{forwarded}/name",
                f"http://{name}:{behind_proxy}/proxied"]
        r = task.run([PY, "-c", code, *urls], sb, backend=backend, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["hello /ip", "hello /name", "hello /proxied"], r.stderr


def test_the_proxy_still_refuses_a_host_off_the_list(backend: str) -> None:
    name = _loopback_name()
    with http_server() as port:
        sb = Sandbox(proxy=Proxy((name,)))
        code = ("import os, socket\n"
                "p = int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])\n"
                "s = socket.create_connection(('127.0.0.1', p))\n"
                f"s.sendall(b'GET http://localhost:{port}/ HTTP/1.0\\r\\n\\r\\n')\n"
                "print(s.recv(200).split(b'\\r\\n')[0].decode())\n"
                "print(os.environ['NO_PROXY'] == os.environ['no_proxy'])\n")
        r = pyrun(code, sb, backend)
    assert r.stdout.split("\n")[:2] == ["HTTP/1.1 403 Forbidden", "True"], r.stderr
