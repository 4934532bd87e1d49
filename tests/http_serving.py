"""A local HTTP server for the tests that need one (a registry's token service, a proxy in front of a
registry, a server a sandbox connects to): a handler class served on 127.0.0.1 from a thread."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    """Serve `handler` on 127.0.0.1, on a port of its own (yielded), a thread per request; shut down after."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
