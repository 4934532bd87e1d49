"""Attack: a link one run plants in its writable bind redirects the next run's setup to the host.

bwrap resolves destinations under /newroot with the host visible at
/oldroot, so `config -> ../../oldroot/<host dir>` (or `/oldroot/<host dir>`)
left in a bound directory turned the next run's File, Dir, Symlink, Chmod and
the mount points of its Tmpfs and Bind below it into writes on the host. The
native backend resolves inside the new root. Each case plants the link from
inside a sandbox, runs the next one, and checks the host directory the link
names: nothing written, created or chmod'ed, whatever the run's outcome (a
contained run, or a SetupError naming the path). The race case swaps a
directory and a link from a sandbox still running on the same bind while
the next runs set up.
"""

from __future__ import annotations

import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import sandbox
from sandbox import Bind, Chmod, Dir, File, RoBind, SetupError, Symlink, Tmpfs

from .attack import BACKENDS, PYTHON, make_base_spec, require, require_spawnable, run_sh

pytestmark = pytest.mark.integration


class Host:
    """A writable directory to bind (`box`) and a host directory beside it the attack aims at (`victim`)."""

    def __init__(self, root: Path) -> None:
        root.chmod(0o755)
        self.box, self.victim, self.other = root / "box", root / "victim", root / "other"
        for d in (self.box, self.victim, self.other):
            d.mkdir(mode=0o755)
            d.chmod(0o755)
        (self.victim / "file").write_text("original\n")
        (self.victim / "file").chmod(0o644)

    def state(self) -> dict[str, tuple[int, bytes]]:
        """Everything below the victim: mode and contents."""
        out = {}
        for path in [self.victim, *sorted(self.victim.rglob("*"))]:
            st = path.lstat()
            data = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
            out[str(path.relative_to(self.victim))] = (st.st_mode, data)
        return out

    def link_target(self, kind: str, below: str = "") -> str:
        """A link target that leads to the victim (`below` it) through bwrap's /oldroot."""
        where = str(self.victim / below if below else self.victim).lstrip("/")
        return ("../../oldroot/" if kind == "relative" else "/oldroot/") + where


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


# (name, link's target below the victim, the ops of the next run, given the host)
CASES: list[tuple[str, str, Callable[[Host], list[sandbox.Mount]]]] = [
    ("file_below", "", lambda h: [File("/box/config/evil", b"pwned\n")]),
    ("dir_below", "", lambda h: [Dir("/box/config/newdir")]),
    ("deep_dir_below", "", lambda h: [Dir("/box/config/a/b/c")]),
    ("symlink_below", "", lambda h: [Symlink("/etc/passwd", "/box/config/newlink")]),
    ("chmod_below", "", lambda h: [Chmod("/box/config/file", 0o777)]),
    ("tmpfs_below", "", lambda h: [Tmpfs("/box/config/t")]),
    ("bind_below", "", lambda h: [Bind(str(h.other), "/box/config/b")]),
    ("robind_file_below", "", lambda h: [RoBind(str(h.victim / "file"), "/box/config/f2")]),
    ("readonly_file_below", "", lambda h: [File("/box/config/ro", b"pwned\n", readonly=True)]),
    ("file_on_link", "file", lambda h: [File("/box/config", b"pwned\n")]),
    ("chmod_on_link", "file", lambda h: [Chmod("/box/config", 0o777)]),
    ("chmod_on_dir_link", "", lambda h: [Chmod("/box/config", 0o777)]),
    ("tmpfs_on_link", "", lambda h: [Tmpfs("/box/config")]),
    ("dir_on_link", "", lambda h: [Dir("/box/config")]),
]


