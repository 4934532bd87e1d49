"""Port forwarding: relay connections from inside a sandbox to a host service.

The sandbox's setup child makes a listening socket on 127.0.0.1:PORT inside the
sandbox's own network namespace and hands it to us (SCM_RIGHTS). A client
inside connects to it as to any local service; we accept on the host side and
relay the bytes to the target: a TCP port on the host's loopback or a Unix
socket path. The sandbox never joins the host's network namespace, and
nothing runs inside it for this. Each connection is relayed by two threads
(one per direction) that carry a half-close across (shutdown(SHUT_WR)), so
request/response protocols that signal "done" by closing their write side
work. A target that refuses the connection makes us reset the client's
connection at once (it sees ECONNRESET, never a hang).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from collections.abc import Mapping, Sequence

Target = int | str  # a host loopback TCP port, or a Unix socket path

CHUNK = 1 << 16


def receive_listeners(sock: socket.socket, count: int) -> list[socket.socket]:
    """The `count` listening sockets the setup child sent over `sock`."""
    out: list[socket.socket] = []
    while len(out) < count:
        _, fds, _, _ = socket.recv_fds(sock, 1, count - len(out))
        if not fds:
            raise ConnectionError("the sandbox's setup child sent fewer listening sockets than asked")
        out += [socket.socket(fileno=fd) for fd in fds]
    return out


def _connect(target: Target) -> socket.socket:
    if isinstance(target, int):
        return socket.create_connection(("127.0.0.1", target))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(target)
    except BaseException:
        s.close()
        raise
    return s


def _reset(conn: socket.socket) -> None:
    """Close with RST: the client learns at once that nothing is there."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class _Pair:
    """One relayed connection: the client's socket and the target's, closed
    when both directions are done."""

    def __init__(self, inside: socket.socket, outside: socket.socket) -> None:
        self.sockets = (inside, outside)
        self.pumps_left = 2
        self.lock = threading.Lock()

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy src to dst until EOF, then half-close dst (the peer sees EOF
        while its own direction goes on)."""
        try:
            while data := src.recv(CHUNK):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:  # a reset on one side ends both directions
            self.abort()
        with self.lock:
            self.pumps_left -= 1
            last = self.pumps_left == 0
        if last:
            for s in self.sockets:
                s.close()

    def abort(self) -> None:
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class Forwarder:
    """Relays connections accepted on `listeners` to their targets until `close()`."""

    def __init__(self, listeners: Sequence[socket.socket], targets: Sequence[Target]) -> None:
        self._targets = {ls.fileno(): t for ls, t in zip(listeners, targets, strict=True)}
        self._listeners = list(listeners)
        self._pairs: list[_Pair] = []
        self._threads: list[threading.Thread] = []
        self._stop_r, self._stop_w = socket.socketpair()
        self._closed = False
        self._acceptor = threading.Thread(target=self._accept_loop, name="sandbox-forward", daemon=True)
        self._acceptor.start()

    @property
    def ports(self) -> list[int]:
        """The ports listened on inside the sandbox."""
        return [ls.getsockname()[1] for ls in self._listeners]

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._stop_r, selectors.EVENT_READ)
            for ls in self._listeners:
                sel.register(ls, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj is self._stop_r:
                        return
                    self._accept(key.fileobj)  # type: ignore[arg-type]

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = _connect(self._targets[listener.fileno()])
        except OSError:
            _reset(conn)
            return
        pair = _Pair(conn, upstream)
        self._pairs = [p for p in self._pairs if p.pumps_left] + [pair]
        self._threads = [t for t in self._threads if t.is_alive()]
        for src, dst in ((conn, upstream), (upstream, conn)):
            t = threading.Thread(target=pair.pump, args=(src, dst), name="sandbox-forward-pump", daemon=True)
            self._threads.append(t)
            t.start()

    def close(self) -> None:
        """Stop accepting, end every relayed connection, close the listeners (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop_w.send(b"x")
        self._acceptor.join()
        for pair in self._pairs:
            pair.abort()
        for t in self._threads:
            t.join(timeout=5)
        for s in (*self._listeners, self._stop_r, self._stop_w):
            s.close()


def start(sock: socket.socket, forward: Mapping[int, Target] | Sequence[tuple[int, Target]]) -> Forwarder:
    """Receive the listeners for `forward` (inside port -> target, in order) and relay them."""
    pairs = list(forward.items()) if isinstance(forward, Mapping) else list(forward)
    listeners = receive_listeners(sock, len(pairs))
    return Forwarder(listeners, [t for _, t in pairs])
