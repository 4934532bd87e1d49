"""A docker-registry (Debian's `docker-registry`) on a free 127.0.0.1 port, storage in a test's
temporary directory, plain HTTP, for as long as a block runs."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

REGISTRY_BIN = "docker-registry"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class start_registry:  # noqa: N801 - used as a context manager, like open()
    """Run docker-registry with `extra` YAML (auth) until the block ends."""

    def __init__(self, binary: str, work: Path, extra: str = "") -> None:
        self.port = _free_port()
        self.work = work
        config = work / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {work / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n" + extra)
        self.argv = [binary, "serve", str(config)]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        log = open(self.work / "registry.log", "wb")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError("docker-registry did not start: "
                                       + (self.work / "registry.log").read_text()[-2000:]) from None
                time.sleep(0.05)
        return f"127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

