"""A running container to exec into, for the rows that compare a Session
with `podman exec` / `docker exec` (issue 37).

The image is made here, offline: a static busybox (Debian's busybox-static)
in an otherwise empty root, imported as a local image; the container runs
`sleep` with no network. Only root's podman is tried, with runc: crun
refuses this VM's hybrid cgroup hierarchy, and root here lacks
CAP_SYS_RESOURCE, so the rlimits are pinned below the host's. docker is
tried when its daemon answers (this VM has only the client).

    with running_container() as found:
        if found.exec is None: print(found.reason)
        else: found.exec()   # one `podman exec NAME /bin/true`
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

BUSYBOX = "/bin/busybox"
IMAGE = "localhost/sandbox-bench-busybox:1"
TOOLS = ("sh", "true", "sleep", "cat")
PT_INTERP = 3


@dataclass
class Container:
    """`exec`: one exec of /bin/true into the running container (None if none runs: `reason` says why)."""

    name: str
    exec: Callable[[], None] | None
    reason: str = ""


def _busybox_tar(where: str) -> str:
    """A tar of a root holding only a static busybox and its links."""
    root = os.path.join(where, "root")
    os.makedirs(os.path.join(root, "bin"))
    shutil.copy2(BUSYBOX, os.path.join(root, "bin", "busybox"))
    for tool in TOOLS:
        os.symlink("busybox", os.path.join(root, "bin", tool))
    path = os.path.join(where, "root.tar")
    with tarfile.open(path, "w") as tar:
        tar.add(root, arcname=".")
    return path


def _static_busybox() -> bool:
    """Whether BUSYBOX is a 64-bit ELF without a PT_INTERP program header (needs no loader)."""
    try:
        with open(BUSYBOX, "rb") as f:
            head = f.read(64)
            if head[:5] != b"\x7fELF\x02":
                return False
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != PT_INTERP for i in range(phnum))


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _docker_answers() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and _run([docker, "info"]).returncode == 0  # type: ignore[list-item]


@contextlib.contextmanager
def running_container() -> Iterator[Container]:
    """A running podman (or docker) container to exec into, removed afterwards."""
    name = f"sandbox-bench-{uuid.uuid4().hex[:8]}"
    tool = shutil.which("podman") if os.geteuid() == 0 else None
    docker = _docker_answers()
    if not tool and docker:
        tool = shutil.which("docker")
    if not tool:
        yield Container(name, None, "no podman (as root) and no docker daemon here")
        return
    if not _static_busybox():
        yield Container(name, None, "no static busybox for the image (apt install busybox-static)")
        return
    runtime = ["--runtime", "runc"] if tool.endswith("podman") and shutil.which("runc") else []
    with tempfile.TemporaryDirectory() as where:
        imported = _run([tool, "import", "-q", _busybox_tar(where), IMAGE])
    if imported.returncode != 0:
        yield Container(name, None, f"{tool} import failed: {imported.stderr.strip()[-200:]}")
        return
    started = _run([tool, *runtime, "run", "-d", "--rm", "--name", name, "--network", "none",
                    "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096", IMAGE, "/bin/sleep", "100000"])
    if started.returncode != 0:
        yield Container(name, None, f"{tool} run failed: {started.stderr.strip()[-200:]}")
        return
    argv = [tool, "exec", name, "/bin/true"]

    def one_exec() -> None:
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)

    try:
        yield Container(name, one_exec)
    finally:
        _run([tool, "rm", "-f", "-t", "0", name])
