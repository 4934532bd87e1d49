"""A man in the middle for pull tests: a plain-HTTP proxy in a thread of the
test process, in front of the real registry, that can corrupt a blob or cut
its download short. Nothing else is changed: the registry's own answers
(manifests, 404s, headers) pass through."""

from __future__ import annotations

import http.server
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from http_serving import serving


class Tamper:
    """What the proxy does to one blob (`digest`): "flip" a byte, or "cut" it after half."""

    def __init__(self, digest: str = "", how: str = "") -> None:
        self.digest = digest
        self.how = how
        self.blob_requests: list[str] = []


@contextmanager
def proxy(upstream: str, tamper: Tamper) -> Iterator[str]:
    """Serve on 127.0.0.1:<free port> until the block ends; yields "127.0.0.1:PORT"."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            req = urllib.request.Request(f"http://{upstream}{self.path}",
                                         headers={k: v for k, v in self.headers.items() if k.lower() == "accept"})
            try:
                with urllib.request.urlopen(req) as resp:
                    status, headers, body = resp.status, resp.headers, resp.read()
            except urllib.error.HTTPError as exc:
                status, headers, body = exc.code, exc.headers, exc.read()
            if "/blobs/" in self.path:
                tamper.blob_requests.append(self.path.rsplit("/", 1)[1])
            target = bool(tamper.digest) and self.path.endswith(tamper.digest) and status == 200
            if target and tamper.how == "flip":
                body = body[:-1] + bytes([body[-1] ^ 1])
            self.send_response(status)
            for key in ("Content-Type", "Docker-Content-Digest", "WWW-Authenticate"):
                if headers.get(key):
                    self.send_header(key, headers[key])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if target and tamper.how == "cut":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    with serving(Handler) as port:
        yield f"127.0.0.1:{port}"
