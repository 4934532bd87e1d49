"""Mount points the native core creates below links and missing directories land where the links lead.

The core resolves each destination under the sandbox's new root
(csrc/core/mounts.c), so a link leads where it would for the command inside (a
link to "..", out of a bound directory, to the sandbox's root, never the
host's). The links are the host's, in a bound directory (a Spec refuses mounts below
links it makes). Each case is checked from inside (where the mounts, files
and directories are) and on the host. Links planted to attack the setup:
tests/adversarial/test_planted_links.py.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from conftest import make_base_spec

import sandbox
from sandbox import Bind, Dir, File, SetupError, Symlink, Tmpfs

pytestmark = pytest.mark.integration


def _run(spec: sandbox.Spec, script: str) -> sandbox.CompletedProcess:
    return sandbox.run(["sh", "-c", script], spec, backend="native", capture_output=True, text=True, timeout=60)


def test_mount_points_below_links_land_where_the_links_lead(tmp_path: Path) -> None:
    box, top = tmp_path / "box", f"made-{uuid.uuid4().hex[:8]}"
    (box / "real").mkdir(parents=True)
    (box / "rel").symlink_to("real")
    (box / "chain").symlink_to("rel")
    (box / "up").symlink_to("..")  # /box/.. inside: the sandbox's root
    spec = make_base_spec(Bind(str(box), "/box"), Tmpfs("/box/chain/a/b/m"), Dir("/box/rel/c/d"),
                          File("/box/chain/e/f", b"x\n"), Tmpfs("/box/rel/g"), Dir(f"/box/up/{top}/h"))
    done = _run(spec, "test -L /box/chain && test -L /box/rel && test -L /box/up && "
                      "grep -q ' /box/real/a/b/m ' /proc/self/mountinfo && "
                      "grep -q ' /box/real/g ' /proc/self/mountinfo && "
                      f"test -d /box/real/c/d && test \"$(cat /box/real/e/f)\" = x && test -d /{top}/h && echo ok")
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr
    assert sorted(p.name for p in box.iterdir()) == ["chain", "real", "rel", "up"]
    assert (box / "real" / "a" / "b" / "m").is_dir() and (box / "real" / "c" / "d").is_dir()
    assert not os.path.lexists(f"/{top}"), "the link to the root led to the host's root"
    assert not os.path.lexists(tmp_path / top), "the link to the root led out of the bound directory"


def test_a_dangling_link_is_not_a_mount_point() -> None:
    spec = make_base_spec(Tmpfs("/w"), Symlink("nowhere", "/w/dangling"), Tmpfs("/w/dangling"))
    with pytest.raises(SetupError) as err:
        _run(spec, "true")
    assert err.value.path == "/w/dangling", err.value
