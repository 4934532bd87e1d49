"""Audit guard: nothing can be planted where the cgroup code opens files.

The cgroup code (sandbox.cgroups) opens, by path, files of a sandbox's
cgroup directory and of its parent: limits written, `cgroup.procs`/`tasks`
opened, usage read, `cgroup.kill` written, leftovers swept by rmdir. Those
directories are writable by the caller (and so by a sandbox of its uid that
can see them), but they are cgroupfs (kernfs): it makes no symbolic link,
FIFO or regular file for anyone, root included, so no path the code opens
can be redirected or made to block. This checks that claim on this kernel,
as the caller (a sandbox has no more rights over cgroupfs than its caller).
It passed before the audit too: the audit found nothing to fix here
(SECURITY.md, "Paths opened on a caller's behalf").
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from sandbox.cgroups import CgroupLimits, SandboxCgroup, host_cgroups

pytestmark = pytest.mark.integration


def _plants(where: str) -> dict[str, Callable[[], None]]:
    return {
        "symlink": lambda: os.symlink("/etc/passwd", os.path.join(where, "sbx-symlink")),
        "fifo": lambda: os.mkfifo(os.path.join(where, "sbx-fifo")),
        "file": lambda: os.close(os.open(os.path.join(where, "sbx-file"), os.O_CREAT | os.O_WRONLY, 0o600)),
    }


def test_cgroup_directories_refuse_planted_entries() -> None:
    info = host_cgroups()
    if not info.hierarchies:
        pytest.skip(f"no cgroups for this caller: {info.reason}")
    cgroup = SandboxCgroup(info, CgroupLimits(pids=64))
    try:
        for _, path in cgroup.dirs:
            for where in (path, os.path.dirname(path)):
                for kind, plant in _plants(where).items():
                    try:
                        plant()
                    except OSError:
                        assert not os.path.lexists(os.path.join(where, f"sbx-{kind}")), (kind, where)
                        continue
                    os.unlink(os.path.join(where, f"sbx-{kind}"))
                    pytest.fail(f"a {kind} was made in {where}")
    finally:
        cgroup.close_fds()
        assert cgroup.remove(attempts=20)
