"""The host's distribution as a sandbox shows it: /usr and the top-level links into it, read from the host.

A fact of the host (a merged /usr or not), read on each call; sandbox.presets builds its worlds on it, and
the task layer (sandbox.task.facts) shows the same system in every task sandbox.
"""

from __future__ import annotations

import os

from .mounts import Mount, RoBind, Symlink

__all__ = ["TOP_LEVEL_LINKS", "system_mounts"]

TOP_LEVEL_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def system_mounts() -> tuple[Mount, ...]:
    """The distribution's programs and libraries, read-only: /usr and the top-level
    links into it (or the directories themselves on a host without a merged /usr)."""
    mounts: list[Mount] = [RoBind("/usr")]
    for name in TOP_LEVEL_LINKS:
        path = "/" + name
        if os.path.islink(path):
            mounts.append(Symlink(os.readlink(path), path))
        elif os.path.isdir(path):
            mounts.append(RoBind(path))
    return tuple(mounts)