@pytest.mark.parametrize("link", ["relative", "absolute"])
@pytest.mark.parametrize("name,below,ops", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_planted_link_does_not_redirect_setup(backend: str, name: str, below: str,
                                              ops: Callable[[Host], list[sandbox.Mount]], link: str,
                                              host: Host) -> None:
    require(backend)
    bind = Bind(str(host.box), "/box")
    planted = run_sh(backend, f"ln -s '{host.link_target(link, below)}' /box/config", make_base_spec(bind))
    assert planted.returncode == 0, planted.stderr
    before = host.state()
    try:
        done = run_sh(backend, "true", make_base_spec(bind, *ops(host)))
        assert done.returncode == 0, done.stderr
    except SetupError as exc:
        assert exc.path is not None and exc.path.startswith("/box/config"), exc
    assert host.state() == before, f"{name}: the setup reached the host through the planted link"


# ---------------------------------------------------------------- the race

# Swaps the directory /box/sub and a link to the host atomically (renameat2 RENAME_EXCHANGE),
# at random moments, so each next setup may find either at any step.
SWAPPER = """
import ctypes, os, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_renameat2, AT_FDCWD, RENAME_EXCHANGE = 316, -100, 2
os.chdir("/box")
target, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
os.symlink(target, "sub.lnk")
open("/box/ready", "w").close()
while time.monotonic() < deadline:
    libc.syscall(SYS_renameat2, AT_FDCWD, b"sub", AT_FDCWD, b"sub.lnk", RENAME_EXCHANGE)
    time.sleep(random.random() / 2000)
"""


def _victim_ops(host: Host) -> list[sandbox.Mount]:
    return [File("/box/sub/evil", b"pwned\n"), Dir("/box/sub/d"), Symlink("x", "/box/sub/l"),
            Tmpfs("/box/sub/t"), Bind(str(host.other), "/box/sub/b"), Chmod("/box/sub/file", 0o777)]


# What bwrap may still do in the race (dests.py): create the mount points of the mounts below
# a bound tree (here "t" and "b") as empty directories where a link swapped in during its
# setup leads. Nothing existing is changed, nothing is written, chmod'ed or linked there, and a
# run that starts has each mount where the plan put it (MOUNTS_THERE checks it inside).
RACE_MOUNT_POINTS = {"t", "b"}
# (the swapper may have renamed the directory since: the mounts move with it)
MOUNTS_THERE = ("grep -qE ' /box/sub(\\.lnk)?/t ' /proc/self/mountinfo && "
                "grep -qE ' /box/sub(\\.lnk)?/b ' /proc/self/mountinfo")


@pytest.mark.parametrize("backend", BACKENDS)
def test_swap_race_does_not_redirect_setup(backend: str, host: Host) -> None:
    require_spawnable(backend)
    attempts = 150
    (host.box / "sub").mkdir()
    (host.box / "sub" / "file").write_text("mine\n")
    bind = Bind(str(host.box), "/box")
    before = host.state()
    outcomes: dict[str, int] = {}
    swapper = sandbox.spawn([PYTHON, "-I", "-S", "-c", SWAPPER, host.link_target("relative"), "120"],
                            make_base_spec(bind), backend=backend)
    try:
        deadline = time.monotonic() + 10
        while not (host.box / "ready").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(attempts):
            try:
                done = run_sh(backend, MOUNTS_THERE, make_base_spec(bind, *_victim_ops(host)), timeout=30)
                key = f"ran ({done.returncode})"
            except SetupError as exc:
                key = f"refused ({exc.step})"
            outcomes[key] = outcomes.get(key, 0) + 1
            _check_race_attempt(host, before, outcomes)
    finally:
        swapper.kill()
        swapper.wait()
    print(backend, outcomes)
    if backend == "bwrap":  # the native backend resolves links inside the new root: its mounts may go there
        assert not [key for key in outcomes if key.startswith("ran (") and key != "ran (0)"], outcomes
    assert sum(n for key, n in outcomes.items() if key.startswith(("ran", "refused"))) == attempts


def _check_race_attempt(host: Host, before: dict[str, tuple[int, bytes]], outcomes: dict[str, int]) -> None:
    """Nothing of the victim changed; at most empty mount-point directories appeared (then removed)."""
    after = host.state()
    changed = {k for k in before if after.get(k) != before[k]}
    assert not changed, f"the setup changed the host during a swap race: {sorted(changed)} ({outcomes})"
    for name in set(after) - set(before):
        assert name in RACE_MOUNT_POINTS and stat.S_ISDIR(after[name][0]), f"{name} made on the host ({outcomes})"
        (host.victim / name).rmdir()  # fails if anything was put in it
        outcomes["empty mount point made on the host"] = outcomes.get("empty mount point made on the host", 0) + 1
