"""Attack: one client's request kills the CLI server (issue 36, the note on `--args` replays).

The server remembers the answers it gave, by the request's bytes, and
looked a request up before it counted its fds: an unconfined process of
the same user that resent a remembered `--args` request without its fds
made the lookup index past them, an error nothing caught, and the server
was gone for every later client. The count is checked before any lookup
now, and whatever one request provokes ends with that client running
directly (FALLBACK), never with the server. Each attack here is followed
by an ordinary `sandbox run`, which the same server must still serve.
"""

from __future__ import annotations

import os
import socket
import struct

import pytest

from sandbox._core import cliwire as wire

from .cli_deputy import (  # noqa: F401  (cli_install, cli_served: the fixtures `install`, `served`)
    SYSTEM,
    Installation,
    cli_install,
    cli_served,
    request,
)

pytestmark = pytest.mark.integration


def _ask(inst: Installation, data: bytes, fds: list[int]) -> bytes:
    """Send `data` with `fds` as one request; the server's first answer (b"": none)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.connect(inst.socket)
        s.settimeout(30)
        s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))] if fds else [])
        try:
            return s.recv(wire.MAX_ANSWER + 1)
        except (ConnectionResetError, TimeoutError):
            return b""
    finally:
        s.close()


def _still_serves(inst: Installation) -> None:
    assert inst.server is not None and inst.server.poll() is None, "the server is gone"
    before = inst.plans()
    result = inst.run("run", *SYSTEM, "sh", "-c", "echo served")
    assert (result.returncode, result.stdout) == (0, "served\n"), result.stderr
    assert inst.plans() == before + 1, "the next client was not served"


def _args_pipe() -> int:
    """A pipe holding an --args file (SYSTEM), its writer closed: its read end."""
    r, w = os.pipe2(os.O_CLOEXEC)
    os.write(w, b"".join(a.encode() + b"\0" for a in SYSTEM))
    os.close(w)
    return r


def test_a_remembered_args_request_resent_without_its_fds(served: Installation) -> None:
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    args = _args_pipe()
    try:
        data = request(served, ["sandbox", "run", "--args", "3", "true"], fds=(0, 1, 2, 3))
        first = _ask(served, data, [null, null, null, args])
        assert wire.parse_frame(first[:wire.FRAME_SIZE])[0] == wire.PLAN  # answered, and remembered
        assert wire.parse_frame(_ask(served, data, [])) == (wire.FALLBACK, 0)
        assert wire.parse_frame(_ask(served, data, [null])) == (wire.FALLBACK, 0)
    finally:
        os.close(null)
        os.close(args)
    _still_serves(served)


def _header(nfds: int = 0, size: int = 0, magic: int = wire.MAGIC, version: int = wire.VERSION) -> bytes:
    head = wire.ffi.new("struct sbx_cli_request *", {"magic": magic, "version": version, "argc": 1, "nfds": nfds,
                                                     "size": size})
    return bytes(wire.ffi.buffer(head))


@pytest.mark.parametrize("kind", ["garbage", "empty-ish", "oversized", "truncated", "fds announced, none sent",
                                  "bad magic", "argc beyond the strings", "huge counts"])
def test_a_malformed_request_leaves_the_server_serving(served: Installation, kind: str) -> None:
    good = request(served, ["sandbox", "run", *SYSTEM, "true"])
    data = {
        "garbage": os.urandom(997),
        "empty-ish": b"\0",
        "oversized": good + b"A" * (wire.MAX_REQUEST + 10),
        "truncated": good[:-7],
        "fds announced, none sent": _header(nfds=3, size=4) + struct.pack("3i", 0, 1, 2) + b"a\0/\0",
        "bad magic": _header(magic=0xDEADBEEF, size=4) + b"a\0/\0",
        "argc beyond the strings": _header(size=2) + b"a\0",
        "huge counts": _header(nfds=0xFFFFFFFF, size=0xFFFFFFF0),
    }[kind]
    answer = _ask(served, data, [])
    assert answer == b"" or wire.parse_frame(answer) == (wire.FALLBACK, 0)
    _still_serves(served)
