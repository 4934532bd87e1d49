"""Attack: a sandbox swaps the handoff server's directory for a link, and the server chmods the host.

The handoff server (sandbox.compat.handoff) keeps its sockets in a
directory of the temporary directory (mode 0300: its owner binds in it,
nobody lists it). A sandbox of the same uid with a writable bind of the
temporary directory cannot list it, but it can rename it and put a link in
its place: the server then worked on the link's target by path. Its close()
chmodded the target to 0700 (as root: any host file), and a Template warmed
after the swap bound its socket in the target directory. It now holds its
directory by fd: chmod, bind, unlink and the final removal go through it,
and a link in its place is left alone.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import Bind

from .attack import make_base_spec, require, run_sh

pytestmark = pytest.mark.integration
BACKEND = "native"

# A Handoff in its own process, its temporary directory $TMPDIR: prints its directory, warms a
# Template when told ("warm"), closes when told ("close").
SERVER = """
import sys
import tempfile
from collections.abc import Iterator
from sandbox import Spec, Proc, RoBind
from sandbox.compat.handoff import Handoff
h = Handoff()
print(h._dir, flush=True)
for line in sys.stdin:
    if line.strip() == "warm":
        spec = Spec(mounts=(RoBind("/usr", "/usr"), RoBind("/bin", "/bin"), Proc()))
        try:
            h.warm("key", spec, ["sandbox-launch", "--plan", "x"])
            print("warm", flush=True)
        except Exception as exc:
            print("cold", type(exc).__name__, exc, flush=True)
    else:
        h.close()
        print("closed", flush=True)
        break
"""


class Server:
    def __init__(self, tmpdir: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "TMPDIR": str(tmpdir)})
        assert self.proc.stdout is not None
        self.dir = Path(self.proc.stdout.readline().strip())

    def say(self, word: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


def _swap(box: Path, name: str, target: Path) -> None:
    """From a sandbox with `box` bound at /box: move the server's directory aside, a link in its place."""
    require(BACKEND)
    done = run_sh(BACKEND, f"mv /box/{name} /box/moved && ln -s {target} /box/{name}",
                  make_base_spec(Bind(str(box), "/box")))
    assert done.returncode == 0, done.stderr


def _cleanup(box: Path) -> None:
    moved = box / "moved"
    if moved.is_dir() and not moved.is_symlink():
        moved.chmod(0o700)
        shutil.rmtree(moved)


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Path]:
    """The server's $TMPDIR: short (a socket's path must fit sun_path's 108 bytes), and the sandbox's."""
    tmp_path.chmod(0o755)
    box = Path(tempfile.mkdtemp(prefix="sbx-h", dir="/tmp"))
    box.chmod(0o755)
    try:
        yield box
    finally:
        _cleanup(box)
        shutil.rmtree(box)


def test_close_does_not_chmod_through_a_planted_link(box: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("host file\n")
    victim.chmod(0o644)
    server = Server(box)
    try:
        assert server.dir.parent == box
        _swap(box, server.dir.name, victim)
        assert server.say("close") == "closed"
    finally:
        server.end()
        _cleanup(box)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert victim.read_text() == "host file\n"
    assert (box / server.dir.name).is_symlink()  # left alone


def test_socket_not_bound_through_a_planted_link(box: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    server = Server(box)
    try:
        _swap(box, server.dir.name, elsewhere)
        answer = server.say("warm")
        if answer.startswith("cold"):
            pytest.skip(f"no Template here: {answer}")
        assert os.listdir(elsewhere) == [], "the server bound its socket in the link's target"
        assert server.say("close") == "closed"
    finally:
        server.end()
        _cleanup(box)
    assert os.listdir(elsewhere) == []
