"""Subordinate ids: the caller's /etc/subuid and /etc/subgid ranges and the
helpers that map them (newuidmap, newgidmap). Facts only, read on demand;
what a Session maps from them is decided in sandbox/session/ids.py."""

from __future__ import annotations

import grp
import os
import pwd
import shutil

ROOT_COUNT = 65535  # a root caller's Session maps inside 0..65535: its own id and this many others
MAX_SUBORDINATE = 65536  # of an unprivileged caller's range, at most this many are mapped
SUBUID, SUBGID = "/etc/subuid", "/etc/subgid"


def host_words(uid: int, gid: int) -> str:
    """probe's words for a caller of `uid`/`gid` with a Spec's defaults:
    "range N (root)", "range N (newuidmap)" or "one id (why)"."""
    if uid == 0:
        return f"range {ROOT_COUNT + 1} (root)"
    if not (helper("newuidmap") and helper("newgidmap")):
        return "one id (newuidmap and newgidmap are not installed: Debian's uidmap package)"
    sub = subordinate(uid, gid)
    if sub is None:
        return f"one id (no range for uid {uid} in both {SUBUID} and {SUBGID})"
    return f"range {min(sub[0][1], sub[1][1]) + 1} (newuidmap)"


def subordinate(uid: int, gid: int) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The caller's first /etc/subuid and /etc/subgid ranges ((start, count)
    each), if both exist and newuidmap and newgidmap are installed."""
    if not (helper("newuidmap") and helper("newgidmap")):
        return None
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    users = _first_range(SUBUID, (name, str(uid)))
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    # /etc/subgid is keyed by user, as newgidmap reads it
    groups = _first_range(SUBGID, (name, str(uid), group))
    return None if users is None or groups is None else (users, groups)


def _first_range(path: str, owners: tuple[str, ...]) -> tuple[int, int] | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[0] in owners and parts[1].isdigit() and parts[2].isdigit():
            start, count = int(parts[1]), min(int(parts[2]), MAX_SUBORDINATE)
            if count > 0:
                return start, count
    return None


def helper(name: str) -> str | None:
    """The path of newuidmap (newgidmap) if it is installed and executable."""
    found = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    return found if found and os.access(found, os.X_OK) else None
