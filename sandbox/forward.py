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

A Unix socket target below a directory the sandbox can write (a writable
bind's source) is pinned when the relay starts (`Pin`): the part of its path
above that directory is resolved once, as the host has it; the part below is
walked again for each connection with O_PATH|O_NOFOLLOW on every component
and must end at a socket, which we connect to through /proc/self/fd/N (a
"magic link" to exactly the inode we opened). So a link the sandbox plants
(or swaps in) there is never followed with the caller's rights: the
connection is reset instead, as for a missing target. A server that
recreates its socket in place is still found.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import stat
import struct
import threading
from collections.abc import Mapping, Sequence

from ._core.fdpass import recv_fds
from .paths import root_holding

Target = int | str  # a host loopback TCP port, or a Unix socket path

CHUNK = 1 << 16


def receive_listeners(sock: socket.socket, count: int) -> list[socket.socket]:
    """The `count` listening sockets the setup child sent over `sock`."""
    out: list[socket.socket] = []
    while len(out) < count:
        _, fds, _ = recv_fds(sock, 1, count - len(out))
        if not fds:
            raise ConnectionError("the sandbox's setup child sent fewer listening sockets than asked")
        out += [socket.socket(fileno=fd) for fd in fds]
    return out


_MAX_LINKS = 40  # the kernel's limit on links followed in one lookup




def _split_at_writable(target: str, roots: Sequence[str]) -> tuple[str, list[str]] | None:
    """(directory, components below it) where resolving `target` as the
    kernel would first enters one of `roots` (resolved), or None if it never
    does. Links are followed only above that point (the host's own), each
    read by us rather than by realpath(), which would follow the planted
    ones below it too."""
    comps, cur, links = [c for c in target.split("/") if c], "/", 0
    while comps:
        root = root_holding(cur, roots)
        if root is not None:
            return cur, comps
        comp = comps.pop(0)
        if comp == ".":
            continue
        if comp == "..":
            cur = os.path.dirname(cur)
            continue
        cand = os.path.join(cur, comp)
        if os.path.islink(cand):
            links += 1
            if links > _MAX_LINKS:
                return None  # ELOOP at connect time as well
            link = os.readlink(cand)
            comps[:0] = [c for c in link.split("/") if c]
            cur = "/" if link.startswith("/") else cur
            continue
        cur = cand
    return None


class Pin:
    """A Unix socket target below a directory the sandbox can write: that
    directory held open (O_PATH) from the start, the rest walked without
    following links for each connection."""

    def __init__(self, directory: str, below: list[str]) -> None:
        self.dir_fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.below = below

    @classmethod
    def make(cls, target: str, writable: Sequence[str]) -> Pin | None:
        """A Pin for `target` if it lies below one of the `writable` host
        directories (as the host resolves them now), else None."""
        roots = [os.path.realpath(w) for w in writable]
        split = _split_at_writable(target, roots) if roots else None
        return cls(*split) if split is not None else None

    def connect(self) -> socket.socket:
        """Connect to the socket at the pinned path, never through a link below the pinned directory."""
        fd = os.dup(self.dir_fd)
        try:
            for comp in self.below:
                if comp == "..":  # would climb out of the directory we checked
                    raise OSError(errno.EXDEV, "'..' below a writable directory", comp)
                nfd = os.open(comp, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = nfd
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):  # also a link: O_PATH|O_NOFOLLOW opens the link itself
                raise OSError(errno.ECONNREFUSED, "not a socket (a link, or replaced)", "/".join(self.below))
            return _connect_path(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self.dir_fd)


def _connect_path(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except BaseException:
        s.close()
        raise
    return s


def _connect(target: Target, pin: Pin | None = None) -> socket.socket:
    if isinstance(target, int):
        return socket.create_connection(("127.0.0.1", target))
    if pin is not None:
        return pin.connect()
    return _connect_path(target)


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
    """Relays connections accepted on `listeners` to their targets until `close()`.

    `writable`: host directories the sandbox can write (Plan.forward_writable);
    Unix socket targets below them are pinned (`Pin`).
    """

    def __init__(self, listeners: Sequence[socket.socket], targets: Sequence[Target],
                 writable: Sequence[str] = ()) -> None:
        self._targets = {ls.fileno(): t for ls, t in zip(listeners, targets, strict=True)}
        self._pins: dict[int, Pin] = {}
        try:
            for ls, t in zip(listeners, targets, strict=True):
                pin = Pin.make(t, writable) if isinstance(t, str) else None
                if pin is not None:
                    self._pins[ls.fileno()] = pin
        except BaseException:
            self._close_pins()
            raise
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
            upstream = _connect(self._targets[listener.fileno()], self._pins.get(listener.fileno()))
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
        self._close_pins()

    def _close_pins(self) -> None:
        for pin in self._pins.values():
            pin.close()
        self._pins.clear()


def start(sock: socket.socket, forward: Mapping[int, Target] | Sequence[tuple[int, Target]],
          writable: Sequence[str] = ()) -> Forwarder:
    """Receive the listeners for `forward` (inside port -> target, in order)
    and relay them (`writable` as for Forwarder)."""
    pairs = list(forward.items()) if isinstance(forward, Mapping) else list(forward)
    listeners = receive_listeners(sock, len(pairs))
    return Forwarder(listeners, [t for _, t in pairs], writable)
