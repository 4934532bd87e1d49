"""The allowlist proxy: HTTP CONNECT and plain HTTP to `allowed_hosts` only.

It listens on the host's 127.0.0.1 and is forwarded into the sandbox (where
HTTP_PROXY, HTTPS_PROXY and their lower-case forms point at it). A request's
host is matched by exact name, on any port: `localhost` allows neither
`127.0.0.1` nor `LOCALHOST.` spelled otherwise than listed. Anything else is
refused with `403 Forbidden` before any connection is made; a request that is
not HTTP gets `400 Bad Request`. Allowed connections are relayed as they are
(CONNECT: a byte tunnel, the TLS stays end to end; plain HTTP: the request
line rewritten to origin form and the rest passed through).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterable
from urllib.parse import urlsplit

from ..forward import _Pair

MAX_HEAD = 64 * 1024


def _split_host_port(text: str, default: int) -> tuple[str, int] | None:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    try:
        port = int(port_text) if port_text else default
    except ValueError:
        return None
    if not host or not 1 <= port <= 65535:
        return None
    return host.lower(), port


class AllowlistProxy:
    """A proxy thread on 127.0.0.1:`port` (0: any free port) until `close()`."""

    def __init__(self, allowed_hosts: Iterable[str], port: int = 0) -> None:
        self.allowed = frozenset(h.lower() for h in allowed_hosts)
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(64)
        self.port: int = self._sock.getsockname()[1]
        self.refused: list[str] = []  # hosts refused, for the record
        self._closed = False
        self._pairs: list[_Pair] = []
        self._thread = threading.Thread(target=self._serve, name="sandbox-task-proxy", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self._closed:
                conn.close()
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True, name="sandbox-task-proxy-conn").start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            head = self._read_head(conn)
            if head is None:
                return _reply(conn, 400, "Bad Request")
            line, _, rest = head.partition(b"\r\n")
            parts = line.decode("latin-1").split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                return _reply(conn, 400, "Bad Request")
            method, target, version = parts
            if method == "CONNECT":
                where = _split_host_port(target, 443)
                first = b""
            else:
                url = urlsplit(target)
                if url.scheme != "http" or not url.netloc:
                    return _reply(conn, 400, "Bad Request")
                where = _split_host_port(url.netloc.rpartition("@")[2], 80)
                path = (url.path or "/") + (f"?{url.query}" if url.query else "")
                first = f"{method} {path} {version}\r\n".encode("latin-1") + rest
            if where is None:
                return _reply(conn, 400, "Bad Request")
            host, port = where
            if host not in self.allowed:
                self.refused.append(host)
                return _reply(conn, 403, "Forbidden", f"host {host} is not allowed by the sandbox's proxy\n")
            try:
                upstream = socket.create_connection((host, port), timeout=10)
                upstream.settimeout(None)
            except OSError:
                return _reply(conn, 502, "Bad Gateway")
            if method == "CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(first)
            self._relay(conn, upstream)
        except OSError:
            conn.close()

    def _read_head(self, conn: socket.socket) -> bytes | None:
        data = b""
        conn.settimeout(30)
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk or len(data) > MAX_HEAD:
                return None
            data += chunk
        conn.settimeout(None)
        return data

    def _relay(self, conn: socket.socket, upstream: socket.socket) -> None:
        pair = _Pair(conn, upstream)
        self._pairs = [p for p in self._pairs if p.pumps_left] + [pair]
        t = threading.Thread(target=pair.pump, args=(upstream, conn), daemon=True)
        t.start()
        pair.pump(conn, upstream)
        t.join()

    def close(self) -> None:
        """Stop accepting and end every relayed connection."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)
        for pair in self._pairs:
            pair.abort()


def _reply(conn: socket.socket, code: int, reason: str, body: str = "") -> None:
    data = body.encode()
    with contextlib.suppress(OSError):
        conn.sendall(f"HTTP/1.1 {code} {reason}\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                     + data)
    conn.close()
